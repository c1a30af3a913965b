"""The local CA's certificates pass strict verification (Python 3.13's default)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from stateward_local.controlplane import pki

pytestmark = pytest.mark.unit


def test_a_strict_tls_client_accepts_a_certificate_of_the_local_ca(tmp_path: Path) -> None:
    # Python 3.13 (Debian trixie, the PostgreSQL 17 image) sets VERIFY_X509_STRICT in its
    # default context: Patroni there refused the API server's certificate for lacking an
    # Authority Key Identifier.
    authority = pki.Authority(tmp_path)
    pair = authority.issue("server", common_name="server", hosts=("127.0.0.1",), server=True)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(pair.cert, pair.key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        connection, _ = listener.accept()
        try:
            with server_context.wrap_socket(connection, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_context = ssl.create_default_context(cafile=str(authority.cert_path))
    client_context.verify_flags |= ssl.VERIFY_X509_STRICT
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client_context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() is not None
        tls.send(b"x")
    thread.join(timeout=10)
    listener.close()
