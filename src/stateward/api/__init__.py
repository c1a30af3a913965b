"""API types: pydantic models of every resource, the one source of the CRD schemas."""
