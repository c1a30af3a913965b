"""The operator's door to the API server: every write goes through here.

Objects are plain dicts on both sides. Two guarantees live in this one place:
* no write is sent unless the process still holds leadership (``may_write``), so a replica
  that lost its Lease cannot act on stale decisions;
* every write is counted (``on_write``), which is how metrics and tests see write traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import uuid
from collections.abc import Callable
from typing import Any, Final

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, codecs
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import CascadeType, PatchType

from stateward import rfc3339
from stateward.api import v1alpha1

logger = logging.getLogger(__name__)

FIELD_MANAGER = "stateward"

UNREACHABLE: Final = (OSError, TimeoutError, httpx2.TransportError)
"""What a request raises when the API server cannot be reached or does not answer in time
(lightkube's client is httpx2's)."""
OVERLOADED: Final = frozenset({429, 500, 502, 503, 504})
"""The API server's answers while it restarts or sheds load ("storage is (re)initializing")."""


class NotLeader(Exception):
    """Raised instead of writing when this process no longer holds the leader Lease."""


def transient(error: BaseException) -> bool:
    """An API server down, restarting or overloaded, or the leader Lease lost to such an
    outage: a failure to retry and log as a warning, not a defect to log with its traceback."""
    if isinstance(error, ApiError):
        return error.status.code in OVERLOADED
    return isinstance(error, (NotLeader, *UNREACHABLE))


Body = dict[str, Any]

PostgresClusterResource = create_namespaced_resource(
    v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.KIND, v1alpha1.PLURAL
)
"""The lightkube resource class of PostgresCluster, registered once, here."""
DatabaseResource = create_namespaced_resource(
    v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.DATABASE_KIND, v1alpha1.DATABASE_PLURAL
)
"""The lightkube resource class of Database."""


@dataclasses.dataclass(frozen=True)
class Ref:
    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, body: Body) -> Ref:
        metadata = body["metadata"]
        return cls(
            body["apiVersion"], body["kind"], metadata.get("namespace", ""), metadata["name"]
        )


def _resource(api_version: str, kind: str) -> Any:
    return resource_registry.load(api_version, kind)


def is_not_found(error: ApiError) -> bool:
    return error.status.code == 404


class PatroniError(Exception):
    """Patroni's REST API refused a request; the message is safe to show (no credentials)."""


@dataclasses.dataclass(frozen=True)
class PatroniAccess:
    """How the operator reaches one cluster's Patroni REST API: HTTPS, the server's chain
    verified against the cluster's CA (members are addressed by pod IP, which no certificate
    names, so the name is not checked), and the API's basic-auth credentials. Neither the
    password nor the CA appears in a repr."""

    username: str
    password: str = dataclasses.field(repr=False)
    ca: str = dataclasses.field(repr=False)
    """The cluster CA's certificate, PEM."""

    def httpx(self) -> httpx.BasicAuth:
        return httpx.BasicAuth(self.username, self.password)

    def tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca)
        context.check_hostname = False
        return context


class Kube:
    def __init__(
        self,
        client: AsyncClient,
        *,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[str, str], None] = lambda verb, kind: None,
        on_event: Callable[[str, str], None] = lambda reason, type: None,
        component: str = "stateward-operator",
        in_flight: int | None = None,
    ) -> None:
        self.client = client
        self.may_write = may_write
        self.on_write = on_write
        self.on_event = on_event
        self.component = component
        self._slots: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Semaphore(in_flight) if in_flight else contextlib.nullcontext()
        )
        """At most ``in_flight`` requests to the API server at once (None: unbounded): the
        rest wait here, in order, rather than in the HTTP client's connection pool, whose
        bookkeeping walks every connection it holds on each request (runtime.operator)."""
        self._events: dict[tuple[str, str, str], set[asyncio.Task[None]]] = {}
        """Events sent and not yet answered, by the object they are about."""

    def _guard(self, verb: str, kind: str) -> None:
        if not self.may_write():
            raise NotLeader(f"not the leader: refusing to {verb} {kind}")
        self.on_write(verb, kind)

    # --- Patroni's REST API ----------------------------------------------------------------

    async def patch_patroni_config(
        self, address: str, port: int, patch: Body, *, auth: PatroniAccess
    ) -> None:
        """``PATCH /config`` on one member: Patroni merges it into the cluster-wide (DCS)
        configuration, and every member applies it within one HA loop (null removes a key)."""
        self._guard("patch", "PatroniConfig")
        async with httpx.AsyncClient(timeout=10, auth=auth.httpx(), verify=auth.tls()) as http:
            response = await http.patch(f"https://{address}:{port}/config", json=patch)
        if response.status_code >= 400:
            raise PatroniError(
                f"Patroni at {address}:{port} refused PATCH /config: {response.status_code}"
                f" {response.text[:200]}"
            )

    async def post_patroni(
        self,
        address: str,
        port: int,
        path: str,
        body: Body,
        *,
        auth: PatroniAccess,
        wait: float = 30,
    ) -> tuple[int, str]:
        """``POST`` an action (``/switchover``, ``/failover``, ``/restart``) to one member.

        Returns Patroni's status code and text: a switchover answers when it is done (200),
        or that it could not start (412 with the reason, 503); a timeout raises
        :class:`PatroniError` and the caller observes the outcome instead."""
        self._guard("post", f"Patroni{path}")
        try:
            async with httpx.AsyncClient(
                timeout=wait, auth=auth.httpx(), verify=auth.tls()
            ) as http:
                response = await http.post(f"https://{address}:{port}{path}", json=body)
        except httpx.HTTPError as error:
            raise PatroniError(
                f"Patroni at {address}:{port} did not answer POST {path}: {type(error).__name__}"
            ) from None
        return response.status_code, response.text[:300]

    # --- reads ------------------------------------------------------------------------------

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Body | None:
        try:
            async with self._slots:
                found = await self.client.get(
                    _resource(api_version, kind), name, namespace=namespace
                )
        except ApiError as error:
            if is_not_found(error):
                return None
            raise
        return _to_dict(found)

    async def list_objects(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, Any]
    ) -> list[Body]:
        found = []
        async with self._slots:
            async for item in self.client.list(
                _resource(api_version, kind), namespace=namespace, labels=labels
            ):
                body = _to_dict(item)
                # List items come without their type; Ref.of() and the store need it.
                body.setdefault("apiVersion", api_version)
                body.setdefault("kind", kind)
                found.append(body)
        return found

    # --- writes -----------------------------------------------------------------------------

    async def apply(self, body: Body) -> Body:
        """Server-side apply under the one field manager, taking ownership of our fields."""
        self._guard("apply", body["kind"])
        async with self._slots:
            applied = await self.client.apply(
                codecs.from_dict(body), field_manager=FIELD_MANAGER, force=True
            )
        return _to_dict(applied)

    async def create(self, body: Body) -> Body:
        self._guard("create", body["kind"])
        async with self._slots:
            created = await self.client.create(codecs.from_dict(body), field_manager=FIELD_MANAGER)
        return _to_dict(created)

    async def delete(self, ref: Ref, *, orphan: bool = False) -> None:
        """Delete; a missing object counts as deleted."""
        self._guard("delete", ref.kind)
        try:
            async with self._slots:
                await self.client.delete(
                    _resource(ref.api_version, ref.kind),
                    ref.name,
                    namespace=ref.namespace,
                    cascade=CascadeType.ORPHAN if orphan else CascadeType.BACKGROUND,
                )
        except ApiError as error:
            if not is_not_found(error):
                raise

    async def patch(
        self,
        ref: Ref,
        patch: Body | list[Body],
        *,
        json_patch: bool = False,
        status: bool = False,
    ) -> Body:
        self._guard("patch", ref.kind + ("/status" if status else ""))
        resource = _resource(ref.api_version, ref.kind)
        if status:
            resource = resource.Status
        async with self._slots:
            patched = await self.client.patch(
                resource,
                ref.name,
                patch,
                namespace=ref.namespace,
                patch_type=PatchType.JSON if json_patch else PatchType.MERGE,
                field_manager=FIELD_MANAGER,
            )
        return _to_dict(patched)

    async def event(
        self, involved: Body, *, reason: str, message: str, warning: bool = False
    ) -> None:
        """Record a core/v1 Event on ``involved``. Messages never carry secret values.

        Best effort: an Event the API server refuses is logged and dropped. A terminating
        namespace refuses new Events (403), and a reconcile that failed on one could never
        remove its finalizer, so the namespace stayed Terminating forever.

        Sent in the background: the reconcile goes on without waiting for the round trip
        (three of them were on the path of every new cluster). :meth:`settle_events` waits
        for those sent so far about an object; a status write does, so that what a status
        reports was told in its Event first. A replica that does not lead refuses at once
        (NotLeader)."""
        if not self.may_write():
            raise NotLeader("not the leader: refusing to create Event")
        body = event_body(
            involved, reason=reason, message=message, warning=warning, component=self.component
        )
        task = asyncio.create_task(self._record(body, reason, warning=warning))
        key = _about(involved)
        pending = self._events.setdefault(key, set())
        pending.add(task)

        def done(finished: asyncio.Task[None]) -> None:
            pending.discard(finished)
            if not pending and self._events.get(key) is pending:
                del self._events[key]

        task.add_done_callback(done)

    async def _record(self, body: Body, reason: str, *, warning: bool) -> None:
        metadata = body["metadata"]
        try:
            await self.create(body)
        except Exception as error:
            if not isinstance(error, ApiError | NotLeader) and not transient(error):
                logger.exception("Event %s in %s not recorded", reason, metadata["namespace"])
                return
            # Refused, or the API server unreachable (an outage is ridden out, not a defect).
            why = error.status.message if isinstance(error, ApiError) else str(error)
            logger.info(
                "Event %s on %s/%s not recorded: %s",
                reason,
                metadata["namespace"],
                body["involvedObject"]["name"],
                why or type(error).__name__,
            )
            return
        self.on_event(reason, "Warning" if warning else "Normal")

    async def settle_events(self, involved: Body | None = None) -> None:
        """Wait until every Event sent so far about ``involved`` (about anything, when None)
        is recorded or dropped: a status write waits for its own object's, not for another
        cluster's slow one."""
        while True:
            keys = [_about(involved)] if involved is not None else list(self._events)
            pending = [task for key in keys for task in self._events.get(key, ())]
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)


def _about(involved: Body) -> tuple[str, str, str]:
    metadata = involved["metadata"]
    return (str(metadata.get("namespace")), str(involved.get("kind")), str(metadata["name"]))


def event_body(
    involved: Body, *, reason: str, message: str, warning: bool = False, component: str
) -> Body:
    """A core/v1 Event about ``involved`` (pure). Messages never carry secret values."""
    metadata = involved["metadata"]
    now = rfc3339.now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{metadata['name']}.{uuid.uuid4().hex[:12]}",
            "namespace": metadata.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": involved["apiVersion"],
            "kind": involved["kind"],
            "name": metadata["name"],
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def _to_dict(obj: Any) -> Body:
    result: Body = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
    return result
