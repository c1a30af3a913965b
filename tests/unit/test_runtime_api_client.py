"""The operator's API client keeps its connections: a burst of requests after another opens
no new TLS connection (each one a handshake on both sides), and it still verifies the server
and presents the kubeconfig's client certificate, as lightkube's own client does."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import rsa
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import ConfigMap

from stateward.runtime import operator
from tests.support.certificates import certificate, leaf, pem, pem_key

BURST = 50
"""Concurrent requests per burst: more than httpx keeps idle by default (20)."""


class ApiServer:
    """An HTTPS server that answers every request with a ConfigMap, asks each client for a
    certificate signed by its CA, and counts the TLS connections it accepted."""

    def __init__(self, tmp_path: Path) -> None:
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca = certificate("Test CA", ca_key)
        server, server_key = leaf("localhost", (ca, ca_key), hosts=("localhost",))
        client, client_key = leaf("stateward-operator", (ca, ca_key), client=True)
        (tmp_path / "server.crt").write_bytes(pem(server))
        (tmp_path / "server.key").write_bytes(pem_key(server_key))
        (tmp_path / "ca.crt").write_bytes(pem(ca))
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
        self.context.load_verify_locations(tmp_path / "ca.crt")
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.ca, self.client, self.client_key = pem(ca), pem(client), pem_key(client_key)
        self.connections = 0
        self.clients: set[str] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = writer.get_extra_info("peercert") or {}
        self.clients.update(
            v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"
        )
        body = json.dumps(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "n"}}
        ).encode()
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def kubeconfig(self, port: int) -> KubeConfig:
        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        return KubeConfig.from_dict(
            {
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": f"https://localhost:{port}",
                            "certificate-authority-data": b64(self.ca),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "operator",
                        "user": {
                            "client-certificate-data": b64(self.client),
                            "client-key-data": b64(self.client_key),
                        },
                    }
                ],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "operator"}}],
                "current-context": "test",
            }
        )


async def new_connections_in_a_second_burst(client: AsyncClient, server: ApiServer) -> int:
    async def burst() -> None:
        found = await asyncio.gather(
            *(client.get(ConfigMap, "c", namespace="n") for _ in range(BURST))
        )
        assert all(f.metadata is not None and f.metadata.name == "c" for f in found)

    await burst()
    before = server.connections
    await burst()
    return server.connections - before


def test_a_second_burst_of_requests_reuses_every_connection(tmp_path: Path) -> None:
    server = ApiServer(tmp_path)

    async def main() -> tuple[int, int]:
        listening = await asyncio.start_server(server.serve, "localhost", 0, ssl=server.context)
        port = listening.sockets[0].getsockname()[1]
        config = server.kubeconfig(port)
        async with listening:
            ours = operator.api_client(config)
            lightkubes = AsyncClient(config)
            try:
                return (
                    await new_connections_in_a_second_burst(ours, server),
                    await new_connections_in_a_second_burst(lightkubes, server),
                )
            finally:
                await ours.close()
                await lightkubes.close()

    ours, lightkubes = asyncio.run(main())
    assert ours == 0, f"the operator's client opened {ours} connections again"
    # What it replaces: httpx keeps 20 idle and opens the rest again, a handshake each.
    assert lightkubes >= BURST - 20
    assert server.clients == {"stateward-operator"}, "the client certificate was presented"


def test_the_watches_read_through_the_same_client_its_server_and_its_certificate(
    tmp_path: Path,
) -> None:
    server = ApiServer(tmp_path)

    async def main() -> str:
        listening = await asyncio.start_server(server.serve, "localhost", 0, ssl=server.context)
        config = server.kubeconfig(listening.sockets[0].getsockname()[1])
        async with listening:
            client = operator.api_client(config, watches=operator.watch_count(operator.Options()))
            try:
                response = await operator.raw_http(client).get("/api/v1/namespaces/n/configmaps/c")
                return str(response.json()["metadata"]["name"])
            finally:
                await client.close()

    assert asyncio.run(main()) == "c"
    assert server.clients == {"stateward-operator"}, "the client certificate was presented"


def test_a_term_watches_every_kind_once_in_each_watched_namespace() -> None:
    kinds = len(operator.PRIMARY_RESOURCES) + len(operator.CHILD_RESOURCES)
    assert operator.watch_count(operator.Options()) == kinds
    assert operator.watch_count(operator.Options(watch_namespaces=("a", "b"))) == 2 * kinds
