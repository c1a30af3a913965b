"""Wake Patroni's HA loop the moment one of the primary's WAL senders ends.

Under ``Priority`` synchronous replication every commit waits for the one standby Patroni
names in ``synchronous_standby_names``. When that standby's node is lost, the walsender
serving it ends about a second later (``tcp_user_timeout``, see ``patroni.postgres_wrapper``),
but only Patroni names another standby, in its HA loop, which runs every ``loop_wait``
(2 s): commits waited up to two seconds more for a loop that had nothing else to wait for.

Each instance's supervisor therefore looks at the container's processes every
:data:`CHECK_INTERVAL`: PostgreSQL titles each WAL sender ``postgres: ... walsender ...``.
When one that was there is gone, it asks Patroni to run its loop now, through the one
request of the REST API that does nothing but that when it changes nothing:
``PATCH /config`` with a key that is not there, set to null (Patroni's ``patch_config``
removes null keys, finds nothing changed, writes nothing, and wakes the loop all the same).
The request is authenticated like every changing request (HTTP basic,
``patroni.RESTAPI_USERNAME``) and goes to 127.0.0.1 over TLS, verified against the cluster's
CA (the certificate names the pod, not the loopback address, so the name is not checked).

A walsender also ends when a replica restarts or a base backup finishes: the loop then runs
once more than it would have, which costs one read of pg_stat_replication. On a replica
there are no walsenders, and nothing happens.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Final

CHECK_INTERVAL: Final = 0.1
"""Seconds between two looks at the processes: about 20 small reads of /proc, a fraction of
a millisecond, and a tenth of a second is small next to the second the walsender took."""
WAKE_KEY: Final = "stateward_wakeup"
"""Never in Patroni's configuration: removing it changes nothing."""
WAKE_BODY: Final = json.dumps({WAKE_KEY: None}).encode()
TIMEOUT: Final = 2.0


def walsenders(proc: Path = Path("/proc")) -> frozenset[int]:
    """The process ids of the WAL senders among this container's processes, by the title
    PostgreSQL gives them (``postgres: CLUSTER: walsender USER ADDRESS STATE``)."""
    found = set()
    try:
        entries = list(os.scandir(proc))
    except OSError:
        return frozenset()
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "cmdline"), "rb") as source:
                title = source.read(256)
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if title.startswith(b"postgres: ") and b" walsender " in title:
            found.add(int(entry.name))
    return frozenset(found)


def wake_request(port: int, username: str, password: str) -> urllib.request.Request:
    """The no-op ``PATCH /config`` that wakes Patroni's HA loop (see the module docstring)."""
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return urllib.request.Request(
        f"https://127.0.0.1:{port}/config",
        data=WAKE_BODY,
        method="PATCH",
        headers={"Authorization": f"Basic {token}", "Content-Type": "application/json"},
    )


def tls_context(ca_file: str) -> ssl.SSLContext:
    """Verify Patroni's certificate against the cluster's CA; the name is the pod's, and the
    address is the loopback, so only the name check is off."""
    context = ssl.create_default_context(cafile=ca_file)
    context.check_hostname = False
    return context


class Waker:
    """Sends the wake-up request; says once in the log when Patroni does not answer it, and
    once when it answers again."""

    def __init__(
        self,
        port: int,
        credentials: tuple[str, str],
        ca_file: str,
        *,
        send: Callable[[urllib.request.Request, ssl.SSLContext], object] | None = None,
    ) -> None:
        self.port, self.credentials, self.ca_file = port, credentials, ca_file
        self.send = send or _send
        self.failing = False

    def wake(self) -> bool:
        try:
            self.send(wake_request(self.port, *self.credentials), tls_context(self.ca_file))
        except Exception as error:
            if not self.failing:
                print(
                    f"stateward-instance: could not wake Patroni: {_said(error)}", file=sys.stderr
                )
            self.failing = True
            return False
        if self.failing:
            print("stateward-instance: Patroni answers the wake-up again", file=sys.stderr)
        self.failing = False
        return True


def _said(error: Exception) -> str:
    """An error in a few words, never the request (it carries the password)."""
    if isinstance(error, urllib.error.HTTPError):
        return f"{error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return type(error).__name__


def _send(request: urllib.request.Request, context: ssl.SSLContext) -> object:
    with urllib.request.urlopen(request, context=context, timeout=TIMEOUT) as response:  # noqa: S310
        return response.status


def watch(
    wake: Callable[[], object],
    stop: threading.Event,
    *,
    find: Callable[[], frozenset[int]] = walsenders,
    interval: float = CHECK_INTERVAL,
) -> None:
    """Until ``stop``: call ``wake`` whenever a walsender seen at the last look is gone."""
    seen = find()
    while not stop.wait(interval):
        now = find()
        if seen - now:
            wake()
        seen = now


def watch_in_background(waker: Waker, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(
        target=watch, args=(waker.wake, stop), daemon=True, name="walsender-watch"
    )
    thread.start()
    return thread
