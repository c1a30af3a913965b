"""Run a command in another pod's container through the API server, as ``kubectl exec``
does, from inside a pod (its service account token).

The backup Job runs pgBackRest where the data is, in the primary's container (as Crunchy
PGO's backup Jobs do for cloud repositories): the data directory never leaves that pod and
the Job needs no volume, only ``pods/exec`` on its cluster's pods.

The protocol is the API server's ``v4.channel.k8s.io`` WebSocket subprotocol: every binary
message starts with a channel byte (1 stdout, 2 stderr, 3 the final status as a JSON
``Status``, whose ``ExitCode`` cause carries a non-zero exit code).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import ssl
import sys
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp

ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
PROTOCOL: Final = "v4.channel.k8s.io"
STDOUT, STDERR, ERROR = 1, 2, 3


class ExecError(Exception):
    """The command could not be started (no such pod, no permission, API unreachable)."""


@dataclasses.dataclass(frozen=True)
class InCluster:
    """The API server as a pod sees it."""

    server: str
    token: str = dataclasses.field(repr=False)
    ca_file: Path
    namespace: str

    @classmethod
    def load(cls, env: Mapping[str, str] = os.environ, account: Path = ACCOUNT_DIR) -> InCluster:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port or not (account / "token").is_file():
            raise ExecError(
                "not running in a pod with a service account token (KUBERNETES_SERVICE_HOST"
                f" and {account}/token): this command runs in the backup Job"
            )
        if ":" in host:
            host = f"[{host}]"
        return cls(
            server=f"https://{host}:{port}",
            token=(account / "token").read_text().strip(),
            ca_file=account / "ca.crt",
            namespace=(account / "namespace").read_text().strip(),
        )

    def get(self, path: str) -> Any:
        return asyncio.run(self._get(path))

    async def _get(self, path: str) -> Any:
        async with (
            aiohttp.ClientSession(headers=self._headers()) as session,
            session.get(self.server + path, ssl=self._ssl()) as response,
        ):
            if response.status >= 400:
                raise ExecError(f"GET {path}: {response.status} {await response.text()}")
            return await response.json()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


def exec_url(server: str, namespace: str, pod: str, container: str, command: Sequence[str]) -> str:
    query = [("container", container), ("stdout", "true"), ("stderr", "true")]
    query += [("command", part) for part in command]
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/exec"
    return server.replace("https://", "wss://", 1) + path + "?" + urllib.parse.urlencode(query)


def exit_code(status: Mapping[str, Any]) -> int:
    """The exit code from the final ``Status`` of an exec stream."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", "1"))
            except ValueError:
                return 1
    raise ExecError(f"exec failed: {status.get('message') or status}")


Sink = Callable[[bytes], None]


def _write_stdout(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


def _write_stderr(data: bytes) -> None:
    sys.stderr.buffer.write(data)
    sys.stderr.flush()


def run(
    api: InCluster,
    pod: str,
    container: str,
    command: Sequence[str],
    *,
    stdout: Sink = _write_stdout,
    stderr: Sink = _write_stderr,
) -> int:
    """Run ``command`` in ``pod``/``container`` and return its exit code; output streams to
    the sinks as it comes."""
    return asyncio.run(_run(api, pod, container, command, stdout, stderr))


def capture(api: InCluster, pod: str, container: str, command: Sequence[str]) -> tuple[int, str]:
    """Run ``command``; return its exit code and its standard output (stderr streams on)."""
    chunks: list[bytes] = []
    code = run(api, pod, container, command, stdout=chunks.append)
    return code, b"".join(chunks).decode(errors="replace")


async def _run(
    api: InCluster, pod: str, container: str, command: Sequence[str], stdout: Sink, stderr: Sink
) -> int:
    url = exec_url(api.server, api.namespace, pod, container, command)
    status: dict[str, Any] | None = None
    try:
        async with (
            aiohttp.ClientSession(headers=api._headers()) as session,
            session.ws_connect(
                url, protocols=(PROTOCOL,), ssl=api._ssl(), heartbeat=30, max_msg_size=0
            ) as socket,
        ):
            async for message in socket:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, data = message.data[0], message.data[1:]
                if channel == STDOUT:
                    stdout(data)
                elif channel == STDERR:
                    stderr(data)
                elif channel == ERROR and data:
                    status = json.loads(data)
    except aiohttp.WSServerHandshakeError as error:
        raise ExecError(f"exec in pod {pod} refused: {error.status} {error.message}") from None
    except aiohttp.ClientError as error:
        raise ExecError(f"exec in pod {pod}: {type(error).__name__}: {error}") from None
    if status is None:
        raise ExecError(f"exec in pod {pod}: the stream ended without an exit status")
    return exit_code(status)
