"""PgBouncer's admin console, as the operator speaks to it: ``PAUSE`` before a switchover,
``RESUME`` once the new primary serves.

The operator speaks no SQL otherwise, and the console speaks only the simple query protocol,
so this is the few messages of PostgreSQL's wire protocol it needs (version 3.0): TLS first
(``SSLRequest``), a startup as :data:`ADMIN` in database ``pgbouncer``, authenticated by the
client certificate alone (PgBouncer's ``hba`` ``cert``: no password exists), one ``Query``,
``Terminate``. The encoding and decoding are pure functions; one connection per command,
bounded by a timeout, so a pooler that hangs cannot hold a reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Iterator
from typing import Final

from stateward.instance import pooler

ADMIN: Final = pooler.ADMIN_ROLE
CONSOLE_DATABASE: Final = "pgbouncer"
SSL_REQUEST_CODE: Final = 80877103
PROTOCOL_3_0: Final = 196608


class ConsoleError(Exception):
    """PgBouncer refused the login or the command, or did not answer in time."""


def ssl_request() -> bytes:
    return struct.pack("!ii", 8, SSL_REQUEST_CODE)


def startup(user: str, database: str) -> bytes:
    body = struct.pack("!i", PROTOCOL_3_0)
    for key, value in (("user", user), ("database", database)):
        body += key.encode() + b"\0" + value.encode() + b"\0"
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def query(text: str) -> bytes:
    body = text.encode() + b"\0"
    return b"Q" + struct.pack("!i", len(body) + 4) + body


TERMINATE: Final = b"X" + struct.pack("!i", 4)


def error_message(payload: bytes) -> str:
    """The ``M`` (message) field of an ErrorResponse, else all its fields."""
    fields = dict(_fields(payload))
    return fields.get("M") or "; ".join(fields.values()) or "an error without a message"


def _fields(payload: bytes) -> Iterator[tuple[str, str]]:
    for part in payload.split(b"\0"):
        if part:
            yield chr(part[0]), part[1:].decode(errors="replace")


async def _message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    header = await reader.readexactly(5)
    kind, length = header[:1], struct.unpack("!i", header[1:])[0]
    return kind, await reader.readexactly(length - 4)


async def _until_ready(reader: asyncio.StreamReader) -> None:
    """Read to ReadyForQuery; an ErrorResponse on the way raises :class:`ConsoleError`."""
    while True:
        kind, payload = await _message(reader)
        if kind == b"E":
            raise ConsoleError(error_message(payload))
        if kind == b"R" and struct.unpack("!i", payload[:4])[0] != 0:
            raise ConsoleError("PgBouncer asked for a password: the certificate was not enough")
        if kind == b"Z":
            return


async def _run(host: str, port: int, context: ssl.SSLContext, command: str) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(ssl_request())
        await writer.drain()
        if await reader.readexactly(1) != b"S":
            raise ConsoleError("PgBouncer refused TLS")
        await writer.start_tls(context, server_hostname=None)
        writer.write(startup(ADMIN, CONSOLE_DATABASE))
        await writer.drain()
        await _until_ready(reader)
        writer.write(query(command))
        await writer.drain()
        await _until_ready(reader)
        writer.write(TERMINATE)
        await writer.drain()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


async def console(
    host: str, port: int, context: ssl.SSLContext, command: str, *, seconds: float
) -> None:
    """Run one console ``command`` (``PAUSE``, ``RESUME``) on the PgBouncer at ``host``;
    :class:`ConsoleError` saying why when it did not complete in ``seconds``."""
    try:
        async with asyncio.timeout(seconds):
            await _run(host, port, context, command)
    except TimeoutError:
        raise ConsoleError(f"{command} did not complete within {seconds:.0f}s") from None
    except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as error:
        raise ConsoleError(f"{command}: {type(error).__name__}: {error}") from None
