"""The few messages of PostgreSQL's wire protocol the operator sends PgBouncer's console."""

from __future__ import annotations

import struct

import pytest

from stateward.controllers.postgres import pgbouncer

pytestmark = pytest.mark.unit


def test_the_ssl_request_is_the_protocols_magic_number() -> None:
    assert pgbouncer.ssl_request() == bytes.fromhex("0000000804d2162f")


def test_the_startup_names_the_console_user_and_database_in_protocol_3() -> None:
    message = pgbouncer.startup("stateward_pooler_admin", "pgbouncer")
    length, version = struct.unpack("!ii", message[:8])
    assert length == len(message) and version == 3 << 16
    assert message[8:] == b"user\0stateward_pooler_admin\0database\0pgbouncer\0\0"


def test_a_query_is_tagged_sized_and_terminated() -> None:
    assert pgbouncer.query("PAUSE") == b"Q" + struct.pack("!i", 10) + b"PAUSE\0"
    assert pgbouncer.TERMINATE == b"X\0\0\0\x04"


def test_an_error_says_its_message_field() -> None:
    payload = b"SERROR\0C08P01\0Malready suspended/paused\0\0"
    assert pgbouncer.error_message(payload) == "already suspended/paused"
    assert pgbouncer.error_message(b"SERROR\0C08P01\0\0") == "ERROR; 08P01"
    assert pgbouncer.error_message(b"\0") == "an error without a message"


def test_the_console_user_is_the_one_pgbouncer_lets_in() -> None:
    from stateward.specs.postgres import pooler

    assert pooler.HBA[0].split()[2] == pgbouncer.ADMIN
    assert f'"{pgbouncer.ADMIN}" ""' in pooler.USERS
