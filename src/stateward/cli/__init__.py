"""The ``stateward`` command line."""
