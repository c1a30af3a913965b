"""How ``Kube``'s requests reach the API server: aiohttp, with the kubeconfig's TLS and
credentials.

Every create, apply, patch, get and delete of the reconcilers goes through one
:class:`AiohttpTransport`. It exists for speed: aiohttp parses HTTP in C, and a server-side
apply through it cost the operator 0.27 ms of CPU where lightkube over httpx2 cost 1.31 ms
(2,000 applies of a ConfigMap, 24 in flight, against the local API server; lightkube's
model round trip and httpx2's request building alone were 1.04 ms). On two CPUs shared with
the API server the operator's CPU is the API server's loss: docs/architecture.md, "Writes go
through aiohttp".

The server, its CA and a client certificate come from lightkube's own ``verify_cluster``, so
they are read exactly as for every lightkube call; a bearer token, or a token file (a pod's
projected service account token, which the kubelet rotates), is sent as client-go sends it:
the file re-read every minute and after a 401. A kubeconfig whose user authenticates some
other way (an exec plugin, basic auth) gets :class:`HttpxTransport` over lightkube's own
client instead, which speaks every kind of credential lightkube does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Final, Protocol

import aiohttp
import httpx2
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig

from stateward.controllers.kube import Transport

TIMEOUT: Final = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10, sock_read=10)
"""Ten seconds to get a connection and ten between bytes of an answer, as lightkube's
default (``httpx.Timeout(10)``): a request that takes longer raises ``TimeoutError``, which
the queue retries as the API server being unreachable."""
TOKEN_MAX_AGE: Final = 60.0
"""Seconds a token read from a file is used before the file is read again (client-go's)."""
KEEP_ALIVE: Final = 120.0
"""Seconds an idle connection is kept: longer than a resync's interval, so a quiet operator
does not handshake TLS again on every one."""


Stream = tuple[int, AsyncIterator[bytes]]
"""A streamed answer: its status and its body's bytes as they come."""


class WatchTransport(Transport, Protocol):
    """What a watch needs of a transport: ``Kube``'s request (its LISTs) and a streamed
    answer (its WATCH)."""

    def stream(
        self, path: str, *, params: Mapping[str, str], read_timeout: float
    ) -> contextlib.AbstractAsyncContextManager[Stream]: ...


def _headers(content_type: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


class AiohttpTransport:
    """:class:`stateward.controllers.kube.Transport` over one aiohttp session, made on the
    first request (inside the running loop) and holding at most ``connections``."""

    def __init__(
        self,
        server: str,
        ssl_context: object,
        *,
        connections: int,
        token: str | None = None,
        token_file: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._connections = connections
        self._token = token
        self._token_file = token_file
        self._token_read = -TOKEN_MAX_AGE
        self._session: aiohttp.ClientSession | None = None

    def _authorization(self, *, fresh: bool = False) -> str | None:
        if self._token_file is not None and (
            fresh or time.monotonic() - self._token_read >= TOKEN_MAX_AGE
        ):
            self._token = Path(self._token_file).read_text().strip()
            self._token_read = time.monotonic()
        return f"Bearer {self._token}" if self._token else None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self._ssl,  # type: ignore[arg-type]
                limit=self._connections,
                keepalive_timeout=KEEP_ALIVE,
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=TIMEOUT)
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> tuple[int, bytes]:
        status, data = await self._send(method, path, params, body, content_type, fresh=False)
        if status == 401 and self._token_file is not None:
            # The kubelet rotated the token since it was read: read it again, once.
            status, data = await self._send(method, path, params, body, content_type, fresh=True)
        return status, data

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Mapping[str, str], read_timeout: float
    ) -> AsyncIterator[Stream]:
        """``GET path``, its body streamed; ``read_timeout`` seconds of silence end it with
        ``TimeoutError`` (a watch's stream is silent between events)."""
        timeout = aiohttp.ClientTimeout(
            total=None, connect=10, sock_connect=10, sock_read=read_timeout
        )
        try:
            async with self._open().get(
                self.server + path, params=params, headers=self._request_headers(), timeout=timeout
            ) as response:
                if response.status == 401:
                    self._token_read = -TOKEN_MAX_AGE  # read the token again next time
                yield response.status, response.content.iter_any()
        except aiohttp.ClientError as error:
            raise ConnectionError(f"GET {path}: {type(error).__name__}: {error}") from None

    def _request_headers(
        self, content_type: str | None = None, *, fresh: bool = False
    ) -> dict[str, str]:
        headers = _headers(content_type)
        authorization = self._authorization(fresh=fresh)
        if authorization is not None:
            headers["Authorization"] = authorization
        return headers

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        *,
        fresh: bool,
    ) -> tuple[int, bytes]:
        try:
            async with self._open().request(
                method,
                self.server + path,
                params=params,
                data=body,
                headers=self._request_headers(content_type, fresh=fresh),
            ) as response:
                return response.status, await response.read()
        except aiohttp.ClientError as error:
            # An OSError, so callers see what they see of any unreachable server (and
            # aiohttp's message names the address, never a credential).
            raise ConnectionError(f"{method} {path}: {type(error).__name__}: {error}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpxTransport:
    """:class:`stateward.controllers.kube.Transport` over an httpx2 client that carries its
    own base URL, TLS and credentials (lightkube's: ``runtime.operator.raw_http``)."""

    def __init__(self, http: httpx2.AsyncClient) -> None:
        self.http = http

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> tuple[int, bytes]:
        response = await self.http.request(
            method, path, params=dict(params or {}), content=body, headers=_headers(content_type)
        )
        return response.status_code, response.content

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, params: Mapping[str, str], read_timeout: float
    ) -> AsyncIterator[Stream]:
        timeout = httpx2.Timeout(10.0, read=read_timeout)
        request = self.http.build_request(
            "GET",
            path,
            params=dict(params),
            timeout=timeout,
            headers=_headers(None),
        )
        response = await self.http.send(request, stream=True)
        try:
            yield response.status_code, response.aiter_bytes()
        finally:
            await response.aclose()

    async def close(self) -> None:
        """The client is lightkube's, closed with it."""


def for_kubeconfig(
    config: KubeConfig, *, connections: int, fallback: httpx2.AsyncClient
) -> AiohttpTransport | HttpxTransport:
    """The transport for the kubeconfig's current context: aiohttp when its user is a client
    certificate or a bearer token (a pod's service account, every local kubeconfig), else
    ``fallback``, lightkube's client for the same context."""
    single = config.get()
    if single is None or single.user is None:
        raise RuntimeError("the kubeconfig names no current context with a user")
    user = single.user
    if user.exec or user.auth_provider or (user.username and user.password):
        return HttpxTransport(fallback)
    return AiohttpTransport(
        single.cluster.server,
        verify_cluster(single.cluster, user, single.abs_file),
        connections=connections,
        token=user.token,
        token_file=user.token_file,
    )
