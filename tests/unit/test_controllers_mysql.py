"""The replication plan of MySQL and MariaDB Databases: a pure function of what the servers
said, so every case is a line here."""

from __future__ import annotations

import pytest

from stateward.controllers.mariadb import failover, sql
from stateward.controllers.mariadb.failover import Server
from stateward.specs.mariadb import servers as mysql_spec
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit

DB = make_database("mariadb")
SOURCE0 = failover.host_of(DB, "shop-0")


def fresh(pod: str, *, ready: bool = True) -> Server:
    """A server as it starts: reachable, read-only, replicating from nobody."""
    return Server(pod=pod, ready=ready, role=None, writable=False)


def test_a_new_database_makes_its_first_ready_server_the_primary() -> None:
    # Not ready: a server is ready only once it serves its role, which it has none of yet.
    plan = failover.plan(DB, [fresh("shop-1"), fresh("shop-0", ready=False), fresh("shop-2")], None)
    assert plan.primary == "shop-0" and plan.promote == "shop-0" and plan.failover_from is None
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
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.promote is None and plan.follow == () and plan.fence == ()
    assert plan.labels == {"shop-1": "replica"}


def test_a_converged_database_changes_nothing() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               replicating=True),
    ]  # fmt: skip
    plan = failover.plan(DB, servers, "shop-0")
    assert (plan.promote, plan.follow, plan.fence, plan.labels) == (None, (), (), {})


def test_a_replica_whose_replication_stopped_is_pointed_again_and_loses_its_label() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               replicating=False),
    ]  # fmt: skip
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.follow == ("shop-1",)
    assert plan.labels == {"shop-1": None}


def test_a_second_writable_server_is_made_read_only() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True),
        Server(pod="shop-1", ready=True, role=None, writable=True),
    ]
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.fence == ("shop-1",) and plan.follow == ("shop-1",)


def test_a_thawed_former_primary_beside_the_new_one_is_fenced_and_nothing_fails_over() -> None:
    # shop-0 froze, shop-1 was promoted and shop-2 follows it; shop-0 thaws still writable
    # and still labelled. The new primary stays as it is (no second failover to shop-2, no
    # detach that would turn its semi-synchronous waiting off), the former one is fenced.
    source1 = failover.host_of(DB, "shop-1")
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True, gtid="0-1-5001"),
        Server(pod="shop-1", ready=True, role="primary", writable=True, gtid="0-2-5400"),
        Server(pod="shop-2", ready=True, role="replica", writable=False, source=source1,
               replicating=True, gtid="0-2-5400"),
    ]  # fmt: skip
    for previous in ("shop-1", "shop-0"):  # the status may not have been written yet
        plan = failover.plan(DB, servers, previous)
        assert plan.primary == "shop-1" and plan.promote is None, previous
        assert plan.failover_from is None
        assert plan.fence == ("shop-0",)
        assert plan.labels == {"shop-0": None}


def test_two_writable_servers_with_no_replica_keep_the_more_advanced_one() -> None:
    servers = [
        Server(pod="shop-0", ready=True, role="primary", writable=True, gtid="0-1-10"),
        Server(pod="shop-1", ready=True, role="primary", writable=True, gtid="0-2-40"),
    ]
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.primary == "shop-1" and plan.promote is None and plan.fence == ("shop-0",)


def test_a_restarted_operator_finds_the_primary_it_made_writable_but_never_labelled() -> None:
    plan = failover.plan(DB, [Server(pod="shop-1", ready=True, role=None, writable=True),
                           fresh("shop-0")], None)  # fmt: skip
    assert plan.primary == "shop-1" and plan.promote is None
    assert plan.labels == {"shop-1": "primary"}


def test_a_lost_primary_is_replaced_by_the_most_advanced_server() -> None:
    servers = [
        Server(pod="shop-1", ready=False, role="replica", writable=False, source=SOURCE0,
               gtid="0-1-40", received="0-1-41"),
        Server(pod="shop-2", ready=False, role="replica", writable=False, source=SOURCE0,
               gtid="0-1-42", received="0-1-42"),
    ]  # fmt: skip
    plan = failover.plan(DB, servers, "shop-0")  # shop-0's pod is gone
    assert plan.primary == "shop-2" and plan.promote == "shop-2"
    assert plan.failover_from == "shop-0"
    assert plan.follow == ("shop-1",)
    assert plan.labels == {"shop-2": "primary", "shop-1": None}


def test_received_but_unapplied_transactions_count_when_choosing() -> None:
    servers = [
        Server(pod="shop-1", ready=True, role="replica", writable=False, gtid="0-1-40",
               received="0-1-45"),
        Server(pod="shop-2", ready=True, role="replica", writable=False, gtid="0-1-44"),
    ]  # fmt: skip
    assert failover.plan(DB, servers, "shop-0").promote == "shop-1"


def test_a_restarted_primary_is_replaced_by_an_equally_advanced_replica() -> None:
    servers = [
        Server(pod="shop-0", ready=False, role=None, writable=False, gtid="0-1-9"),
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               gtid="0-1-9", received="0-1-9"),
    ]  # fmt: skip
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.promote == "shop-1" and plan.failover_from == "shop-0"
    assert plan.follow == ("shop-0",), "the old primary follows the new one"


def test_a_restarted_primary_ahead_of_every_replica_resumes_so_no_write_is_lost() -> None:
    servers = [
        Server(pod="shop-0", ready=False, role=None, writable=False, gtid="0-1-12"),
        Server(pod="shop-1", ready=True, role="replica", writable=False, source=SOURCE0,
               gtid="0-1-9", received="0-1-10"),
    ]  # fmt: skip
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.promote == "shop-0" and plan.failover_from is None


def test_a_server_that_diverged_from_the_primary_is_recloned_not_followed() -> None:
    source1 = failover.host_of(DB, "shop-1")
    servers = [
        Server(pod="shop-1", ready=True, role="primary", writable=True, gtid="0-2-50"),
        Server(pod="shop-0", ready=False, role=None, writable=False, source=source1,
               gtid="0-1-48", replica_error=1236),
    ]  # fmt: skip
    plan = failover.plan(DB, servers, "shop-1")
    assert plan.reclone == ("shop-0",) and plan.follow == () and plan.promote is None


def test_an_unreachable_primary_with_no_other_server_answering_is_waited_for() -> None:
    servers = [
        Server(pod="shop-0", ready=False, role="primary"),  # no answer over SQL
        Server(pod="shop-1", ready=False, role="replica"),  # no answer either
    ]
    plan = failover.plan(DB, servers, "shop-0")
    assert plan.primary is None and plan.promote is None
    assert plan.waiting == "the primary shop-0 is not reachable and no other server answers"
    assert plan.labels == {"shop-0": None}, "a dead primary keeps no primary label"


def test_gtid_positions_of_both_engines() -> None:
    assert failover.positions("0-1-42,1-3-7") == {0: 42, 1: 7}
    assert failover.positions("") == {}
    assert failover.positions("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-23") == {0: 23}
    assert failover.at_least({0: 5, 1: 2}, {0: 5}) and not failover.at_least({0: 4}, {0: 5})


def test_a_switchover_target_has_caught_up_only_with_the_very_same_last_transactions() -> None:
    # A former primary that wrote 0-1-42 itself, and a new primary that wrote nothing since
    # it took over (MASTER_GTID_WAIT would wait forever here: gtid_slave_pos is empty).
    assert failover.caught_up("0-1-42", "0-1-42")
    # The new primary wrote since, the old one applied it as a replica.
    assert failover.caught_up("0-2-50", "0-2-50")
    assert failover.caught_up("1-3-7, 0-2-50", "0-2-50,1-3-7"), "order and spaces do not matter"
    assert failover.caught_up("0-1-42", ""), "a primary that never wrote"
    assert not failover.caught_up("0-1-41", "0-1-42"), "behind"
    assert not failover.caught_up("0-2-42", "0-1-42"), "another transaction with the same number"
    assert not failover.caught_up("0-1-43", "0-1-42"), "ahead: holds what the primary never had"
    assert not failover.caught_up("0-1-42", "0-1-42,1-3-7"), "a domain missing"
    assert not failover.caught_up("", "0-1-42")


def test_a_new_database_needs_a_server_that_answers() -> None:
    plan = failover.plan(DB, [Server(pod="shop-0", ready=False, role=None)], None)
    assert plan.primary is None
    assert plan.waiting == "no server answers yet"


def test_replicas_connect_to_the_primarys_stable_name() -> None:
    assert SOURCE0 == "shop-0.shop-headless.apps.svc.cluster.local"


def test_each_engine_speaks_its_own_replication_sql() -> None:
    assert "MASTER_USE_GTID = current_pos" in sql.MARIADB.follow
    assert "SOURCE_AUTO_POSITION = 1" in sql.MYSQL.follow
    assert sql.MARIADB.follow_statements("h") == (
        "STOP SLAVE", sql.MARIADB.follow, "START SLAVE",
    )  # fmt: skip
    assert sql.MYSQL.follow_statements("h")[-1] == "START REPLICA"
    assert "SET GLOBAL super_read_only = OFF" in sql.MYSQL.open_writes
    assert sql.MARIADB.open_writes == ("SET GLOBAL read_only = OFF",)
    assert "SET GLOBAL rpl_semi_sync_master_enabled = OFF" in sql.MARIADB.fence
    # Fencing never waits behind a commit that waits for an acknowledgement: those sessions
    # go first, read_only gives up after 5 s, and semi-sync goes off only at the end.
    fence = sql.MARIADB.fence
    assert fence[0] == "KILL CONNECTION USER 'app'"
    assert fence.index("SET SESSION lock_wait_timeout = 5") < fence.index(
        "SET GLOBAL read_only = ON"
    )
    assert fence[-1] == "SET GLOBAL rpl_semi_sync_master_enabled = OFF"


def test_mariadb_semi_sync_never_falls_back_to_asynchronous() -> None:
    # A timeout would let a primary whose replicas are gone acknowledge writes no replica
    # has; a failover then loses them. The wait is effectively forever, after the commit is
    # in the binary log (AFTER_SYNC), set at every promotion and in the configuration.
    on = sql.MARIADB.semi_sync[True]
    assert "SET GLOBAL rpl_semi_sync_master_timeout = 4294967295" in on
    assert "SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC" in on
    assert on[-1] == "SET GLOBAL rpl_semi_sync_master_enabled = ON"
    assert sql.MARIADB.semi_sync[False] == ("SET GLOBAL rpl_semi_sync_master_enabled = OFF",)
    config = mysql_spec.MARIADB_CONFIG
    assert "rpl-semi-sync-master-timeout = 4294967295" in config
    assert "rpl-semi-sync-master-wait-point = AFTER_SYNC" in config
    assert mysql_spec.SEMI_SYNC_TIMEOUT_MS / 1000 / 86400 > 49  # days


def test_credentials_never_show_in_a_repr() -> None:
    credentials = sql.Credentials(root_password="s3cret", replication_password="r3p")
    assert "s3cret" not in repr(credentials) and "r3p" not in repr(credentials)
