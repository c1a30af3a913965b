"""The data plane read from Patroni's member records, and what a switchover would pick."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stateward.api import v1alpha1
from stateward.controllers.postgres import members as m
from stateward.controllers.postgres.dataplane import configuration_patch
from stateward.controllers.postgres.members import progress_only
from stateward.specs.postgres import config as config_spec

pytestmark = pytest.mark.unit


def pod(
    name: str,
    role: str | None,
    *,
    record: dict[str, Any] | None = None,
    ready: bool = True,
    ip: str | None = "10.0.0.1",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "labels": {}}
    if role:
        metadata["labels"]["stateward.io/role"] = role
    if record is not None:
        metadata["annotations"] = {"status": json.dumps(record)}
    return {
        "metadata": metadata,
        "status": {
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def primary(name: str = "pg-0", wal: int = 1000, **extra: Any) -> m.Member:
    record = {"state": "running", "role": "primary", "xlog_location": wal, "timeline": 2}
    return m.member(pod(name, "primary", record={**record, **extra}))


def replica(name: str, wal: int = 1000, state: str = "streaming", **kw: Any) -> m.Member:
    record = {
        "state": "running",
        "role": "replica",
        "xlog_location": wal,
        "replication_state": state,
        "timeline": 2,
    }
    return m.member(pod(name, "replica", record=record, **kw))


def test_a_member_record_is_read_from_the_pod_annotation() -> None:
    found = replica("pg-2", wal=900)
    assert found.name == "pg-2" and found.ordinal == 2
    assert found.streaming and found.ready and found.address == "10.0.0.1"
    assert (found.timeline, found.wal_position, found.pending_restart) == (2, 900, False)


@pytest.mark.parametrize("raw", ["", "{", "[]", "null", '"text"'])
def test_a_missing_or_broken_record_means_nothing_known(raw: str) -> None:
    body = pod("pg-1", "replica")
    body["metadata"]["annotations"] = {"status": raw}
    found = m.member(body)
    assert (found.state, found.timeline, found.wal_position, found.streaming) == (
        None,
        None,
        None,
        False,
    )


def test_pending_restart_comes_from_patroni() -> None:
    assert primary(pending_restart=True).pending_restart


def test_sync_standbys_are_read_from_the_sync_config_map() -> None:
    assert m.sync_standbys({"leader": "pg-0", "sync_standby": "pg-1,pg-2"}) == {"pg-1", "pg-2"}
    assert m.sync_standbys({"leader": "pg-0"}) == frozenset()
    assert m.sync_standbys(None) == frozenset()


def test_instances_report_roles_lag_and_timeline_as_patroni_does() -> None:
    found = m.instances(
        [replica("pg-2", wal=400, state="in archive recovery"), primary(), replica("pg-1")],
        frozenset({"pg-1"}),
    )
    assert found == [
        {"name": "pg-0", "role": "primary", "state": "running", "timeline": 2},
        {
            "name": "pg-1",
            "role": "sync_standby",
            "state": "streaming",
            "timeline": 2,
            "lagBytes": 0,
        },
        {
            "name": "pg-2",
            "role": "replica",
            "state": "in archive recovery",
            "timeline": 2,
            "lagBytes": 600,
        },
    ]


def test_under_quorum_commit_the_voters_are_quorum_standbys() -> None:
    found = m.instances(
        [replica("pg-2"), primary(), replica("pg-1")],
        frozenset({"pg-1", "pg-2"}),
        sync_role=m.QUORUM_STANDBY,
    )
    assert [i["role"] for i in found] == ["primary", "quorum_standby", "quorum_standby"]


def test_no_lag_is_reported_without_a_primary() -> None:
    assert "lagBytes" not in m.instances([replica("pg-1")], frozenset())[0]


def test_the_switchover_candidate_is_the_freshest_synchronous_standby() -> None:
    group = [primary(), replica("pg-1", wal=900), replica("pg-2", wal=950), replica("pg-3", 990)]
    sync = frozenset({"pg-1", "pg-2"})
    assert m.switchover_candidate(group, sync, synchronous=True) == ("pg-2", True)
    # without synchronous replication the freshest streaming replica
    assert m.switchover_candidate(group, sync, synchronous=False) == ("pg-3", True)


def test_no_candidate_without_a_synchronous_standby_in_synchronous_mode() -> None:
    group = [primary(), replica("pg-1")]
    assert m.switchover_candidate(group, frozenset(), synchronous=True) is None


def test_replicas_that_do_not_stream_or_are_not_ready_are_never_candidates() -> None:
    group = [
        primary(),
        replica("pg-1", state="in archive recovery"),
        replica("pg-2", ready=False),
    ]
    assert m.switchover_candidate(group, frozenset({"pg-1", "pg-2"}), synchronous=True) is None


def test_a_scale_down_picks_a_survivor_falling_back_to_a_graceful_failover() -> None:
    group = [primary("pg-4"), replica("pg-3", wal=999), replica("pg-1", wal=10), replica("pg-0")]
    sync = frozenset({"pg-3"})
    # the synchronous standby would be removed too: the best survivor, by failover
    assert m.switchover_candidate(group, sync, synchronous=True, below_ordinal=2) == (
        "pg-0",
        False,
    )
    assert m.switchover_candidate(
        group, frozenset({"pg-1"}), synchronous=True, below_ordinal=2
    ) == (
        "pg-1",
        True,
    )


def cluster(**spec: Any) -> v1alpha1.PostgresCluster:
    return v1alpha1.PostgresCluster.model_validate(
        {
            "metadata": {"name": "pg", "namespace": "ns", "uid": "u"},
            "spec": {"version": "15", "replicas": 3, "storageSize": "1Gi", **spec},
        }
    )


def test_synchronous_replication_is_on_by_default_with_one_standby() -> None:
    assert config_spec.synchronous_settings(cluster()) == {
        "synchronous_mode": True,
        "synchronous_mode_strict": False,
        "synchronous_node_count": 1,
    }
    assert config_spec.dynamic_configuration(cluster())["synchronous_mode"] is True


@pytest.mark.parametrize(
    ("mode", "strict", "enabled"),
    [("Preferred", False, True), ("Required", True, True), ("Off", False, False)],
)
def test_synchronous_modes(mode: str, strict: bool, enabled: bool) -> None:
    settings = config_spec.synchronous_settings(cluster(synchronous={"mode": mode, "number": 2}))
    assert settings["synchronous_mode"] is enabled
    assert settings["synchronous_mode_strict"] is strict
    assert settings["synchronous_node_count"] == 2


@pytest.mark.parametrize(
    ("mode", "strict", "enabled"),
    [("Preferred", False, "quorum"), ("Required", True, "quorum"), ("Off", False, False)],
)
def test_quorum_commit_is_patronis_quorum_mode(mode: str, strict: bool, enabled: object) -> None:
    settings = config_spec.synchronous_settings(
        cluster(synchronous={"mode": mode, "number": 1, "method": "Quorum"})
    )
    assert settings == {
        "synchronous_mode": enabled,
        "synchronous_mode_strict": strict,
        "synchronous_node_count": 1,
    }


def test_priority_is_the_default_method() -> None:
    assert cluster().spec.synchronous.method == v1alpha1.SynchronousMethod.PRIORITY
    explicit = cluster(synchronous={"method": "Priority"})
    assert config_spec.synchronous_settings(explicit) == config_spec.synchronous_settings(cluster())


def applied(pgc: v1alpha1.PostgresCluster) -> dict[str, Any]:
    return {
        **config_spec.ha_settings(pgc),
        "postgresql": {"parameters": config_spec.parameters(pgc)},
    }


def test_nothing_to_patch_when_patroni_has_the_spec() -> None:
    pgc = cluster(postgresql={"parameters": {"work_mem": "8MB"}})
    assert configuration_patch(pgc, applied(pgc)) == {}


def test_numbers_in_patronis_configuration_compare_as_text() -> None:
    pgc = cluster(postgresql={"parameters": {"max_connections": "200"}})
    dcs = applied(pgc)
    dcs["postgresql"]["parameters"]["max_connections"] = 200
    assert configuration_patch(pgc, dcs) == {}


def test_only_what_changed_is_patched_and_removed_parameters_are_nulled() -> None:
    before = cluster(postgresql={"parameters": {"work_mem": "8MB", "max_connections": "200"}})
    after = cluster(
        postgresql={"parameters": {"work_mem": "16MB"}}, synchronous={"mode": "Required"}
    )
    assert configuration_patch(after, applied(before)) == {
        "synchronous_mode_strict": True,
        "postgresql": {"parameters": {"work_mem": "16MB", "max_connections": None}},
    }


def test_a_configuration_without_synchronous_keys_has_patronis_defaults() -> None:
    pgc = cluster(synchronous={"mode": "Off"})
    dcs = {"postgresql": {"parameters": config_spec.parameters(pgc)}, "failsafe_mode": True}
    assert configuration_patch(pgc, dcs) == {}
    assert configuration_patch(cluster(), dcs) == {"synchronous_mode": True}


def test_failsafe_mode_is_on_and_a_cluster_made_without_it_gets_it() -> None:
    pgc = cluster()
    assert config_spec.dynamic_configuration(pgc)["failsafe_mode"] is True
    before = {k: v for k, v in applied(pgc).items() if k != "failsafe_mode"}
    assert configuration_patch(pgc, before) == {"failsafe_mode": True}


def _pod(status: dict[str, object], *, rv: str = "1", ready: str = "True") -> dict[str, object]:
    return {
        "kind": "Pod",
        "metadata": {"name": "pg-0", "namespace": "db", "resourceVersion": rv,
                     "labels": {"stateward.io/role": "primary"},
                     "annotations": {"status": json.dumps(status)}},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }  # fmt: skip


def test_wal_positions_moving_are_no_reason_to_reconcile() -> None:
    record = {"state": "running", "role": "primary", "timeline": 3, "xlog_location": 100}
    before = _pod(record)
    assert progress_only(before, _pod({**record, "xlog_location": 200}, rv="2"))
    assert not progress_only(before, _pod({**record, "timeline": 4}, rv="2"))
    assert not progress_only(before, _pod({**record, "state": "stopping"}, rv="2"))
    assert not progress_only(before, _pod(record, rv="2", ready="False"))


def test_the_lock_renewed_is_no_reason_to_reconcile_but_a_new_holder_is() -> None:
    def leader(holder: str, renewed: str, rv: str) -> dict[str, object]:
        return {"kind": "ConfigMap", "metadata": {
            "name": "pg-leader", "namespace": "db", "resourceVersion": rv,
            "annotations": {"leader": holder, "renewTime": renewed, "optime": rv}}}  # fmt: skip

    before = leader("pg-0", "t1", "1")
    assert progress_only(before, leader("pg-0", "t2", "2"))
    assert not progress_only(before, leader("pg-1", "t2", "2"))


def test_only_a_claims_size_capacity_and_metadata_are_reason_to_reconcile() -> None:
    def claim(
        rv: str,
        annotations: dict[str, str],
        phase: str = "Pending",
        volume: str = "",
        size: str = "1Gi",
        capacity: str | None = None,
    ) -> dict[str, object]:
        status: dict[str, object] = {"phase": phase}
        if capacity:
            status |= {"capacity": {"storage": capacity}, "accessModes": ["ReadWriteOnce"]}
        return {"kind": "PersistentVolumeClaim",
                "metadata": {"name": "data-pg-0", "namespace": "db", "resourceVersion": rv,
                             "labels": {"stateward.io/cluster": "pg"}, "annotations": annotations},
                "spec": {"resources": {"requests": {"storage": size}}, "volumeName": volume},
                "status": status}  # fmt: skip

    before = claim("1", {})
    selected = claim("2", {"volume.kubernetes.io/selected-node": "node-1"})
    assert progress_only(before, selected)
    # Its binding (three updates per claim while a cluster comes up) wakes nothing: the
    # store keeps the volume's name for the reconcile that reads it.
    bound = claim("3", {"pv.kubernetes.io/bind-completed": "yes"}, volume="pv-1")
    assert progress_only(selected, bound)
    assert progress_only(bound, claim("4", {}, "Bound", "pv-1"))
    # What growing a volume reads does: the size asked for and the capacity it has.
    assert not progress_only(bound, claim("5", {}, "Bound", "pv-1", capacity="1Gi"))
    grown = claim("6", {}, "Bound", "pv-1", size="2Gi", capacity="1Gi")
    assert not progress_only(claim("5", {}, "Bound", "pv-1", capacity="1Gi"), grown)
    assert not progress_only(grown, claim("7", {}, "Bound", "pv-1", size="2Gi", capacity="2Gi"))
    relabelled = claim("8", {})
    relabelled["metadata"]["labels"] = {}  # type: ignore[index]
    assert not progress_only(before, relabelled)
    deleting = claim("9", {})
    deleting["metadata"]["deletionTimestamp"] = "2026-12-07T08:00:00Z"  # type: ignore[index]
    assert not progress_only(before, deleting)


def test_a_budgets_status_is_no_reason_to_reconcile_but_its_spec_is() -> None:
    def budget(rv: str, healthy: int, minimum: int = 1) -> dict[str, object]:
        return {"kind": "PodDisruptionBudget",
                "metadata": {"name": "pg", "namespace": "db", "resourceVersion": rv},
                "spec": {"minAvailable": minimum},
                "status": {"currentHealthy": healthy, "expectedPods": 3}}  # fmt: skip

    assert progress_only(budget("1", 1), budget("2", 3))
    assert not progress_only(budget("1", 1), budget("2", 1, minimum=2))
    # Only a budget's status is unread: a Pod's status still counts.
    assert not progress_only(
        _pod({"state": "running"}), {**_pod({"state": "running"}, rv="2"), "status": {}}
    )
