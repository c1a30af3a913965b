"""When the operator may release a dead primary's leader lock (controllers/postgres/takeover.py)."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers.postgres import takeover
from stateward.controllers.postgres.members import Member
from stateward.instance import patroni

C = "postgres"


def pod(
    *,
    name: str = "pg-0",
    node: str | None = "node-1",
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    ready: bool = True,
    deleting: bool = False,
    restarts: int = 0,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [
            {
                "name": C,
                "state": state if state is not None else {"running": {}},
                "lastState": {"terminated": last} if last else {},
                "restartCount": restarts,
            },
            {"name": "sidecar", "state": {"terminated": {"finishedAt": "2026-12-02T10:00:09Z"}}},
        ],
    }
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": status}


def node(name: str = "node-1", *taints: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"taints": list(taints)}}


OUT = {"key": takeover.OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}
DIED = {"finishedAt": "2026-12-02T10:00:05Z", "reason": "Error", "exitCode": 137}


def lock(holder: str = "pg-0", renewed: str = "2026-12-02T10:00:03.512345+00:00") -> dict[str, str]:
    return {"leader": holder, "renewTime": renewed, "ttl": "20"}


# --- the out-of-service proof ------------------------------------------------------------


def test_a_primary_on_a_node_marked_out_of_service_is_proven_dead() -> None:
    found = takeover.proof(pod(), node("node-1", OUT), lock(), container=C)
    assert found is not None and found.reason == takeover.NODE_OUT_OF_SERVICE
    assert "node-1" in found.message and "out-of-service=nodeshutdown" in found.message


def test_any_effect_of_the_taint_counts_but_other_taints_do_not() -> None:
    no_schedule = {"key": takeover.OUT_OF_SERVICE_TAINT, "effect": "NoSchedule"}
    assert takeover.proof(pod(), node("node-1", no_schedule), lock(), container=C) is not None
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}
    assert takeover.proof(pod(), node("node-1", unreachable), lock(), container=C) is None


def test_a_taint_on_another_node_proves_nothing() -> None:
    assert takeover.proof(pod(node="node-2"), node("node-1", OUT), lock(), container=C) is None
    assert takeover.proof(pod(node=None), node("node-1", OUT), lock(), container=C) is None


def test_no_proof_for_a_pod_that_does_not_hold_the_lock() -> None:
    assert takeover.proof(pod(), node("node-1", OUT), lock("pg-1"), container=C) is None
    assert takeover.proof(pod(), node("node-1", OUT), {}, container=C) is None


# --- the terminated-container proof ------------------------------------------------------


def test_a_container_that_died_after_the_last_renewal_is_proven_dead() -> None:
    found = takeover.proof(pod(state={"terminated": DIED}), node(), lock(), container=C)
    assert found is not None and found.reason == takeover.CONTAINER_TERMINATED
    assert "Error" in found.message and "2026-12-02T10:00:05Z" in found.message


def test_a_container_waiting_to_restart_is_judged_by_its_last_termination() -> None:
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    found = takeover.proof(pod(state=waiting, last=DIED), node(), lock(), container=C)
    assert found is not None and found.reason == takeover.CONTAINER_TERMINATED


def test_a_running_container_is_never_proof_whatever_it_did_before() -> None:
    assert takeover.proof(pod(last=DIED, restarts=1), node(), lock(), container=C) is None


def test_a_lock_renewed_after_the_death_proves_nothing() -> None:
    # A restarted container renewed it: someone alive holds the lock.
    late = lock(renewed="2026-12-02T10:00:06.000001+00:00")
    assert takeover.proof(pod(state={"terminated": DIED}), node(), late, container=C) is None


@pytest.mark.parametrize(
    "renewed", ["2026-12-02T10:00:05.000000+00:00", "2026-12-02T10:00:05.4+00:00"]
)
def test_a_renewal_within_the_second_of_death_is_not_proof(renewed: str) -> None:
    # The kubelet writes whole seconds: 10:00:05Z may mean 10:00:05.9, so a renewal at
    # 10:00:05.4 may have come after it. Only a strictly earlier renewal counts.
    assert (
        takeover.proof(pod(state={"terminated": DIED}), node(), lock(renewed=renewed), container=C)
        is None
    )


@pytest.mark.parametrize(
    ("renewed", "proven"),
    [
        ("2026-12-02T10:00:05.4+00:00", True),
        ("2026-12-02T10:00:05.999999+00:00", True),
        ("2026-12-02T10:00:06+00:00", False),
        ("2026-12-02T10:00:07.5+00:00", False),
    ],
)
def test_a_renewal_within_the_second_of_death_is_proof_while_the_container_backs_off(
    renewed: str, proven: bool
) -> None:
    # No instance starts within a second of a death while the kubelet backs off: a renewal
    # before that second's end was the dead instance's own (Patroni killed as it renewed).
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    found = takeover.proof(
        pod(state=waiting, last=DIED), node(), lock(renewed=renewed), container=C
    )
    assert (found is not None) is proven


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing", ""])
def test_other_waits_keep_the_whole_second_in_doubt(reason: str) -> None:
    waiting = {"waiting": {"reason": reason} if reason else {}}
    renewed = lock(renewed="2026-12-02T10:00:05.4+00:00")
    assert takeover.proof(pod(state=waiting, last=DIED), node(), renewed, container=C) is None


def test_an_unreadable_renewal_or_death_time_proves_nothing() -> None:
    assert (
        takeover.proof(pod(state={"terminated": DIED}), node(), lock(renewed="soon"), container=C)
        is None
    )
    assert (
        takeover.proof(pod(state={"terminated": DIED}), node(), {"leader": "pg-0"}, container=C)
        is None
    )
    no_time = {"reason": "Error", "exitCode": 1}
    assert takeover.proof(pod(state={"terminated": no_time}), node(), lock(), container=C) is None


def test_only_the_instance_container_counts() -> None:
    # The sidecar in pod() has terminated after the renewal; the instance container runs.
    assert takeover.proof(pod(), node(), lock(), container=C) is None


def test_a_waiting_container_never_started_is_not_proof() -> None:
    creating = {"waiting": {"reason": "ContainerCreating"}}
    assert takeover.proof(pod(state=creating), node(), lock(), container=C) is None


def test_a_deleting_or_unready_pod_alone_is_not_proof() -> None:
    assert takeover.proof(pod(deleting=True, ready=False), node(), lock(), container=C) is None


# --- the release itself ---------------------------------------------------------------------


def test_the_release_is_conditioned_on_the_version_read_and_removes_only_the_holder() -> None:
    body = {"metadata": {"name": "pg-leader", "resourceVersion": "42", "annotations": lock()}}
    assert takeover.release_patch(body) == {
        "metadata": {"resourceVersion": "42", "annotations": {"leader": None}}
    }


# --- the cheap filter and the words for users ----------------------------------------------


def test_only_a_pod_that_looks_unwell_is_worth_a_look() -> None:
    assert not takeover.suspect(pod(), C)
    assert not takeover.suspect(pod(last=DIED, restarts=1), C)  # restarted, running, ready
    assert takeover.suspect(pod(ready=False), C)
    assert takeover.suspect(pod(deleting=True), C)
    assert takeover.suspect(pod(state={"terminated": DIED}), C)


def test_only_a_container_that_ever_ran_could_hold_the_lock() -> None:
    assert takeover.started(pod(), C)
    assert takeover.started(pod(state={"terminated": DIED}), C)
    assert takeover.started(pod(state={"waiting": {"reason": "CrashLoopBackOff"}}, last=DIED), C)
    assert takeover.started(pod(state={"waiting": {}}, restarts=1), C)
    assert not takeover.started(pod(state={"waiting": {"reason": "ContainerCreating"}}), C)
    unscheduled = pod(node=None)
    unscheduled["status"]["containerStatuses"] = []
    assert not takeover.started(unscheduled, C)
    # Only the instance container counts: pod()'s sidecar has terminated.
    sidecar_only = pod(state={"waiting": {"reason": "PodInitializing"}})
    assert not takeover.started(sidecar_only, C)


def test_the_cause_says_what_happened() -> None:
    assert takeover.failure_cause(pod(), node("node-1", OUT), C) == (
        "its node node-1 went out of service"
    )
    assert takeover.failure_cause(pod(state={"terminated": DIED}), node(), C) == (
        "its container terminated (Error)"
    )
    oom = {"finishedAt": "2026-12-02T10:00:05Z", "reason": "OOMKilled", "exitCode": 137}
    assert "OOMKilled" in takeover.failure_cause(pod(state={"waiting": {}}, last=oom), node(), C)
    assert takeover.failure_cause(pod(deleting=True), node(), C) == "its pod was deleted"
    assert takeover.failure_cause(pod(ready=False), None, C) == "its pod stopped being ready"
    no_reason = {"finishedAt": "2026-12-02T10:00:05Z", "exitCode": 1}
    assert "exit code 1" in takeover.failure_cause(pod(state={"terminated": no_reason}), None, C)


def test_a_concrete_cause_is_only_what_the_api_shows_plainly() -> None:
    assert takeover.concrete_cause(pod(ready=False), None, C) is None
    assert takeover.concrete_cause(pod(), None, C) is None
    assert takeover.concrete_cause(pod(state={"terminated": DIED}), None, C) == (
        "its container terminated (Error)"
    )
    # Restarted since it was counted: running and ready again, its last death tells.
    restarted = pod(last=DIED, restarts=2)
    assert takeover.concrete_cause(restarted, None, C, restarts=1) == (
        "its container terminated (Error)"
    )
    assert takeover.concrete_cause(restarted, None, C, restarts=2) is None
    assert takeover.concrete_cause(restarted, None, C) is None, "no count taken: no claim"


@pytest.mark.parametrize(
    ("renewed", "now", "age"),
    [
        ("2026-12-02T10:00:03.5+00:00", "2026-12-02T10:00:10Z", 6.5),
        ("2026-12-02T10:00:12+00:00", "2026-12-02T10:00:10Z", -2.0),  # holder's clock ahead
        ("2026-12-02T10:00:03", "2026-12-02T10:00:10Z", 0.0),  # no zone: unreadable
        (None, "2026-12-02T10:00:10Z", 0.0),
        ("2026-12-02T10:00:03.5+00:00", None, 0.0),
    ],
)
def test_the_lock_age_is_read_from_its_renew_time(
    renewed: str | None, now: str | None, age: float
) -> None:
    annotations = {"leader": "pg-0", **({"renewTime": renewed} if renewed else {})}
    assert takeover.unrenewed_for(annotations, now) == pytest.approx(age)


@pytest.mark.parametrize(
    ("seen_for", "unrenewed", "remaining"),
    [
        (0.0, 0.0, takeover.UNRENEWED_SECONDS),
        (takeover.SILENT_SECONDS, takeover.UNRENEWED_SECONDS, 0.0),
        (10.0, 30.0, 0.0),
        (1.0, 30.0, takeover.SILENT_SECONDS - 1.0),  # one version not seen for long enough
        (10.0, 2.0, takeover.UNRENEWED_SECONDS - 2.0),  # stamped moments ago
    ],
)
def test_a_silent_lock_waits_for_both_clocks(
    seen_for: float, unrenewed: float, remaining: float
) -> None:
    assert takeover.silent_wait(seen_for, unrenewed) == pytest.approx(remaining)


def written(*times: Any) -> dict[str, Any]:
    return {"metadata": {"managedFields": [{"manager": "m", "time": t} for t in times]}}


def test_the_last_write_is_the_newest_server_stamp() -> None:
    last = takeover.last_written(written("2026-12-02T10:00:05Z", "2026-12-02T10:00:09Z"))
    assert last is not None and last.second == 9
    assert takeover.last_written(written()) is None
    assert takeover.last_written({"metadata": {}}) is None
    assert takeover.last_written(written(None, 17, "2026-12-02T10:00:05")) is None


@pytest.mark.parametrize(
    ("lock_written", "reported", "served"),
    [
        ("2026-12-02T10:00:24Z", "2026-12-02T10:00:30Z", 5.0),  # whole seconds: one less
        ("2026-12-02T10:00:30Z", "2026-12-02T10:00:30Z", -1.0),
        ("2026-12-02T10:00:31Z", "2026-12-02T10:00:30Z", -2.0),
        (None, "2026-12-02T10:00:30Z", None),
        ("2026-12-02T10:00:24Z", None, None),
    ],
)
def test_the_server_measures_the_lock_unrenewed_until_the_witness_wrote(
    lock_written: str | None, reported: str | None, served: float | None
) -> None:
    lock = written(*([lock_written] if lock_written else []))
    witness = written(*([reported] if reported else []))
    assert takeover.served_unrenewed(lock, witness) == served
    assert takeover.served_unrenewed(lock, None) is None


def test_server_stamps_old_enough_end_the_wait_at_once() -> None:
    assert takeover.silent_wait(0.0, 0.0, takeover.UNRENEWED_SECONDS) == 0.0
    below = takeover.UNRENEWED_SECONDS - 0.5
    assert takeover.silent_wait(0.0, 0.0, below) == takeover.silent_wait(0.0, 0.0)
    assert takeover.silent_wait(1.0, 30.0, None) == pytest.approx(takeover.SILENT_SECONDS - 1.0)


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("2026-12-02T10:00:05Z", True),
        ("2026-12-02T10:00:05.123456+00:00", True),
        ("2026-12-02T10:00:05", False),  # no zone: cannot be compared safely
        ("", False),
        (None, False),
        (17, False),
    ],
)
def test_times_are_read_only_with_a_zone(text: Any, valid: bool) -> None:
    assert (takeover.parse_time(text) is not None) is valid


def member(name: str, *, role: str | None = "replica", state: str | None = "running",
           stream: str | None = None) -> Member:  # fmt: skip
    return Member(
        name=name, uid=name, ordinal=int(name.rsplit("-", 1)[1]), label_role=role, ready=True,
        address=None, state=state, timeline=1, wal_position=0, replication_state=stream,
        pending_restart=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("members", "synchronous", "witness"),
    [
        # The listed standby's receiver lost the primary: it witnesses.
        ([member("pg-1", stream="in archive recovery")], {"pg-1"}, "pg-1"),
        ([member("pg-1", stream=None)], {"pg-1"}, "pg-1"),
        # Streaming, or not listed as synchronous, or not running, or not a replica: no.
        ([member("pg-1", stream="streaming")], {"pg-1"}, None),
        ([member("pg-1", stream="in archive recovery")], {"pg-2"}, None),
        ([member("pg-1", state="starting")], {"pg-1"}, None),
        ([member("pg-1", role=None)], {"pg-1"}, None),
        # The primary itself never witnesses; of two listed, the lower ordinal.
        ([member("pg-0", role="primary")], {"pg-0"}, None),
        ([member("pg-2"), member("pg-1")], {"pg-1", "pg-2"}, "pg-1"),
    ],
)
def test_a_stream_witness_is_a_running_listed_standby_that_lost_the_primary(
    members: list[Member], synchronous: set[str], witness: str | None
) -> None:
    found = takeover.stream_witness(members, "pg-0", frozenset(synchronous))
    assert (found.name if found else None) == witness


def test_the_silent_proof_says_who_lost_the_stream_and_for_how_long() -> None:
    proof = takeover.silent_proof("pg-1", 3.04)
    assert proof.reason == "PrimarySilent"
    assert "pg-1 lost its WAL stream" in proof.message and "3.0 s" in proof.message
    assert takeover.SILENT_SECONDS > patroni.LOOP_WAIT, "a live Patroni renews within it"


@pytest.mark.parametrize(
    ("members", "synchronous", "candidate"),
    [
        # A running standby Patroni's record lists: it holds every acknowledged commit.
        ([member("pg-1"), member("pg-2")], {"pg-1"}, "pg-1"),
        ([member("pg-1"), member("pg-2")], {"pg-2"}, "pg-2"),
        # Streaming or not does not matter (a dead primary streams to nobody).
        ([member("pg-1", stream="in archive recovery")], {"pg-1"}, "pg-1"),
        # Of two listed, the lower ordinal.
        ([member("pg-2"), member("pg-1")], {"pg-1", "pg-2"}, "pg-1"),
        # Not listed, not running, the primary itself, or no record: nobody.
        ([member("pg-1"), member("pg-2")], {"pg-3"}, None),
        ([member("pg-1", state="starting")], {"pg-1"}, None),
        ([member("pg-0", role="primary")], {"pg-0"}, None),
        ([member("pg-1")], None, None),
    ],
)
def test_the_handover_candidate_is_a_running_member_of_the_sync_record(
    members: list[Member], synchronous: set[str] | None, candidate: str | None
) -> None:
    listed = frozenset(synchronous) if synchronous is not None else None
    assert takeover.handover_candidate(members, "pg-0", listed) == candidate


def test_the_handover_is_patronis_failover_record_with_the_locks_labels() -> None:
    lock = {"metadata": {"name": "pg-leader", "namespace": "db", "labels": {"cluster": "pg"}}}
    record = takeover.handover(lock, "pg-failover", "pg-0", "pg-1")
    assert record["metadata"] == {
        "name": "pg-failover",
        "namespace": "db",
        "labels": {"cluster": "pg"},  # Patroni lists its records by these
        "annotations": {"leader": "pg-0", "member": "pg-1"},
    }
    patch = takeover.handover_patch("pg-0", "pg-1")["metadata"]["annotations"]
    assert patch == {"leader": "pg-0", "member": "pg-1", "scheduled_at": None}
    withdrawn = takeover.WITHDRAW_HANDOVER["metadata"]["annotations"]
    assert withdrawn == {"leader": None, "member": None}
