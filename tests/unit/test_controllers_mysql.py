"""The replication plan of MySQL and MariaDB Databases: a pure function of what the servers
said, so every case is a line here."""

from __future__ import annotations

import pytest

from stateward.controllers import mysql
from stateward.controllers.mysql import Server
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit

DB = make_database("mariadb")
SOURCE0 = mysql.host_of(DB, "shop-0")


def fresh(pod: str, *, ready: bool = True) -> Server:
    """A server as it starts: reachable, read-only, replicating from nobody."""
    return Server(pod=pod, ready=ready, role=None, writable=False)


def test_a_new_database_makes_its_first_ready_server_the_primary() -> None:
    plan = mysql.plan(DB, [fresh("shop-1"), fresh("shop-0"), fresh("shop-2", ready=False)], None)
    assert plan.primary == "shop-0" and plan.promote == "shop-0"
    assert plan.follow == ("shop-1", "shop-2")
    assert plan.labels == {"shop-0": "primary"}
    assert plan.waiting is None


def test_replicas_that_replicate_from_the_primary_are_labelled_and_left_alone() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role=None, writable=False, source=SOURCE0,
               replicating=True),
        Server(pod="shop-2", ready=True, role="replica", writable=False, source=SOURCE0,
               replicating=True),
    ]  # fmt: skip
    plan = mysql.plan(DB, servers, "shop-0")
    assert plan.promote is None and plan.follow == () and plan.fence == ()
    assert plan.labels == {"shop-1": "replica"}


def test_a_converged_database_changes_nothing() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               replicating=True),
    ]  # fmt: skip
    plan = mysql.plan(DB, servers, "shop-0")
    assert (plan.promote, plan.follow, plan.fence, plan.labels) == (None, (), (), {})


def test_a_replica_whose_replication_stopped_is_pointed_again_and_loses_its_label() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               replicating=False),
    ]  # fmt: skip
    plan = mysql.plan(DB, servers, "shop-0")
    assert plan.follow == ("shop-1",)
    assert plan.labels == {"shop-1": None}


def test_a_second_writable_server_is_made_read_only() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role=None, writable=True),
    ]
    plan = mysql.plan(DB, servers, "shop-0")
    assert plan.fence == ("shop-1",) and plan.follow == ("shop-1",)


def test_a_restarted_operator_finds_the_primary_it_made_writable_but_never_labelled() -> None:
    plan = mysql.plan(DB, [Server(pod="shop-1", ready=True, role=None, writable=True),
                           fresh("shop-0")], None)  # fmt: skip
    assert plan.primary == "shop-1" and plan.promote is None
    assert plan.labels == {"shop-1": "primary"}


def test_a_primary_that_restarted_read_only_is_made_writable_again() -> None:
    plan = mysql.plan(DB, [fresh("shop-0"), fresh("shop-1")], "shop-0")
    assert plan.primary == "shop-0" and plan.promote == "shop-0"


def test_an_unreachable_primary_is_waited_for_and_never_replaced_by_a_guess() -> None:
    servers = [
        Server(pod="shop-0", ready=False, role="primary"),  # no answer over SQL
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               replicating=False),
    ]  # fmt: skip
    plan = mysql.plan(DB, servers, "shop-0")
    assert plan.primary is None and plan.promote is None
    assert plan.waiting == "the primary shop-0 is not reachable"
    assert plan.labels == {"shop-0": None}, "a dead primary keeps no primary label"


def test_nothing_ready_means_no_primary_yet() -> None:
    plan = mysql.plan(DB, [fresh("shop-0", ready=False)], None)
    assert plan.primary is None
    assert plan.waiting == "no server is ready to become the primary yet"


def test_replicas_connect_to_the_primarys_stable_name() -> None:
    assert SOURCE0 == "shop-0.shop-headless.apps.svc.cluster.local"


def test_each_engine_speaks_its_own_replication_sql() -> None:
    assert "MASTER_USE_GTID = slave_pos" in mysql.MARIADB.follow
    assert "SOURCE_AUTO_POSITION = 1" in mysql.MYSQL.follow
    assert mysql.MARIADB.follow_statements("h") == (
        "STOP SLAVE", mysql.MARIADB.follow, "START SLAVE",
    )  # fmt: skip
    assert mysql.MYSQL.follow_statements("h")[-1] == "START REPLICA"
    assert "SET GLOBAL super_read_only = OFF" in mysql.MYSQL.promote


def test_credentials_never_show_in_a_repr() -> None:
    credentials = mysql.Credentials(root_password="s3cret", replication_password="r3p")
    assert "s3cret" not in repr(credentials) and "r3p" not in repr(credentials)
