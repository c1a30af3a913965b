"""The MariaDB fault matrix — the real-node tests, ``make bench-mariadb`` and ``make chaos
--engine mariadb`` draw from it, as ``lab.faults`` is PostgreSQL's.

A 3-server MariaDB Database, one server per real node, with its own operator. Every fault
starts from a healthy Database (Running, a primary and two replicating replicas), runs a
writer that records each acknowledged insert and the server that acknowledged it (trying
every server when its own fails, as an application's connector with a host list does),
injects the fault, waits for writes to flow again, heals, and then requires: every
acknowledged row is on every server (the old primary rejoined as a replica), no server
acknowledged a write after another had taken over (never two servers accepting writes), and
no volume that held the Database's data was deleted.

Test-only: the product never kills, freezes or cuts off anything.
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

from lightkube import Client
from lightkube.resources.core_v1 import Event, PersistentVolume, PersistentVolumeClaim, Pod

from lab.databases import (
    PROBE_BASE,
    ServersWriter,
    create,
    pod_ip,
    query,
    roles,
    running,
    secret,
)
from lab.dataplane import client_of, fresh_namespace, operator_on
from lab.waiting import Timeout, wait_for
from stateward.controllers.kube import DatabaseResource
from stateward_local.cluster import LocalCluster
from stateward_local.nodes import host

SERVERS = 3
HOLD = 15.0
"""Seconds a fault that must not fail over lasts: past the operator's failover grace (10 s)."""
Heal = Callable[[], None]


@dataclasses.dataclass
class Lab:
    real: LocalCluster
    client: Client
    ns: str
    name: str

    @property
    def pods(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{i}" for i in range(SERVERS))

    def node_of(self, pod: str) -> str:
        return str(self.client.get(Pod, pod, namespace=self.ns).spec.nodeName)  # type: ignore[union-attr]

    def status(self) -> dict[str, Any]:
        found = self.client.get(DatabaseResource, self.name, namespace=self.ns).to_dict()
        return dict(found.get("status") or {})

    def addresses(self) -> list[str]:
        pods = self.client.list(Pod, namespace=self.ns, labels={"stateward.io/cluster": self.name})
        return [p.status.podIP for p in pods if p.status and p.status.podIP]


@contextlib.contextmanager
def lab_on(real: LocalCluster, operator: str, name: str = "mf") -> Iterator[Lab]:
    """A MariaDB Database ``name`` of three servers on ``real``, one per node, in a namespace
    of its own with an operator of its own (``operator``: its process name). Afterwards every
    node runs again and the namespace goes."""
    client = client_of(real)
    with operator_on(real, client, operator), fresh_namespace(client) as ns:
        create(client, ns, name, "mariadb", "10.11", SERVERS)
        lab = Lab(real, client, ns, name)
        try:
            healthy(lab)
            placed = {lab.node_of(pod) for pod in lab.pods}
            assert len(placed) == SERVERS, f"servers share nodes: {placed}"
            yield lab
        finally:
            for node, state in real.node_states():
                if state != "running":  # a failed fault must not leave a dead node behind
                    real.node_start(node.name)


def healthy(lab: Lab, timeout: float = 300) -> str:
    """Running with a primary and two replicating replicas; the primary's name."""
    status = running(lab.client, lab.ns, lab.name, SERVERS, timeout=timeout)["status"]
    wait_for(
        lambda: (
            sorted(r or "" for r in roles(lab.client, lab.ns).values())
            == ["primary", "replica", "replica"]
        ),
        what="one primary and two replicas",
        timeout=timeout,
    )
    return str(status["primaryPod"])


# --- the faults ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fault:
    """``inject(lab, primary)`` breaks something and returns how to heal it (None when the
    Database heals itself); ``failover``: True when a new primary must take over, False when
    the primary must stay, None when either is right."""

    name: str
    inject: Callable[[Lab, str], Heal | None]
    failover: bool | None


def mariadbd_of(ns: str, pod: str) -> int | None:
    """The pid of ``pod``'s serving mariadbd, found in /proc by its argv and environment (the
    host shares one PID namespace with every node)."""
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


def _pod_delete(lab: Lab, primary: str) -> Heal | None:
    lab.client.delete(Pod, primary, namespace=lab.ns)
    return None


def _mariadbd_kill(lab: Lab, primary: str) -> Heal | None:
    pid = wait_for(lambda: mariadbd_of(lab.ns, primary), what=f"{primary}'s mariadbd")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return None


def _freeze(lab: Lab, pod: str) -> Heal:
    node = lab.node_of(pod)
    lab.real.node_freeze(node)
    return lambda: lab.real.node_thaw(node)


def _primary_node_freeze(lab: Lab, primary: str) -> Heal | None:
    return _freeze(lab, primary)


def _replica_node_freeze(lab: Lab, primary: str) -> Heal | None:
    return _freeze(lab, next(pod for pod in lab.pods if pod != primary))


@contextlib.contextmanager
def port_dropped(
    real: LocalCluster, client: Client, ns: str, pod: str, port: int
) -> Iterator[None]:
    """Every packet to ``pod`` on TCP ``port`` dropped where its node forwards it (what a
    partition, or a policy that does not admit the sender yet, does to that port alone)."""
    found = client.get(Pod, pod, namespace=ns)
    node = real.node(str(found.spec.nodeName))  # type: ignore[union-attr]
    address = found.status.podIP  # type: ignore[union-attr]
    table = "stateward-test-drop"
    rules = (
        f"table ip {table} {{\n  chain forward {{\n    type filter hook forward priority -10;\n"
        f"    ip daddr {address} tcp dport {port} drop\n  }}\n}}\n"
    )
    host.run(["nsenter", f"--net={node.net_ns}", "nft", "-f", "-"], input=rules)
    try:
        yield
    finally:
        host.run(["nsenter", f"--net={node.net_ns}", "nft", "delete", "table", "ip", table])


def _primary_node_partition(lab: Lab, primary: str) -> Heal | None:
    node = lab.node_of(primary)
    lab.real.node_partition(node)
    return lambda: lab.real.node_heal(node)


FAULTS = {
    fault.name: fault
    for fault in (
        # The operator fences the departing server, then promotes the most advanced replica.
        Fault("pod-delete", _pod_delete, failover=True),
        # The container restarts its server read-only: the operator promotes the most
        # advanced server, the old one included when nobody has more.
        Fault("mariadbd-kill", _mariadbd_kill, failover=None),
        # Silent over SQL with a pod that still looks ready: the failover waits the grace,
        # after stopping every replica from receiving from it; thawed, it can acknowledge
        # nothing (its commits wait for a replica that follows someone else) until fenced.
        Fault("primary-node-freeze", _primary_node_freeze, failover=True),
        # Cut off from everything, then healed: it rejoins as a replica.
        Fault("primary-node-partition", _primary_node_partition, failover=True),
        # Semi-synchronous: the other replica acknowledges while this one is frozen.
        Fault("replica-node-freeze", _replica_node_freeze, failover=False),
    )
}
"""MariaDB's fault matrix."""

POSTGRES_TWIN = {
    "pod-delete": "pod-delete",
    "mariadbd-kill": "postgres-kill",
    "primary-node-freeze": "node-freeze",
    "primary-node-partition": "node-partition",
}
"""MariaDB's fault → the same fault in PostgreSQL's matrix (``lab.faults``)."""


# --- one fault, and the verdict ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Outcome:
    fault: str
    old: str
    primary: str
    downtime: float
    """Seconds: the longest time between two acknowledged writes around the fault."""
    servers: list[str]
    """The servers that acknowledged writes, in order, each run once."""
    promoted_after: float | None = None
    """Seconds from the fault until ``status.lastFailover`` named the new primary."""
    acknowledged: frozenset[int] = frozenset()
    """The rows the writer had acknowledged, all on every server by the verdict."""
    table: str = ""
    """Where the writer wrote them."""


def run_fault(lab: Lab, fault: Fault) -> Outcome:
    """From a healthy Database, with a writer running: inject, wait for a new primary (when
    ``fault.failover``) and for writes to flow, heal, and pass the verdict (AssertionError
    naming what broke)."""
    old = healthy(lab)
    before = lab.status().get("lastFailover")
    kept = volumes(lab)
    app = secret(lab.client, lab.ns, f"{lab.name}-app")
    table = f"w_{fault.name.replace('-', '_')}_{int(time.time())}"
    query(pod_ip(lab.client, lab.ns, old), app, f"CREATE TABLE {table} (n INT PRIMARY KEY)")
    promoted_after = None
    with ServersWriter(lab.addresses, app, table) as writer:
        writer.wait_acks(20)
        injected = time.monotonic()
        heal = fault.inject(lab, old)
        try:
            if fault.failover is False:
                # Held past the failover grace: silence that long must still move nothing.
                wait_for(
                    lambda: (
                        time.monotonic() - injected >= HOLD
                        and sum(1 for _, at, _ in writer.acked if at > injected) >= 20
                    ),
                    what=f"writes acknowledged through {HOLD:.0f}s of {fault.name}",
                    timeout=HOLD + 120,
                )
            if fault.failover:
                wait_for(
                    lambda: (
                        (lab.status().get("lastFailover") or {}).get("fromPod") == old
                        and lab.status().get("lastFailover") != before
                    ),
                    what=f"a failover from {old}",
                    timeout=180,
                )
                promoted_after = time.monotonic() - injected
            writer.wait_acks(20, timeout=180)
        finally:
            if heal is not None:
                heal()
        writer.wait_acks(5, timeout=180)
    primary = verdict(lab, writer, fault.name, table, kept)
    if fault.failover is False:
        assert primary == old and lab.status().get("lastFailover") == before, (
            f"{fault.name}: the primary moved from {old} to {primary}"
        )
    if fault.failover:
        assert primary != old, f"{fault.name}: {old} is still the primary"
        assert roles(lab.client, lab.ns)[old] == "replica", f"{old} did not rejoin as a replica"
    return Outcome(
        fault.name, old, primary, writer.longest_gap(), writer.servers(), promoted_after,
        writer.acknowledged(), table,
    )  # fmt: skip


def verdict(lab: Lab, writer: ServersWriter, fault: str, table: str, kept: set[str]) -> str:
    """Healthy again, every acknowledged write on every server, one server acknowledging at
    a time, no volume that held data deleted; the primary's name."""
    try:
        primary = healthy(lab)
    except Timeout as error:
        events = [f"{e.reason}: {e.message}" for e in lab.client.list(Event, namespace=lab.ns)]
        raise AssertionError(
            f"{fault}: not healthy again: {lab.status()}; roles {roles(lab.client, lab.ns)};"
            f" events {events[-15:]}"
        ) from error
    app = secret(lab.client, lab.ns, f"{lab.name}-app")
    acknowledged = writer.acknowledged()
    select = f"SELECT n FROM {table}"  # noqa: S608 - our own table's name
    for pod in lab.pods:
        address = pod_ip(lab.client, lab.ns, pod)  # a re-made pod has a new address
        try:
            wait_for(
                lambda address=address: acknowledged <= {r[0] for r in query(address, app, select)},
                what=f"every acknowledged write of {fault} on {pod}",
                timeout=120,
            )
        except Timeout as error:
            raise AssertionError(f"{error}: {_missing(lab, writer, app, table, pod)}") from None
    servers = writer.servers()
    assert len(servers) == len(set(servers)), f"{fault}: writes acknowledged by {servers}"
    gone = {v for v in kept if not _exists(lab.client, v)}
    assert not gone, f"{fault}: volumes that held data were deleted: {gone}"
    return primary


def _missing(lab: Lab, writer: ServersWriter, app: dict[str, str], table: str, pod: str) -> str:
    """What a server lacks, who acknowledged it and when, and where every server stands: what
    a failed verdict needs to be understood after the cluster has moved on."""
    select = f"SELECT n FROM {table}"  # noqa: S608 - our own table's name
    try:
        held = {r[0] for r in query(pod_ip(lab.client, lab.ns, pod), app, select)}
    except Exception as error:
        return f"{pod} cannot be read ({error})"
    acks = {n: (at, server, "probe" if n >= PROBE_BASE else "writer")
            for n, at, server in (*writer.acked, *writer.probed)}  # fmt: skip
    missing = sorted(set(acks) - held)
    first = acks[min(acks, key=lambda n: acks[n][0])][0] if acks else 0.0
    shown = [f"{n} by {acks[n][2]} at {acks[n][1]} +{acks[n][0] - first:.1f}s" for n in missing[:8]]
    where = {}
    for other in lab.pods:
        try:
            address = pod_ip(lab.client, lab.ns, other)
            where[other] = (address, query(address, app, "SELECT @@read_only, @@gtid_current_pos"))
        except Exception as error:
            where[other] = ("?", type(error).__name__)
    return (
        f"{pod} lacks {len(missing)} of {len(acks)} acknowledged rows: {shown}; servers"
        f" {where}; roles {roles(lab.client, lab.ns)}; diverged"
        f" {lab.status().get('divergedVolumes')}; acknowledged by {writer.servers()}"
    )


def volumes(lab: Lab) -> set[str]:
    """The PersistentVolumes that hold (or held) the servers' data."""
    claims = lab.client.list(PersistentVolumeClaim, namespace=lab.ns)
    return {c.spec.volumeName for c in claims if c.spec and c.spec.volumeName}


def _exists(client: Client, volume: str) -> bool:
    try:
        client.get(PersistentVolume, volume)
    except Exception:
        return False
    return True
