"""Stateward: a Kubernetes operator for stateful databases and their Day-2 operations."""

__version__ = "0.1.0"
