"""What runs inside the database pods: the Patroni configuration, backup and restore commands.

A leaf layer: it reads the API models and nothing above them, so the operator (through
``stateward.specs``) and the instance processes agree on one rendering.
"""
