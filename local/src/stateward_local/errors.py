"""The one error the local cluster raises: its message is a single line a user can act on."""


class LocalClusterError(Exception):
    """A local-cluster failure whose message names the cause and the fix."""
