"""List, then watch, one kind of object, for as long as a term as leader lasts.

The operator's own informer, in the shape of client-go's reflector: a LIST (paged) fills the
store and says when it is complete; a WATCH from the list's resourceVersion delivers every
change after it; bookmarks keep that version fresh while nothing changes, so a restarted watch
resumes where it stopped; a version the server no longer has (410 Gone) is answered by a new
LIST, and an object the store holds that the new LIST lacks was deleted meanwhile: its
deletion is delivered too. Failures are retried with a capped backoff, forever: the term
ends a watch, not an error.

Each event costs one ``json.loads`` of its line and one call of the handler: no per-event
task, body wrapper or logger. Measured against Kopf's watching, which this replaced, see
docs/architecture.md ("Our own watches").
"""

from __future__ import annotations

import asyncio
import http
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Final, NamedTuple

import httpx2

from stateward.runtime.transport import WatchTransport

logger = logging.getLogger("stateward.watch")

Body = dict[str, Any]
Handler = Callable[[str, Body], None]
"""Called with ``ADDED``, ``MODIFIED`` or ``DELETED`` and the object's body."""

WATCH_SECONDS: Final = 60
"""How long the server keeps one watch request open (``timeoutSeconds``) before the watch is
made again from the last version seen: a stream is never older than this."""
INACTIVITY_SECONDS: Final = 75.0
"""A stream silent for longer than the server promised to keep it is dead, however healthy its
socket looks (a half-open TCP connection after a network fault): it is replaced."""
PAGE: Final = 500
"""Objects per LIST page: a thousand clusters' pods arrive in a few pages, none huge."""
BACKOFF_FIRST: Final = 0.5
BACKOFF_MAX: Final = 8.0
"""Seconds between attempts after a failure, doubling from the first to the cap (with jitter,
so a hundred watches that failed together do not come back in step)."""
YIELD_EVERY: Final = 200
"""Objects of a LIST delivered between two yields to the event loop: a list of thousands must
not hold up the Lease renewal."""


class Resource(NamedTuple):
    """A kind the API serves, by ``(group, version, plural, kind)``; the core group is ``""``."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        scope = f"/namespaces/{namespace}" if namespace else ""
        return f"{prefix}{scope}/{self.plural}"


class Gone(Exception):
    """The resourceVersion (or a LIST's continue token) is older than the server keeps."""


class WatchFailed(Exception):
    """A request of the watch failed; the message says which and how (never a body)."""


class Watch:
    """One kind, in one namespace or all (``namespace=None``), optionally narrowed by a label
    selector. :meth:`run` until cancelled; ``synced`` is set once the first LIST has been
    delivered in full. ``known`` returns the bodies the handler's store holds of this kind
    in this scope: after a relist, those the LIST lacks are delivered as deleted."""

    def __init__(
        self,
        transport: WatchTransport,
        resource: Resource,
        handler: Handler,
        *,
        namespace: str | None = None,
        selector: str | None = None,
        known: Callable[[], Iterable[Body]] = tuple,
        page: int = PAGE,
        backoff_first: float = BACKOFF_FIRST,
        backoff_max: float = BACKOFF_MAX,
    ) -> None:
        self.transport = transport
        self.resource = resource
        self.handler = handler
        self.namespace = namespace
        self.selector = selector
        self.known = known
        self.page = page
        self.backoff_first = backoff_first
        self.backoff_max = backoff_max
        self.synced = asyncio.Event()
        self.version: str | None = None
        """The last resourceVersion seen: a LIST's, an event's or a bookmark's."""
        self.lists = 0
        self.watches = 0

    @property
    def name(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.resource.plural}{where}"

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                if self.version is None:
                    await self._list()
                    self.synced.set()
                started = time.monotonic()
                if not await self._watch() and time.monotonic() - started < 1.0:
                    raise WatchFailed(f"the server ended the watch of {self.name} at once")
                if failures:
                    logger.info("watching %s again", self.name)
                failures = 0
            except Gone:
                logger.info("the watch of %s is too old for the server; listing again", self.name)
                self.version = None
            except (WatchFailed, httpx2.HTTPError, OSError, ValueError) as error:
                failures += 1
                what = "could not list the watched objects yet" if self.version is None else (
                    "the watch failed"
                )  # fmt: skip
                # One warning per outage, not one per attempt.
                log = logger.warning if failures == 1 else logger.debug
                log("%s: %s: %s; retrying", what, self.name, _describe(error))
                delay = min(self.backoff_max, self.backoff_first * 2 ** (failures - 1))
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))  # jitter, not a secret

    # --- LIST -------------------------------------------------------------------------------

    async def _list(self) -> None:
        self.lists += 1
        listed: set[tuple[str, str]] = set()
        token: str | None = None
        version = ""
        delivered = 0
        while True:
            params = {"limit": str(self.page)}
            if self.selector:
                params["labelSelector"] = self.selector
            if token:
                params["continue"] = token
            status, answer = await self.transport.request(
                "GET", self.resource.path(self.namespace), params=params
            )
            _raise_for(status, answer, "list", self.name)
            page = json.loads(answer)
            metadata = page.get("metadata") or {}
            version = metadata.get("resourceVersion") or version
            for item in page.get("items") or ():
                # List items come without their type; the store and the handlers need it.
                item["kind"] = self.resource.kind
                item["apiVersion"] = self.resource.api_version
                item_metadata = item["metadata"]
                listed.add((item_metadata.get("namespace", ""), item_metadata["name"]))
                self._deliver("ADDED", item)
                delivered += 1
                if delivered % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            token = metadata.get("continue")
            if not token:
                break
        self._deliver_vanished(listed, version)
        self.version = version

    def _deliver_vanished(self, listed: set[tuple[str, str]], version: str) -> None:
        """What the store holds that the LIST lacks was deleted while no watch ran. An object
        newer than the LIST (a write's response seen after the LIST's snapshot) is not."""
        for body in list(self.known()):
            metadata = body["metadata"]
            if (metadata.get("namespace", ""), metadata["name"]) in listed:
                continue
            if self.namespace and metadata.get("namespace") != self.namespace:
                continue
            if _newer(metadata.get("resourceVersion"), version):
                continue
            self._deliver("DELETED", body)

    # --- WATCH ------------------------------------------------------------------------------

    async def _watch(self) -> int:
        """One watch request, until the server ends it (returns how many events came) or it
        fails (raises)."""
        self.watches += 1
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        if self.version:
            params["resourceVersion"] = self.version
        if self.selector:
            params["labelSelector"] = self.selector
        async with self.transport.stream(
            self.resource.path(self.namespace), params=params, read_timeout=INACTIVITY_SECONDS
        ) as (status, chunks):
            if status != 200:
                _raise_for(status, b"".join([chunk async for chunk in chunks]), "watch", self.name)
            events = 0
            async for line in _lines(chunks):
                self._event(json.loads(line))
                events += 1
            return events

    def _event(self, event: Body) -> None:
        kind = event.get("type")
        body = event.get("object") or {}
        if kind == "ERROR":
            if body.get("code") == 410:
                raise Gone
            raise WatchFailed(f"the server ended the watch of {self.name}: {_status(body)}")
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version:
            self.version = version
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            body.setdefault("kind", self.resource.kind)
            body.setdefault("apiVersion", self.resource.api_version)
            self._deliver(kind, body)

    def _deliver(self, kind: str, body: Body) -> None:
        try:
            self.handler(kind, body)
        except Exception:  # a defect in a handler must not end the watch of its whole kind
            metadata = body.get("metadata") or {}
            logger.exception(
                "handling %s %s/%s failed",
                self.resource.kind, metadata.get("namespace", ""), metadata.get("name"),
            )  # fmt: skip


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The newline-delimited JSON documents of a watch stream, as bytes (``json.loads``
    takes bytes: no text decoding of its own)."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        if b"\n" not in pending:
            continue
        *complete, pending = pending.split(b"\n")
        for line in complete:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _raise_for(code: int, answer: bytes, verb: str, name: str) -> None:
    if code == 200:
        return
    try:
        status = json.loads(answer)
    except ValueError:
        status = {}
    if code == 410:
        raise Gone
    detail = _status(status) if isinstance(status, dict) and status else _phrase(code)
    raise WatchFailed(f"{verb} of {name}: {code} {detail}")


def _phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return "no reason"


def _status(status: Body) -> str:
    """A Status object in a few words: its reason and message (which name the object and the
    user, never a body)."""
    reason = status.get("reason") or ""
    message = status.get("message") or ""
    return f"{reason}: {message}" if reason and message else reason or message or "no reason"


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _newer(version: object, than: str) -> bool:
    """True when resourceVersion ``version`` is known to be newer than ``than``. Versions are
    opaque to clients by contract; the API server's are etcd revisions, integers, and only
    those are compared: anything else is not known to be newer."""
    if not isinstance(version, str) or not version.isdigit() or not than.isdigit():
        return False
    return int(version) > int(than)
