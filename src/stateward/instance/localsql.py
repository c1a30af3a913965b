"""One statement through the image's ``psql`` on the pod's own socket: what the metrics and
the custom queries ask PostgreSQL, without a driver in the instance's PID 1."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any, Final

SOCKET_DIR: Final = "/var/run/postgresql"
IDENTIFIER_PATTERN: Final = "^[a-z_][a-z0-9_]*$"
"""A name SQL takes unquoted and PostgreSQL keeps as written: what the application's database
and owner must be (the API accepts nothing else), so the statements that make them need no
quoting."""
APPLICATION_NAME: Final = "stateward-metrics"


def answer(
    psql: str,
    statement: str,
    *,
    user: str,
    timeout: float,
    statement_timeout_ms: int | None = None,
    run: Callable[..., Any] | None = None,
) -> str | None:
    """What ``statement`` printed (unaligned, tuples only), asked as ``user`` in database
    postgres; None on any failure: no answer in ``timeout`` seconds, an error, no psql."""
    environment = {**os.environ, "PGCONNECT_TIMEOUT": "3", "PGAPPNAME": APPLICATION_NAME}
    if statement_timeout_ms is not None:
        environment["PGOPTIONS"] = f"-c statement_timeout={statement_timeout_ms}"
    try:
        done = (run or subprocess.run)(
            [psql, "-h", SOCKET_DIR, "-U", user, "-d", "postgres",
             "-XtAq", "-v", "ON_ERROR_STOP=1", "-c", statement],
            capture_output=True, text=True, timeout=timeout, check=False, env=environment,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return str(done.stdout) if done.returncode == 0 else None


def json_answer(psql: str, statement: str, **options: Any) -> Any:
    """:func:`answer` of a statement that returns one JSON value, parsed; None on failure."""
    text = answer(psql, statement, **options)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
