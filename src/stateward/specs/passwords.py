"""The passwords the operator generates, for every engine: the only non-deterministic function
of ``stateward.specs`` (every builder takes its password as an argument)."""

from __future__ import annotations

import secrets


def generate_password() -> str:
    """A fresh random password: 32 random bytes, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)
