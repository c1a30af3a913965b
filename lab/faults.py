"""Fault injection for the real-node tests, the benchmark and the chaos soak: processes of an
instance found from the host, and SQL sent from inside a node's network.

Test-only: the product never kills anything. The host shares one PID namespace with every
node (nodes have their own network and mount namespaces only), so an instance's Patroni and
PostgreSQL are found in /proc by the environment the StatefulSet gives them.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from lightkube import ApiError, Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod, Secret
from lightkube.types import PatchType

from lab.dataplane import Writer, create_cluster, sql, status_of, wait_namespaces_gone
from lab.operator import RESYNC_SECONDS, get_pgc, wait_leading
from lab.waiting import Timeout, wait_for
from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.nodes import layout
from stateward_local.run import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    PostgresClusterResource,
    ensure_namespace,
    install_crds,
    start_operator,
)

NAME = "f"
REPLICAS = 3
MEMORY_LIMIT = "512Mi"
"""The fault cluster's instance memory limit: the OOM fault exceeds it."""
OOM_ROWS = 60_000_000
"""Rows the OOM fault sorts in memory: well past MEMORY_LIMIT."""


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _argv(pid: int) -> list[str]:
    try:
        return [
            a.decode(errors="replace")
            for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if a
        ]
    except OSError:
        return []


def _cgroup(pid: int) -> str | None:
    """The process's memory cgroup: one per container."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    return next((line.rsplit(":", 1)[1] for line in lines if ":memory:" in line), None)


def instance_processes(namespace: str, pod: str) -> dict[str, int]:
    """``{"patroni": pid, "postmaster": pid}`` of one instance pod, as far as they run.

    Patroni starts the postmaster through a launcher that exits, so the postmaster is the
    container's PID 1's child, not Patroni's: it is found in Patroni's container cgroup."""
    found: dict[str, int] = {}
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    for pid in pids:
        env = _environ(pid)
        if env.get("PATRONI_NAME") != pod or env.get("PATRONI_KUBERNETES_NAMESPACE") != namespace:
            continue
        if any(Path(a).name == "patroni" for a in _argv(pid)[:2]):
            found["patroni"] = pid
    container = _cgroup(found["patroni"]) if "patroni" in found else None
    if container is not None:
        for pid in pids:
            argv = _argv(pid)
            if (
                argv
                and Path(argv[0]).name == "postgres"
                and "-D" in argv
                and _cgroup(pid) == container
            ):
                found["postmaster"] = pid
    return found


def kill(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def sql_in_node(
    node: layout.Node, dsn: str, password: str, statement: str, timeout: float = 5
) -> str | None:
    """``statement`` from inside ``node``'s network (where a partitioned node's pods are still
    reachable); its output, or None if it failed or gave no answer within ``timeout`` (a
    commit waiting for a synchronous standby that is gone never answers)."""
    try:
        done = subprocess.run(
            [
                "nsenter",
                f"--net={node.net_ns}",
                "--",
                "psql",
                dsn,
                "-v",
                "ON_ERROR_STOP=1",
                "-tAc",
                statement,
            ],
            env={**os.environ, "PGPASSWORD": password},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


# --- one cluster under faults ---------------------------------------------------------


@dataclasses.dataclass
class Lab:
    real: LocalCluster
    client: Client
    ns: str
    operator: OperatorProcess

    def start_operator(self) -> None:
        self.operator = start_operator(
            self.real, extra=[f"--resync-interval={RESYNC_SECONDS}"], name="faults-operator"
        )
        wait_leading(self.operator)

    def pod(self, name: str) -> Pod:
        return self.client.get(Pod, name, namespace=self.ns)

    def ip(self, name: str) -> str:
        return str(self.pod(name).status.podIP)  # type: ignore[union-attr]

    def node_of(self, name: str) -> str:
        return str(self.pod(name).spec.nodeName)  # type: ignore[union-attr]

    def password(self, user: str = "superuser") -> str:
        """The password in ``NAME-superuser`` (or ``NAME-app`` for ``user="app"``)."""
        secret = self.client.get(Secret, f"{NAME}-{user}", namespace=self.ns)
        return base64.b64decode((secret.data or {})["password"]).decode()

    def sql(self, pod: str, statement: str) -> str:
        return sql(self.real, self.ns, pod, statement)

    def diagnose(self, what: str) -> str:
        """What a failed wait needs to be understood: the cluster's status, each instance's
        last log lines and the operator's. Written whole to ``logs/`` of the local cluster
        (kept when a test failed, see tests/conftest.py); returned short, for the failure."""
        status = status_of(self.client, self.ns, NAME)
        parts = [("status", [repr(status)])]
        for index in range(REPLICAS):
            pod = f"{NAME}-{index}"
            done = subprocess.run(
                [str(binaries.locate().kubectl), "logs", "-n", self.ns, pod, "--tail=80"],
                env={**os.environ, "KUBECONFIG": str(self.real.kubeconfig)},
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            parts.append((pod, (done.stdout + done.stderr).splitlines()))
        parts.append(("operator", _tail(self.operator.log, 60)))
        path = self.real.state_dir / "logs" / f"diagnosis-{what}-{int(time.time())}.txt"
        path.write_text(
            "".join(f"--- {title} ---\n" + "\n".join(lines) + "\n" for title, lines in parts)
        )
        short = "".join(
            f"--- {title} ---\n" + "\n".join(line[:240] for line in lines[-8:]) + "\n"
            for title, lines in parts
        )
        return f"{short}\n(the whole diagnosis: {path})"


@contextlib.contextmanager
def lab_on(real: LocalCluster, prefix: str) -> Iterator[Lab]:
    """The fault cluster on ``real``: its own namespace and operator, one 3-instance
    PostgresCluster with a memory limit (for the OOM fault), one instance per node (a node
    taking two would take the primary and its synchronous standby at once, which nothing
    survives without loss). Afterwards every node runs again and the namespace goes."""
    client = Client(KubeConfig.from_file(real.kubeconfig), field_manager=f"stateward-{prefix}")
    install_crds(client)
    ensure_namespace(client, OPERATOR_NAMESPACE)
    ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.create(Namespace(metadata=ObjectMeta(name=ns)))
    operator = start_operator(
        real, extra=[f"--resync-interval={RESYNC_SECONDS}"], name=f"{prefix}-operator"
    )
    lab = Lab(real, client, ns, operator)
    try:
        wait_leading(lab.operator)
        create_cluster(
            client,
            ns,
            NAME,
            replicas=REPLICAS,
            resources={"requests": {"memory": "128Mi"}, "limits": {"memory": MEMORY_LIMIT}},
        )
        healthy(lab)
        placed = {lab.node_of(f"{NAME}-{i}") for i in range(REPLICAS)}
        assert len(placed) == REPLICAS, f"instances share nodes: {placed}"
        yield lab
    finally:
        for node, state in real.node_states():
            if state != "running":  # a failed fault must not leave a dead node behind
                real.node_start(node.name)
        client.delete(Namespace, ns)
        try:
            wait_namespaces_gone(client)  # the cluster's finalizer needs the operator
        finally:
            lab.operator.stop()


HEALTHY_ROLES = {
    "Priority": ["primary", "replica", "sync_standby"],
    "Quorum": ["primary", "quorum_standby", "quorum_standby"],
}
"""The roles of a healthy cluster's members, by ``spec.synchronous.method``: one synchronous
standby, or every replica a quorum standby."""


def healthy(lab: Lab, timeout: float = 300) -> tuple[str, str]:
    """Wait for Ready, one primary, its synchronous standby (under quorum commit: every
    replica a quorum standby), every replica streaming and one timeline; the primary's and a
    standby's names."""

    def check() -> tuple[str, str] | None:
        pgc = get_pgc(lab.client, NAME, lab.ns)
        method = (pgc["spec"].get("synchronous") or {}).get("method", "Priority")
        status = pgc.get("status") or {}
        instances = status.get("instances") or []
        roles = {i["name"]: i.get("role") for i in instances}
        if (
            status.get("phase") != "Ready"
            or sorted(roles.values()) != HEALTHY_ROLES[method]
            or any(i.get("state") != "streaming" for i in instances if i.get("role") != "primary")
            or len({i.get("timeline") for i in instances}) != 1
        ):
            return None
        primary = str(status["primaryPod"])
        standby = next(n for n, r in sorted(roles.items()) if r.endswith("_standby"))
        # The status may lag Patroni by a few seconds (progress is paced): a fault injected
        # while the primary has no synchronous standby in Patroni's own record tests nothing
        # (no replica may be promoted then), so the precondition is also read at the source.
        return (primary, standby) if patroni_agrees(lab, primary, standby) else None

    return wait_for(
        check,
        what="a healthy cluster (sync standby, streaming, one timeline)",
        timeout=timeout,
        interval=1,
    )


def patroni_agrees(lab: Lab, primary: str, standby: str) -> bool:
    """Patroni's own record names ``primary`` as the leader and ``standby`` as synchronous
    (the ``NAME-sync`` ConfigMap, what decides who may be promoted), and every replica
    streams from the primary (``pg_stat_replication``)."""
    sync = lab.client.get(ConfigMap, f"{NAME}-sync", namespace=lab.ns).metadata
    annotations = (sync.annotations if sync else None) or {}
    if annotations.get("leader") != primary:
        return False
    if standby not in (annotations.get("sync_standby") or "").split(","):
        return False
    streaming = lab.sql(
        primary, "select count(*) from pg_stat_replication where state = 'streaming'"
    )
    return streaming == str(REPLICAS - 1)


def new_primary(lab: Lab, old: str, timeout: float = 120) -> str:
    """Wait for status.primaryPod to name a pod other than ``old`` that accepts writes."""

    def promoted() -> str | None:
        current = status_of(lab.client, lab.ns, NAME).get("primaryPod")
        if current and current != old and lab.sql(current, "select pg_is_in_recovery()") == "f":
            return str(current)
        return None

    try:
        return wait_for(
            promoted, what=f"a new primary instead of {old}", timeout=timeout, interval=0.5
        )
    except Timeout as timeout_error:
        raise Timeout(f"{timeout_error}\n{lab.diagnose('new-primary')}") from None


def _tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as error:
        return [f"(unreadable: {error})"]


def verdict(lab: Lab, writer: Writer, fault: str) -> str:
    """After healing: the checks every fault must pass. Returns the primary."""
    primary, _standby = healthy(lab)
    for pod in (f"{NAME}-{i}" for i in range(REPLICAS)):
        wait_for(
            lambda pod=pod: writer.missing_on(lab.real, lab.ns, pod) == set(),
            what=f"every acknowledged write of {fault} on {pod}",
            timeout=60,
            interval=1,
        )
    servers = writer.servers()
    assert len(servers) == len(set(servers)), f"{fault}: writes acknowledged by {servers}"
    # A failover record the operator wrote is Patroni's to clear once the standby took the
    # lock: one left behind would hand the cluster over again later.
    wait_for(
        lambda: not _failover_request(lab),
        what=f"Patroni to clear its failover record after {fault}",
        timeout=30,
    )
    print(f"{fault}: write downtime {writer.longest_gap():.2f}s; acknowledged by {servers}")
    return primary


def _failover_request(lab: Lab) -> dict[str, str]:
    """The from and to of a failover Patroni's ``NAME-failover`` record still asks for."""
    try:
        record = lab.client.get(ConfigMap, f"{NAME}-failover", namespace=lab.ns)
    except ApiError as error:
        if error.status.code == 404:
            return {}  # never written
        raise
    found = (record.metadata.annotations if record.metadata else None) or {}
    return {k: v for k, v in found.items() if k in ("leader", "member") and v}


Heal = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class Fault:
    """One entry of the fault matrix: ``inject(lab, primary, standby)`` breaks something and
    returns how to heal it (None when the cluster heals itself); ``failover`` is True when a
    new primary must appear, False when the primary must stay, None when either is right."""

    name: str
    inject: Callable[[Lab, str, str], Heal | None]
    failover: bool | None
    method: str = "Priority"
    """The cluster's ``spec.synchronous.method`` for this fault (set before it is injected)."""


def _kill_in(lab: Lab, pod: str, process: str) -> None:
    pid = wait_for(
        lambda: instance_processes(lab.ns, pod).get(process),
        what=f"{process} of {pod}",
    )
    kill(pid)


def _postgres_kill(lab: Lab, primary: str, _standby: str) -> Heal | None:
    _kill_in(lab, primary, "postmaster")
    return None


def _patroni_kill(lab: Lab, primary: str, _standby: str) -> Heal | None:
    # The container ends with Patroni (its PID 1 supervises it): PostgreSQL dies with it and
    # the kubelet restarts the container. The operator may release the lock (the container
    # terminated after the last renewal) so the standby takes over; otherwise the restarted
    # Patroni resumes.
    _kill_in(lab, primary, "patroni")
    return None


def _patroni_crash_loop(lab: Lab, primary: str, _standby: str) -> Heal | None:
    # Killed again each time the kubelet restarts it, until the kubelet backs off: the
    # container then waits, terminated after its last lock renewal, and the operator
    # releases the lock instead of waiting out the ttl and the backoff.
    for _attempt in range(6):
        pid = wait_for(
            lambda: instance_processes(lab.ns, primary).get("patroni"),
            what=f"Patroni of {primary} (restarted)",
            timeout=60,
        )
        kill(pid)
        waiting = wait_for(
            lambda pid=pid: _container_waiting(lab, primary, pid),
            what=f"{primary}'s container to restart or back off",
            timeout=60,
        )
        if waiting == "CrashLoopBackOff":
            return None
    raise AssertionError(f"{primary}'s container never backed off")


def _container_waiting(lab: Lab, pod: str, killed: int) -> str | None:
    """ "CrashLoopBackOff" once the kubelet backs off; "restarted" once a new Patroni runs."""
    for status in lab.pod(pod).status.containerStatuses or []:  # type: ignore[union-attr]
        waiting = status.state.waiting if status.state else None
        if waiting is not None and waiting.reason == "CrashLoopBackOff":
            return "CrashLoopBackOff"
    current = instance_processes(lab.ns, pod).get("patroni")
    return "restarted" if current is not None and current != killed else None


def oom_kills(pid: int) -> int:
    """How many processes the kernel's OOM killer has killed in ``pid``'s container."""
    container = _cgroup(pid)
    text = Path(f"/sys/fs/cgroup/memory{container}/memory.oom_control").read_text()
    return int(dict(line.split() for line in text.splitlines()).get("oom_kill", "0"))


def _oom(lab: Lab, primary: str, _standby: str) -> Heal | None:
    # A query that sorts in memory past the container's limit: the kernel kills the backend
    # (the largest process of the cgroup), and the postmaster, seeing a child killed,
    # restarts every backend and recovers from its WAL. This is how PostgreSQL meets its
    # memory limit in a pod; the container itself stays.
    patroni = wait_for(
        lambda: instance_processes(lab.ns, primary).get("patroni"), what=f"Patroni of {primary}"
    )
    before = oom_kills(patroni)
    rows = f"select g from generate_series(1, {OOM_ROWS}) g order by g desc"  # noqa: S608 - a constant
    hog = f"set work_mem = '4GB'; select count(*) from ({rows}) s"  # noqa: S608 - constants
    kubectl = [str(binaries.locate().kubectl), "exec", "-n", lab.ns, primary, "--"]
    subprocess.run(
        [*kubectl, "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-c", hog],
        env={**os.environ, "KUBECONFIG": str(lab.real.kubeconfig)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert oom_kills(patroni) > before, f"no OOM kill in {primary}'s container"
    return None


def _pod_delete(lab: Lab, primary: str, _standby: str) -> Heal | None:
    lab.client.delete(Pod, primary, namespace=lab.ns)
    return None


def _node_stop(lab: Lab, primary: str, _standby: str) -> Heal | None:
    node = lab.node_of(primary)
    lab.real.node_stop(node)
    # What a fencing agent (or an administrator) does once the node is known to be off.
    lab.real.node_out_of_service(node)
    return lambda: lab.real.node_start(node)


def _node_freeze(lab: Lab, primary: str, _standby: str) -> Heal | None:
    # Frozen, the old primary still believes it leads; thawed, it finds another leader,
    # demotes and rejoins (pg_rewind), acknowledging nothing in between: its synchronous
    # standby is the new primary.
    node = lab.node_of(primary)
    lab.real.node_freeze(node)
    return lambda: lab.real.node_thaw(node)


def _node_partition(lab: Lab, primary: str, _standby: str) -> Heal | None:
    node_name, address = lab.node_of(primary), lab.ip(primary)
    lab.real.node_partition(node_name)

    def heal() -> None:
        # Still cut off, the old primary reaches neither the API server nor its members:
        # Patroni demotes it (failsafe mode keeps a primary only while it reaches them all).
        # Seen from inside its node, where it is still reachable, it refuses writes.
        node = lab.real.node(node_name)
        dsn = f"host={address} port=5432 dbname=app user=app sslmode=require connect_timeout=2"
        password = lab.password("app")
        wait_for(
            lambda: sql_in_node(node, dsn, password, "select pg_is_in_recovery()") == "t",
            what="the partitioned primary to demote itself",
            timeout=90,
            interval=1,
        )
        written = sql_in_node(node, dsn, password, "create table partitioned_write (n int)")
        assert written is None, f"the partitioned old primary accepted a write: {written}"
        lab.real.node_heal(node_name)

    return heal


def _replica_node_stop(lab: Lab, _primary: str, standby: str) -> Heal | None:
    # The synchronous standby's node dies: Patroni names the other replica synchronous and
    # commits go on (synchronous mode Preferred); the primary stays where it is.
    node = lab.node_of(standby)
    lab.real.node_stop(node)
    return lambda: lab.real.node_start(node)


FAULTS: dict[str, Fault] = {
    fault.name: fault
    for fault in (
        Fault("pod-delete", _pod_delete, failover=True),
        Fault("postgres-kill", _postgres_kill, failover=None),
        Fault("patroni-kill", _patroni_kill, failover=None),
        Fault("patroni-crash-loop", _patroni_crash_loop, failover=True),
        Fault("oom", _oom, failover=None),
        Fault("node-stop", _node_stop, failover=True),
        Fault("node-freeze", _node_freeze, failover=True),
        Fault("node-partition", _node_partition, failover=True),
        Fault("replica-node-stop", _replica_node_stop, failover=False),
        Fault("replica-node-stop-quorum", _replica_node_stop, failover=False, method="Quorum"),
    )
}
"""The fault matrix the tests, the benchmark and ``make chaos`` draw from."""


def synchronous_method(lab: Lab, method: str) -> None:
    """Set the fault cluster's ``spec.synchronous.method`` (a no-op when it is set already):
    Patroni changes its synchronous replication in place, without a restart."""
    spec = get_pgc(lab.client, NAME, lab.ns)["spec"]
    if (spec.get("synchronous") or {}).get("method", "Priority") != method:
        lab.client.patch(
            PostgresClusterResource, NAME, {"spec": {"synchronous": {"method": method}}},
            namespace=lab.ns, patch_type=PatchType.MERGE,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Outcome:
    fault: str
    old: str
    primary: str
    downtime: float
    servers: list[str]
    promoted_after: float | None = None
    """Seconds from the fault to status.primaryPod naming a new primary that takes writes."""


def run_fault(lab: Lab, fault: Fault) -> Outcome:
    """From a healthy cluster, with a writer running: inject, wait for the expected new
    primary and for writes to flow, heal, and pass :func:`verdict`."""
    synchronous_method(lab, fault.method)
    old, standby = healthy(lab)
    table = f"w_{fault.name.replace('-', '_')}_{int(time.time())}"
    promoted_after = None
    with Writer(lab.client, lab.ns, NAME, table=table) as writer:
        injected = time.monotonic()
        heal = fault.inject(lab, old, standby)
        try:
            if fault.failover:
                new_primary(lab, old)
                promoted_after = time.monotonic() - injected
            writer.wait_acks(20, timeout=180)
        finally:
            # Healed whatever happened: the next fault needs every node back.
            if heal is not None:
                heal()
        writer.wait_acks(5)
    primary = verdict(lab, writer, fault.name)
    if fault.failover is False:
        assert primary == old, f"{fault.name}: the primary moved from {old} to {primary}"
    return Outcome(fault.name, old, primary, writer.longest_gap(), writer.servers(), promoted_after)
