"""The operator's door to the API server: every write goes through here.

Objects are plain dicts on both sides, sent and read as JSON over a :class:`Transport`
(``runtime.transport``: aiohttp in the operator) with no model objects between: an apply
through lightkube's models and httpx2 cost the operator 1.31 ms of CPU, through this 0.27 ms
(``runtime.transport``). Refusals are
lightkube's :class:`ApiError`, which every caller knows. Two guarantees live in this one
place:
* no write is sent unless the process still holds leadership (``may_write``), so a replica
  that lost its Lease cannot act on stale decisions;
* every write is counted (``on_write``), which is how metrics and tests see write traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import ssl
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import httpx
import httpx2
from lightkube import ApiError
from lightkube.core.resource_registry import resource_registry
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import Status

from stateward import rfc3339
from stateward.api import v1alpha1

logger = logging.getLogger(__name__)

FIELD_MANAGER = "stateward"

UNREACHABLE: Final = (OSError, TimeoutError, httpx2.TransportError)
"""What a request raises when the API server cannot be reached or does not answer in time
(a :class:`Transport` raises an OSError; lightkube's client is httpx2's)."""
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


@functools.cache
def _collection(api_version: str, kind: str) -> tuple[str, str]:
    """The URL prefix of a kind's API group version, and its plural (lightkube's registry
    knows every built-in kind and the two of ours registered above)."""
    info = resource_registry.load(api_version, kind)._api_info
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return prefix, info.plural


def path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    """The URL path of one object, or of its kind's collection in ``namespace`` (a
    cluster-scoped kind: no namespace)."""
    prefix, plural = _collection(api_version, kind)
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{scope}/{plural}" + (f"/{name}" if name else "")


JSON: Final = "application/json"
APPLY: Final = "application/apply-patch+yaml"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
WRITE_PARAMS: Final = {"fieldManager": FIELD_MANAGER}
APPLY_PARAMS: Final = {"fieldManager": FIELD_MANAGER, "force": "true"}


def refusal(status: int, answer: bytes) -> ApiError:
    """The API server's refusal as lightkube's :class:`ApiError`, which every caller knows:
    its Status when the answer is one, else the code and the start of the answer."""
    try:
        decoded = json.loads(answer)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and decoded.get("kind") == "Status":
        found = Status(
            code=decoded.get("code") or status,
            message=decoded.get("message"),
            reason=decoded.get("reason"),
            status=decoded.get("status"),
        )
    else:
        text = answer[:200].decode(errors="replace")
        found = Status(code=status, message=f"HTTP {status}: {text}", status="Failure")
    return ApiError(status=found)


class Transport(Protocol):
    """How a request reaches the API server (``runtime.transport``): the path is the URL's,
    below the server; the answer is its status and body. An unreachable or silent server
    raises an OSError or TimeoutError (:data:`UNREACHABLE`)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> tuple[int, bytes]: ...


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
        transport: Transport,
        *,
        may_write: Callable[[], bool] = lambda: True,
        on_write: Callable[[str, str], None] = lambda verb, kind: None,
        on_event: Callable[[str, str], None] = lambda reason, type: None,
        component: str = "stateward-operator",
        in_flight: int | None = None,
    ) -> None:
        self.transport = transport
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
            return await self._call("GET", path(api_version, kind, namespace, name))
        except ApiError as error:
            if is_not_found(error):
                return None
            raise

    async def list_objects(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, str]
    ) -> list[Body]:
        selector = ",".join(f"{key}={value}" for key, value in labels.items())
        found = await self._call(
            "GET",
            path(api_version, kind, namespace),
            params={"labelSelector": selector} if selector else None,
        )
        items: list[Body] = found.get("items") or []
        for body in items:
            # List items come without their type; Ref.of() and the store need it.
            body.setdefault("apiVersion", api_version)
            body.setdefault("kind", kind)
        return items

    # --- writes -----------------------------------------------------------------------------

    async def apply(self, body: Body) -> Body:
        """Server-side apply under the one field manager, taking ownership of our fields."""
        self._guard("apply", body["kind"])
        metadata = body["metadata"]
        return await self._call(
            "PATCH",
            path(body["apiVersion"], body["kind"], metadata.get("namespace"), metadata["name"]),
            params=APPLY_PARAMS,
            body=body,
            content_type=APPLY,
        )

    async def create(self, body: Body) -> Body:
        self._guard("create", body["kind"])
        return await self._call(
            "POST",
            path(body["apiVersion"], body["kind"], body["metadata"].get("namespace")),
            params=WRITE_PARAMS,
            body=body,
            content_type=JSON,
        )

    async def delete(self, ref: Ref, *, orphan: bool = False) -> None:
        """Delete; a missing object counts as deleted."""
        self._guard("delete", ref.kind)
        try:
            await self._call(
                "DELETE",
                path(ref.api_version, ref.kind, ref.namespace, ref.name),
                params={"propagationPolicy": "Orphan" if orphan else "Background"},
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
        return await self._call(
            "PATCH",
            path(ref.api_version, ref.kind, ref.namespace, ref.name)
            + ("/status" if status else ""),
            params=WRITE_PARAMS,
            body=patch,
            content_type=JSON_PATCH if json_patch else MERGE_PATCH,
        )

    async def _call(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, str] | None = None,
        body: Body | list[Body] | None = None,
        content_type: str | None = None,
    ) -> Body:
        """One request, at most ``in_flight`` at once; the answer decoded, or the API
        server's refusal raised as :class:`ApiError` (its Status: code, reason, message)."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        async with self._slots:
            status, answer = await self.transport.request(
                method, url, params=params, body=data, content_type=content_type
            )
        if status >= 400:
            raise refusal(status, answer)
        decoded: Body = json.loads(answer)
        return decoded

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
