"""MariaDB failures with a writer running: one 3-server Database on the three real nodes, one
fault per test, and after each the same verdict.

Every fault starts from a healthy Database (Running, a primary and two replicating replicas),
runs a writer that records each acknowledged insert and the server that acknowledged it,
injects the fault, waits for writes to flow again, heals, and then requires: every
acknowledged row is on every server (the old primary rejoined as a replica), no server
acknowledged a write after another had taken over (never two servers accepting writes: the
writer tries every server when its own fails, as an application's connector does), and no
volume that held the Database's data was deleted. Write gaps are printed, not asserted:
numbers live in `make bench-mariadb`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event, PersistentVolume, PersistentVolumeClaim, Pod

from stateward.controllers.kube import DatabaseResource
from stateward.local.cluster import LocalCluster
from tests.support.databases import ServersWriter, create, pod_ip, query, roles, running, secret
from tests.support.dataplane import client_of, fresh_namespace, operator_on
from tests.support.waiting import Timeout, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAME = "mf"
SERVERS = tuple(f"{NAME}-{i}" for i in range(3))
Heal = Callable[[], None]
HOLD = 15.0
"""Seconds a fault that must not fail over lasts: past the operator's failover grace (10 s)."""


@dataclasses.dataclass
class Lab:
    real: LocalCluster
    client: Client
    ns: str

    def node_of(self, pod: str) -> str:
        return str(self.client.get(Pod, pod, namespace=self.ns).spec.nodeName)  # type: ignore[union-attr]

    def status(self) -> dict[str, Any]:
        found = self.client.get(DatabaseResource, NAME, namespace=self.ns).to_dict()
        return dict(found.get("status") or {})


@pytest.fixture(scope="module")
def lab(real_cluster: LocalCluster) -> Iterator[Lab]:
    client = client_of(real_cluster)
    with (
        operator_on(real_cluster, client, "mariadb-faults-operator"),
        fresh_namespace(client) as ns,
    ):
        create(client, ns, NAME, "mariadb", "10.11", 3)
        lab = Lab(real_cluster, client, ns)
        try:
            healthy(lab)
            placed = {lab.node_of(pod) for pod in SERVERS}
            assert len(placed) == 3, f"servers share nodes: {placed}"
            yield lab
        finally:
            for node, state in real_cluster.node_states():
                if state != "running":  # a failed fault must not leave a dead node behind
                    real_cluster.node_start(node.name)


def healthy(lab: Lab, timeout: float = 300) -> str:
    """Running with a primary and two replicating replicas; the primary's name."""
    status = running(lab.client, lab.ns, NAME, 3, timeout=timeout)["status"]
    wait_for(
        lambda: (
            sorted(r or "" for r in roles(lab.client, lab.ns).values())
            == ["primary", "replica", "replica"]
        ),
        what="one primary and two replicas",
        timeout=timeout,
    )
    return str(status["primaryPod"])


def volumes(lab: Lab) -> set[str]:
    """The PersistentVolumes that hold (or held) the servers' data."""
    claims = lab.client.list(PersistentVolumeClaim, namespace=lab.ns)
    return {c.spec.volumeName for c in claims if c.spec and c.spec.volumeName}


def mariadbd_of(ns: str, pod: str) -> int | None:
    """The pid of ``pod``'s mariadbd, found in /proc by its argv and its container's env."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode(errors="replace")).name != "mariadbd":
            continue
        if b"--init-file=/etc/stateward/users.sql" not in argv:
            continue  # the short-lived server of a first start, not the one serving
        env = dict(item.decode(errors="replace").split("=", 1) for item in environ if b"=" in item)
        if env.get("HOSTNAME") == pod and f".{ns}." in env.get("PEERS_HOST", ""):
            return int(entry.name)
    return None


def _kill_mariadbd(lab: Lab, primary: str) -> Heal | None:
    pid = wait_for(lambda: mariadbd_of(lab.ns, primary), what=f"{primary}'s mariadbd")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return None


def _freeze_node_of(pod: str) -> Callable[[Lab, str], Heal | None]:
    def inject(lab: Lab, primary: str) -> Heal | None:
        node = lab.node_of(primary if pod == "primary" else replica_of(lab, primary))
        lab.real.node_freeze(node)
        return lambda: lab.real.node_thaw(node)

    return inject


def replica_of(lab: Lab, primary: str) -> str:
    return next(pod for pod in SERVERS if pod != primary)


def run_fault(
    lab: Lab, name: str, inject: Callable[[Lab, str], Heal | None], *, failover: bool | None
) -> tuple[str, str, ServersWriter]:
    """From a healthy Database, with a writer running: inject, wait for a new primary (when
    ``failover``) and for writes to flow, heal, and pass the verdict. Returns the old and the
    final primary and the writer."""
    old = healthy(lab)
    before = lab.status().get("lastFailover")
    kept = volumes(lab)
    app = secret(lab.client, lab.ns, f"{NAME}-app")
    table = f"w_{name.replace('-', '_')}_{int(time.time())}"
    addresses = {pod: pod_ip(lab.client, lab.ns, pod) for pod in SERVERS}
    query(addresses[old], app, f"CREATE TABLE {table} (n INT PRIMARY KEY)")
    with ServersWriter(lambda: _addresses(lab), app, table) as writer:
        writer.wait_acks(20)
        injected = time.monotonic()
        heal = inject(lab, old)
        try:
            if failover is False:
                # Held past the failover grace: silence that long must still move nothing.
                wait_for(
                    lambda: (
                        time.monotonic() - injected >= HOLD
                        and sum(1 for _, at, _ in writer.acked if at > injected) >= 20
                    ),
                    what=f"writes acknowledged through {HOLD:.0f}s of {name}",
                    timeout=HOLD + 120,
                )
            if failover:
                wait_for(
                    lambda: (
                        (lab.status().get("lastFailover") or {}).get("fromPod") == old
                        and lab.status().get("lastFailover") != before
                    ),
                    what=f"a failover from {old}",
                    timeout=180,
                )
            writer.wait_acks(20, timeout=180)
        finally:
            if heal is not None:
                heal()
        writer.wait_acks(5, timeout=180)
    try:
        primary = healthy(lab)
    except Timeout as error:
        events = [f"{e.reason}: {e.message}" for e in lab.client.list(Event, namespace=lab.ns)][
            -15:
        ]
        raise AssertionError(
            f"{name}: not healthy again: {lab.status()}; roles {roles(lab.client, lab.ns)};"
            f" events {events}"
        ) from error
    acknowledged = {n for n, _, _ in writer.acked}
    select = f"SELECT n FROM {table}"  # noqa: S608 - our own table's name
    for pod in SERVERS:
        address = pod_ip(lab.client, lab.ns, pod)  # a re-made pod has a new address
        wait_for(
            lambda address=address: acknowledged <= {r[0] for r in query(address, app, select)},
            what=f"every acknowledged write of {name} on {pod}",
            timeout=120,
        )
    servers = writer.servers()
    assert len(servers) == len(set(servers)), f"{name}: writes acknowledged by {servers}"
    gone = {v for v in kept if not _exists(lab.client, v)}
    assert not gone, f"{name}: volumes that held data were deleted: {gone}"
    if failover is False:
        assert primary == old and lab.status().get("lastFailover") == before, (
            f"{name}: the primary moved from {old} to {primary}"
        )
    print(
        f"{name}: {len(acknowledged)} writes acknowledged, none lost; longest gap"
        f" {writer.longest_gap():.2f}s; acknowledged by {servers}"
    )
    return old, primary, writer


def _addresses(lab: Lab) -> list[str]:
    pods = lab.client.list(Pod, namespace=lab.ns, labels={"stateward.io/cluster": NAME})
    return [p.status.podIP for p in pods if p.status and p.status.podIP]


def _exists(client: Client, volume: str) -> bool:
    try:
        client.get(PersistentVolume, volume)
    except Exception:
        return False
    return True


def test_a_frozen_replica_node_costs_no_failover_and_no_write(lab: Lab) -> None:
    # Semi-synchronous: the other replica acknowledges while this one is frozen.
    run_fault(lab, "replica-node-freeze", _freeze_node_of("replica"), failover=False)


def test_mariadbd_killed_in_the_primary_loses_no_acknowledged_write(lab: Lab) -> None:
    # The container restarts its server read-only: the operator promotes the most advanced
    # server, the old one included when nobody has more.
    run_fault(lab, "mariadbd-kill", _kill_mariadbd, failover=None)


def _partition_primary_node(lab: Lab, primary: str) -> Heal | None:
    node = lab.node_of(primary)
    lab.real.node_partition(node)
    return lambda: lab.real.node_heal(node)


def test_a_frozen_primary_node_is_replaced_and_rejoins_as_a_replica_when_thawed(
    lab: Lab,
) -> None:
    # Silent over SQL with a pod that still looks ready: the failover waits the grace, after
    # stopping every replica from receiving from it; thawed, it can acknowledge nothing (its
    # commits wait for a replica that follows someone else) until the operator fences it.
    old, primary, _ = run_fault(
        lab, "primary-node-freeze", _freeze_node_of("primary"), failover=True
    )
    assert primary != old
    assert roles(lab.client, lab.ns)[old] == "replica"


def test_a_partitioned_primary_is_replaced_and_rejoins_as_a_replica_when_healed(
    lab: Lab,
) -> None:
    old, primary, _ = run_fault(
        lab, "primary-node-partition", _partition_primary_node, failover=True
    )
    assert primary != old
    assert roles(lab.client, lab.ns)[old] == "replica"
