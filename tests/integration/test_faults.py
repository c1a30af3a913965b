"""Failures with a writer running: one 3-instance cluster on the three real nodes, one fault
per test (the matrix is ``lab.faults.FAULTS``), and after each the same verdict.

Every fault starts from a healthy cluster (Ready, a synchronous standby, every replica
streaming, one timeline), runs a writer that records each acknowledged commit and the
server that acknowledged it, injects the fault, waits for writes to flow again, heals, and
then requires: every acknowledged row is on the primary and on every replica (the old
primary rejoined, rewound if it had to be), the members share one timeline, and no server
acknowledged a write after another had taken over (never two writable primaries).
Write downtime is printed, not asserted: numbers live in `make bench`.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest
from lab import faults
from lab.dataplane import (
    Writer,
    annotate,
    event_reasons,
    now_stamp,
    status_of,
    switchover_done,
)
from lab.faults import (
    FAULTS,
    NAME,
    REPLICAS,
    Lab,
    healthy,
    lab_on,
    new_primary,
    run_fault,
    synchronous_method,
    verdict,
)
from lab.waiting import wait_for
from lightkube.resources.core_v1 import Pod

from stateward.cli import plugin
from stateward_local.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lab(real_cluster: LocalCluster) -> Iterator[Lab]:
    with lab_on(real_cluster, "faults") as lab:
        yield lab


# --- process faults in the primary's container ---------------------------------------------


def test_postgres_killed_in_the_primary_comes_back_without_losing_a_write(lab: Lab) -> None:
    run_fault(lab, FAULTS["postgres-kill"])


def test_patroni_killed_in_the_primary_fails_over_or_restarts_without_losing_a_write(
    lab: Lab,
) -> None:
    outcome = run_fault(lab, FAULTS["patroni-kill"])
    if outcome.primary != outcome.old:
        failover = status_of(lab.client, lab.ns, NAME)["lastFailover"]
        assert failover["fromPod"] == outcome.old, failover
        assert "container" in failover.get("cause", ""), failover


def test_a_crash_looping_primary_is_replaced_without_waiting_for_the_lock_ttl(lab: Lab) -> None:
    outcome = run_fault(lab, FAULTS["patroni-crash-loop"])
    failover = status_of(lab.client, lab.ns, NAME)["lastFailover"]
    assert failover["fromPod"] == outcome.old
    assert failover.get("lockReleased") is True, failover
    assert "LeaderLockReleased" in event_reasons(lab.client, lab.ns)


def test_a_primary_whose_backend_is_oom_killed_recovers_without_losing_a_write(lab: Lab) -> None:
    run_fault(lab, FAULTS["oom"])


# --- node faults ---------------------------------------------------------------------------


def test_the_primary_node_powered_off_and_marked_out_of_service_fails_over_at_once(
    lab: Lab,
) -> None:
    outcome = run_fault(lab, FAULTS["node-stop"])
    failover = status_of(lab.client, lab.ns, NAME)["lastFailover"]
    assert (failover["fromPod"], failover["toPod"]) == (outcome.old, outcome.primary)
    # Released on the out-of-service proof, not after Patroni's ttl.
    assert failover.get("lockReleased") is True, failover
    assert "out of service" in failover["cause"]
    assert "LeaderLockReleased" in event_reasons(lab.client, lab.ns)
    print(f"node-stop: new primary {failover.get('seconds')}s after the primary was seen failing")


def test_a_hung_primary_node_is_replaced_before_the_lock_ttl_and_rejoins_when_thawed(
    lab: Lab,
) -> None:
    # The frozen primary's pod still looks Ready (its kubelet is frozen too); its synchronous
    # standby's WAL receiver loses it, and the operator releases the unrenewed lock instead
    # of waiting out the ttl. Thawed, the old primary acknowledges nothing (run_fault's
    # verdict: no write lost, none acknowledged by two servers) and rejoins.
    outcome = run_fault(lab, FAULTS["node-freeze"])
    failover = status_of(lab.client, lab.ns, NAME)["lastFailover"]
    assert failover["fromPod"] == outcome.old
    assert failover.get("lockReleased") is True, failover
    assert "went silent" in failover["cause"]
    print(f"node-freeze: new primary {outcome.promoted_after:.1f}s after the freeze")


def test_a_partitioned_primary_stops_accepting_writes_and_rejoins_when_healed(lab: Lab) -> None:
    run_fault(lab, FAULTS["node-partition"])


def test_a_replica_node_lost_while_the_primary_writes_keeps_the_primary(lab: Lab) -> None:
    started = time.monotonic()
    outcome = run_fault(lab, FAULTS["replica-node-stop"])
    # The primary dropped the dead standby's stream for want of a TCP acknowledgement
    # (tcp_user_timeout, 1 s, which the standby's postmaster sends in PGOPTIONS), not after
    # the 5 s wal_sender_timeout; the seconds this saves are in `make bench-faults`.
    since = int(time.monotonic() - started) + 5
    log = "".join(lab.client.log(outcome.primary, namespace=lab.ns, since=since))
    assert "could not receive data from client: Connection timed out" in log, log[-3000:]
    assert "terminating walsender process due to replication timeout" not in log


def test_under_quorum_commit_every_replica_votes_and_a_lost_one_keeps_the_primary(
    lab: Lab,
) -> None:
    # spec.synchronous.method Quorum, switched on a running cluster: Patroni commits to any one
    # of the two replicas (ANY 1), without restarting anything, and status calls both quorum
    # standbys. A standby's node lost under writes then costs commits no wait (the number is
    # in `make bench-faults`), and nothing acknowledged is lost.
    healthy(lab)
    before = restarts(lab)
    synchronous_method(lab, "Quorum")
    try:
        primary, _standby = healthy(lab)
        names = lab.sql(primary, "show synchronous_standby_names")
        replicas = [f"{NAME}-{i}" for i in range(REPLICAS) if f"{NAME}-{i}" != primary]
        assert names.startswith("ANY 1 (") and all(r in names for r in replicas), names
        assert restarts(lab) == before
        run_fault(lab, FAULTS["replica-node-stop-quorum"])
    finally:
        synchronous_method(lab, "Priority")
    healthy(lab)


def restarts(lab: Lab) -> dict[str, tuple[str, int]]:
    """Each instance pod's uid and its containers' restarts."""
    found = {}
    for name in (f"{NAME}-{i}" for i in range(REPLICAS)):
        pod = lab.client.get(Pod, name, namespace=lab.ns)
        statuses = pod.status.containerStatuses or []  # type: ignore[union-attr]
        found[name] = (str(pod.metadata.uid), sum(c.restartCount for c in statuses))  # type: ignore[union-attr]
    return found


# --- the control plane failing during failures ---------------------------------------------


def test_the_operator_killed_mid_switchover_and_mid_failover_catches_up(lab: Lab) -> None:
    old, _standby = healthy(lab)
    # Mid-switchover: killed once the switchover is recorded as running.
    started = now_stamp()
    annotate(lab.client, lab.ns, NAME, "any")
    wait_for(
        lambda: (
            (status_of(lab.client, lab.ns, NAME).get("switchover") or {}).get("startedAt", "")
            >= started
        ),
        what="the switchover to start",
        interval=0.1,
    )
    lab.operator.process.send_signal(signal.SIGKILL)
    lab.operator.process.wait()
    lab.start_operator()
    record = switchover_done(lab.client, lab.ns, NAME, started)
    assert record["phase"] == "Succeeded" and record["fromPod"] == old, record
    primary, _ = healthy(lab)
    assert primary != old

    # Mid-failover: the operator is down while the primary's pod goes; Patroni fails over
    # on its own, and the operator started again reports what happened.
    with Writer(lab.client, lab.ns, NAME, table="w_operator_kill") as writer:
        lab.operator.process.send_signal(signal.SIGKILL)
        lab.operator.process.wait()
        lab.client.delete(Pod, primary, namespace=lab.ns)
        promoted = wait_for(
            lambda: next(
                (
                    pod
                    for pod in (f"{NAME}-{i}" for i in range(REPLICAS))
                    if pod != primary and lab.sql(pod, "select pg_is_in_recovery()") == "f"
                ),
                None,
            ),
            what="Patroni to promote a replica with no operator running",
            timeout=120,
            interval=0.5,
        )
        lab.start_operator()
        wait_for(
            lambda: (
                (status_of(lab.client, lab.ns, NAME).get("lastFailover") or {}).get("toPod")
                == promoted
            ),
            what="the restarted operator to report the failover",
            timeout=60,
        )
        writer.wait_acks(10)
    assert status_of(lab.client, lab.ns, NAME)["primaryPod"] == promoted
    verdict(lab, writer, "operator-kill")


def test_writes_go_on_while_the_api_server_is_down_and_a_failover_waits_for_it(lab: Lab) -> None:
    old, _standby = healthy(lab)
    outage = 30.0
    with Writer(lab.client, lab.ns, NAME, table="w_api_down") as writer:
        lab.real.stop_component("kube-apiserver")
        try:
            # Patroni's failsafe mode: the primary reaches every member, so it keeps writing.
            stopped = time.monotonic()
            start = len(writer.acknowledged)
            wait_for(
                lambda: len(writer.acknowledged) >= start + 20,
                what="writes while the API server is down",
                timeout=outage / 2,
            )
            # Then the primary's Patroni dies with the API server still down: no failover
            # can happen (the lock lives in the API server), and none may be faked.
            faults.kill(
                wait_for(
                    lambda: faults.instance_processes(lab.ns, old).get("patroni"),
                    what=f"Patroni of {old}",
                )
            )
            # The outage lasts its 30 s whatever happens meanwhile: it is the fault itself.
            wait_for(
                lambda: time.monotonic() - stopped >= outage,
                what="the end of the outage",
                timeout=outage + 5,
                interval=0.5,
            )
        finally:
            lab.real.start_component("kube-apiserver")
        writer.wait_acks(20, timeout=180)
    verdict(lab, writer, "api-server-down")


# --- fencing on request ---------------------------------------------------------------------


def fence(lab: Lab, verb: str, pod: str) -> None:
    argv = ["--kubeconfig", str(lab.real.kubeconfig), "-n", lab.ns, verb, NAME, pod]
    assert plugin.main(argv) == 0


def restart_count(lab: Lab, pod: str) -> int:
    statuses = lab.pod(pod).status.containerStatuses or []  # type: ignore[union-attr]
    return sum(c.restartCount for c in statuses)


def instance_entry(lab: Lab, pod: str) -> dict[str, object]:
    instances = status_of(lab.client, lab.ns, NAME).get("instances") or []
    return next((i for i in instances if i["name"] == pod), {})


@contextlib.contextmanager
def fenced(lab: Lab, pod: str) -> Iterator[None]:
    """``pod`` fenced inside the block, unfenced after it whatever happened (the next test
    needs every instance)."""
    fence(lab, "fence", pod)
    try:
        yield
    finally:
        fence(lab, "unfence", pod)


def test_a_fenced_replica_stops_postgresql_keeps_its_pod_and_rejoins_when_unfenced(
    lab: Lab,
) -> None:
    primary, _standby = healthy(lab)
    replica = next(
        i["name"]
        for i in status_of(lab.client, lab.ns, NAME)["instances"]
        if i.get("role") == "replica"
    )
    uid = lab.pod(replica).metadata.uid  # type: ignore[union-attr]
    restarts = restart_count(lab, replica)  # earlier faults may have restarted it
    with fenced(lab, replica):
        wait_for(
            lambda: instance_entry(lab, replica).get("state") == "fenced",
            what=f"{replica} to be reported fenced",
            timeout=90,
        )
        # Neither Patroni nor PostgreSQL runs (the pod learns of the fence through its
        # watch, which may be reconnecting after an earlier fault).
        wait_for(
            lambda: faults.instance_processes(lab.ns, replica) == {},
            what=f"Patroni and PostgreSQL of {replica} to stop",
            timeout=60,
        )
        ready = next(
            c for c in status_of(lab.client, lab.ns, NAME)["conditions"] if c["type"] == "Ready"
        )
        assert ready["status"] == "False" and ready["reason"] == "InstancesFenced"
        assert replica in ready["message"]
        assert "InstancesFenced" in event_reasons(lab.client, lab.ns)
        # The pod, its container and its data stay; the primary goes on writing.
        assert lab.pod(replica).metadata.uid == uid  # type: ignore[union-attr]
        assert restart_count(lab, replica) == restarts  # fenced without a container restart
        assert lab.sql(primary, "create table while_fenced (n int)") == "CREATE TABLE"
    healthy(lab)
    assert lab.pod(replica).metadata.uid == uid  # type: ignore[union-attr]
    wait_for(
        lambda: lab.sql(replica, "select count(*) from while_fenced") == "0",
        what=f"{replica} to replay what was written while it was fenced",
    )


def test_a_fenced_primary_hands_over_to_its_synchronous_standby_first(lab: Lab) -> None:
    old, standby = healthy(lab)
    with Writer(lab.client, lab.ns, NAME, table="w_fence_primary") as writer:
        with fenced(lab, old):
            assert new_primary(lab, old) == standby
            writer.wait_acks(20)
        writer.wait_acks(5)
    verdict(lab, writer, "fence-primary")
