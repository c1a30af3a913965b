"""Reconcilers: ordered phases over one object, driven from observed state."""
