"""``kubectl stateward``: the pure parts (the report, choosing a pod, the flags)."""

from __future__ import annotations

import datetime

import pytest

from stateward.cli import plugin

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 12, 2, 12, 0, 0, tzinfo=datetime.UTC)


def cluster() -> dict[str, object]:
    return {
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {"version": "15", "replicas": 3, "backupSchedule": "0 3 * * *"},
        "status": {
            "phase": "Ready",
            "readyReplicas": 3,
            "primaryPod": "orders-1",
            "replicaPods": ["orders-0", "orders-2"],
            "instances": [
                {"name": "orders-0", "role": "sync_standby", "state": "streaming", "timeline": 2,
                 "lagBytes": 0},
                {"name": "orders-1", "role": "primary", "state": "running", "timeline": 2},
                {"name": "orders-2", "role": "replica", "state": "streaming", "timeline": 2,
                 "lagBytes": 4096},
            ],
            "switchover": {"phase": "Succeeded", "reason": "Requested", "fromPod": "orders-0",
                           "target": "orders-1", "startedAt": "2026-12-02T11:58:00Z",
                           "message": "orders-1 is the primary"},
            "lastFailover": {"fromPod": "orders-2", "toPod": "orders-0",
                             "detectedAt": "2026-12-01T12:00:00Z"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllInstancesReady",
                            "message": "3/3 ready, primary orders-1"}],
        },
    }  # fmt: skip


def test_the_report_tells_the_story_at_a_glance() -> None:
    events = [
        {"lastTimestamp": "2026-12-02T11:58:03Z", "type": "Normal", "reason": "SwitchedOver",
         "message": "Switched over from orders-0 to orders-1"},
    ]  # fmt: skip
    text = "\n".join(plugin.report(cluster(), events, now=NOW))
    assert text.startswith("PostgresCluster shop/orders: Ready")
    assert "3/3 instances ready, primary orders-1, synchronous replication Preferred" in text
    assert "orders-2  replica       streaming  2         4096 B" in text
    placed = "  placed Required: one per kubernetes.io/hostname; metrics on port 9187 of each"
    assert placed in text
    tls = "  TLS 1.3 only: serving a certificate of the cluster's CA (Secret orders-ca);"
    assert tls + " client certificates of the cluster's CA (Secret orders-ca)" in text
    assert "Switchover: Succeeded (Requested) from orders-0 to orders-1, 2m ago" in text
    assert "Last failover: orders-2 -> orders-0, 1d ago" in text
    assert "Backups: schedule 0 3 * * *, last -" in text
    assert "AllInstancesReady" in text and "SwitchedOver" in text


@pytest.mark.parametrize(
    ("synchronous", "shown"),
    [
        ({"method": "Quorum", "number": 2}, "synchronous replication Preferred, quorum of any 2"),
        (
            {"mode": "Required", "method": "Quorum"},
            "synchronous replication Required, quorum of any 1",
        ),
        ({"mode": "Off", "method": "Quorum"}, "synchronous replication Off\n"),
        ({"method": "Priority"}, "synchronous replication Preferred\n"),
    ],
)
def test_the_report_says_how_commits_wait(synchronous: dict[str, object], shown: str) -> None:
    obj = cluster()
    obj["spec"] = {**obj["spec"], "synchronous": synchronous}  # type: ignore[dict-item]
    assert shown in "\n".join(plugin.report(obj, [], now=NOW)) + "\n"


def test_a_new_cluster_reports_without_instances() -> None:
    text = plugin.report(
        {"metadata": {"name": "x"}, "spec": {"replicas": 1}, "status": {}}, [], now=NOW
    )
    assert text[0] == "PostgresCluster default/x: Pending"
    assert "  none reported yet" in text


def test_psql_goes_to_the_primary_or_a_replica_and_says_when_there_is_none() -> None:
    status = cluster()["status"]
    assert isinstance(status, dict)
    assert plugin.choose_pod(status, replica=False) == "orders-1"
    assert plugin.choose_pod(status, replica=True) == "orders-0"
    with pytest.raises(plugin.PluginError, match="no primary"):
        plugin.choose_pod({}, replica=False)
    with pytest.raises(plugin.PluginError, match="no replica"):
        plugin.choose_pod({"primaryPod": "a-0"}, replica=True)


def test_the_flags() -> None:
    args = plugin.parser().parse_args(["-n", "shop", "switchover", "orders", "--to", "orders-2"])
    assert (args.namespace, args.command, args.name, args.to, args.wait) == (
        "shop",
        "switchover",
        "orders",
        "orders-2",
        True,
    )
    args = plugin.parse(["psql", "orders", "--replica", "--", "-c", "select 1", "--echo-all"])
    assert args.replica and args.psql_args == ["-c", "select 1", "--echo-all"]


def test_fencing_adds_and_unfencing_removes_one_pod_or_all() -> None:
    from stateward.cli.plugin import PluginError, fenced_after

    assert fenced_after([], "pg-1", fence=True) == ["pg-1"]
    assert fenced_after(["pg-1"], "pg-0", fence=True) == ["pg-0", "pg-1"]
    assert fenced_after(["pg-0", "pg-1"], "pg-0", fence=False) == ["pg-1"]
    assert fenced_after(["pg-1"], "*", fence=True) == ["*", "pg-1"]
    assert fenced_after(["*", "pg-1"], "*", fence=False) == []
    with pytest.raises(PluginError, match="unfence '\\*' first"):
        fenced_after(["*"], "pg-1", fence=False)


def test_backup_waits_by_default_with_a_generous_timeout() -> None:
    args = plugin.parse(["backup", "orders"])
    assert args.command == "backup" and args.name == "orders"
    assert args.wait is True and args.timeout == 600
    assert plugin.parse(["backup", "orders", "--no-wait"]).wait is False


def test_the_report_names_the_users_ca_and_serving_certificate() -> None:
    body = cluster()
    body["spec"]["tls"] = {"caSecretName": "corp-ca", "serverSecretName": "web"}  # type: ignore[index]
    text = "\n".join(plugin.report(body, [], now=NOW))
    assert (
        "  TLS 1.3 only: serving your certificate (Secret web); client certificates of your CA"
        " (Secret corp-ca)"
    ) in text


def test_the_report_shows_where_the_pooler_answers_and_how_many_pods_serve() -> None:
    body = cluster()
    assert "Pooler" not in "\n".join(plugin.report(body, [], now=NOW))
    body["spec"]["pooler"] = {"instances": 3, "poolMode": "session"}  # type: ignore[index]
    text = "\n".join(plugin.report(body, [], now=NOW))
    assert "  Pooler: PgBouncer at orders-pooler.shop.svc:5432, 0/3 ready, session pooling" in text
    body["spec"]["pooler"] = {}  # type: ignore[index]
    body["status"]["pooler"] = {"host": "orders-pooler.shop.svc", "instances": 2,  # type: ignore[index]
                                "readyInstances": 2, "poolMode": "transaction"}  # fmt: skip
    text = "\n".join(plugin.report(body, [], now=NOW))
    assert (
        "  Pooler: PgBouncer at orders-pooler.shop.svc:5432, 2/2 ready, transaction pooling" in text
    )


def test_the_report_follows_an_upgrade_and_names_the_datas_version() -> None:
    body = cluster()
    assert "Upgrade" not in "\n".join(plugin.report(body, [], now=NOW))
    body["spec"]["version"] = "17"  # type: ignore[index]
    body["status"]["version"] = "15"  # type: ignore[index]
    body["status"]["upgrade"] = {"phase": "Upgrading", "from": "15", "to": "17",  # type: ignore[index]
                                 "startedAt": "2026-12-02T11:59:00Z",
                                 "message": "every instance stopped; pg_upgrade runs"}  # fmt: skip
    text = "\n".join(plugin.report(body, [], now=NOW))
    assert "  PostgreSQL 15 (spec: 17), 3/3 instances ready" in text
    assert (
        "Upgrade: PostgreSQL 15 -> 17, Upgrading (step 2 of 5), started 1m ago:"
        " every instance stopped; pg_upgrade runs"
    ) in text
    body["status"]["version"] = "17"  # type: ignore[index]
    body["status"]["upgrade"]["phase"] = "Refused"  # type: ignore[index]
    text = "\n".join(plugin.report(body, [], now=NOW))
    assert "  PostgreSQL 17, 3/3" in text and "Upgrade: PostgreSQL 15 -> 17, Refused," in text
