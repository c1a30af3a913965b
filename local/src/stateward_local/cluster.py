"""The embedded local cluster: a real Kubernetes control plane as processes on this machine.

``up`` starts etcd, kube-apiserver and, unless asked for the API server alone, the
controller-manager, the scheduler, kwok with a few simulated nodes and, when asked, real
nodes that run containers (``nodes``). Every process is
recorded in ``state.json`` with its pid and its kernel start time, so ``down`` stops exactly
what ``up`` started (by pid, never by name) and a recycled pid is never mistaken for ours.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import ssl
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from stateward_local import binaries
from stateward_local.controlplane import components, processes
from stateward_local.controlplane.components import Ports
from stateward_local.controlplane.processes import ProcessRecord, ProcessStatus
from stateward_local.errors import LocalClusterError
from stateward_local.images import cache, catalog, nodestore, oci
from stateward_local.nodes import daemons, host, layout, lifecycle, packages
from stateward_local.services import objectstore, provisioner

DEFAULT_PORT_BASE = 16443
DEFAULT_REAL_NODES = 3
STARTING_LOCK = "up.lock"
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy")
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
"""Kubernetes' non-graceful node shutdown taint (``local node out-of-service``)."""

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """What to run and where its state lives."""

    state_dir: Path
    ports: Ports
    controllers: bool = True
    kwok_nodes: int = 3
    real_nodes: int = 0
    """Nodes that run containers (kubelet, containerd, kube-proxy); 0 = kwok only."""
    slot: layout.Slot = dataclasses.field(default_factory=layout.Slot)
    """Where the real nodes sit on the host (``layout.Slot``): clusters with real nodes in
    different slots run side by side."""
    kwok_stages: Callable[[str], str] | None = None
    """Rewrites kwok's stage set (YAML) before kwok loads it: how tests and benchmarks add
    simulations the product must never contain (Patroni's role labels on kwok pods)."""

    @classmethod
    def default(
        cls,
        *,
        state_dir: Path | None = None,
        port_base: int | None = None,
        real_nodes: int | None = None,
        slot: int | None = None,
    ) -> Config:
        base = port_base or int(os.environ.get("STATEWARD_LOCAL_PORT_BASE", DEFAULT_PORT_BASE))
        directory = state_dir or Path(os.environ.get("STATEWARD_LOCAL_DIR", ".stateward/local"))
        if real_nodes is None:
            real_nodes = int(os.environ.get("STATEWARD_LOCAL_NODES", DEFAULT_REAL_NODES))
        if slot is None:
            slot = int(os.environ.get("STATEWARD_LOCAL_SLOT", 0))
        return cls(
            state_dir=directory.resolve(),
            ports=Ports.from_base(base),
            real_nodes=real_nodes,
            slot=layout.Slot(slot),
        )


class LocalCluster:
    """One local control plane rooted at ``config.state_dir``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = config.state_dir
        self.plane = components.Plane(
            config.state_dir, config.ports, config.real_nodes, config.slot
        )
        self.kubeconfig = self.plane.kubeconfig
        self.pki_dir = self.plane.pki_dir
        self.state_file = self.state_dir / "state.json"
        self.audit_log = self.plane.audit_log
        self.journal = host.Journal(self.state_dir / "host.json")

    # --- public verbs -------------------------------------------------------------------

    def up(self, *, progress: Progress = _stderr) -> None:
        """Start everything and return once the cluster is ready, or leave nothing behind."""
        self._refuse_if_present()
        ports = self.config.ports
        taken = [
            f"{name} ({port})"
            for name, port in dataclasses.asdict(ports).items()
            if (self.config.controllers or name in ("apiserver", "etcd_client", "etcd_peer"))
            and processes.port_taken(port)
        ]
        if taken:
            raise LocalClusterError(
                f"ports already in use: {', '.join(taken)}; free them or pick another range with"
                " --port-base / STATEWARD_LOCAL_PORT_BASE"
            )
        real = self.real_nodes()
        if real:
            if os.geteuid() != 0:
                raise LocalClusterError(
                    "real nodes need root (namespaces, cgroups, a bridge): run as root, or"
                    " start a kwok-only cluster with --nodes 0"
                )
            packages.ensure_packages(progress=progress)
            self._undo_crashed_owner(progress)
            host.refuse_if_taken(self.config.slot)
        paths = binaries.ensure(progress=progress)
        archives = [a for a in cache.ensure(progress=progress) if a.spec.on_nodes] if real else []
        started = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        starting = self._hold_starting_lock()
        records: list[ProcessRecord] = []
        try:
            components.write_identities(self.plane)
            self._write_image_pins(archives)
            if real:
                self._save(records)
                store = self._node_store(archives, paths, progress)
                for node in real:  # before prepare_host: links cannot cross its mount
                    self._seed_node(node, store)
                host.prepare_host(self.journal, self.state_dir, self.config.slot)
                for node in real:
                    lifecycle.create_node(self.journal, node)
                    if node is real[0]:
                        # The host reaches Services through the first node's kube-proxy.
                        host.add_route(self.journal, node.slot.service_cidr, node)
                    self._write_node_files(node, paths)
                    records.append(
                        self._start(
                            f"{node.name}.containerd", self._node_argv(node, "containerd", paths)
                        )
                    )
                    self._save(records)
            records.append(self._start("etcd", self._etcd_argv(paths)))
            self._save(records)
            self._wait("etcd healthy", self._etcd_healthy, records)
            records.append(self._start("kube-apiserver", self._apiserver_argv(paths)))
            self._save(records)
            self._wait("kube-apiserver ready", self._apiserver_ready, records)
            if self.config.controllers:
                for name, argv in (
                    ("kube-controller-manager", self._controller_manager_argv(paths)),
                    ("kube-scheduler", self._scheduler_argv(paths)),
                ):
                    records.append(self._start(name, argv))
                self._save(records)
                self._create_nodes_and_storage()
                records.append(self._start("kwok", self._kwok_argv(paths)))
                self._save(records)
                if real:
                    for name, argv in (
                        ("coredns", self._coredns_argv(paths)),
                        ("provisioner", self._provisioner_argv()),
                        ("netpol", self._netpol_argv()),
                    ):
                        records.append(self._start(name, argv))
                    records.append(self._start_objectstore(paths))
                    host.record_sysctls(self.journal, layout.KERNEL_TUNABLES)
                    for node in real:
                        for component in ("kubelet", "kube-proxy"):
                            records.append(
                                self._start(
                                    f"{node.name}.{component}",
                                    self._node_argv(node, component, paths),
                                )
                            )
                    self._save(records)
                    self._wait("real nodes registered", self._network_nodes, records)
                self._wait(
                    f"{self.config.kwok_nodes + len(real)} nodes Ready", self._nodes_ready, records
                )
                self._wait("default service account", self._default_sa_exists, records)
                if real:
                    self._wait("object store serving", self._objectstore_ready, records)
                    self._publish_objectstore()
        except BaseException:
            self._stop(records)
            self._undo_host()
            self._remove_state(keep_logs=True)
            raise
        finally:
            os.close(starting)
        progress(f"Local cluster ready in {time.monotonic() - started:.1f}s.")
        progress(f"kubeconfig: {self.kubeconfig}")

    def down(self, *, keep: bool = False, keep_logs: bool = False) -> list[str]:
        """Stop every recorded process, undo every host change; remove the state unless
        ``keep`` (all but ``logs/`` with ``keep_logs``). Returns what stopped."""
        records = self._load()
        stopped = self._stop(records)
        problems = self._undo_host()
        if not keep:
            self._remove_state(keep_logs=keep_logs)
        if problems:
            raise LocalClusterError("could not undo every host change: " + "; ".join(problems))
        return stopped

    def status(self) -> list[ProcessStatus]:
        return [
            ProcessStatus(name=r.name, pid=r.pid, running=r.alive(), log=r.log)
            for r in self._load()
        ]

    def adopt(self, name: str, pid: int, argv: list[str], log: Path) -> None:
        """Record a process started elsewhere (the `local run` operator) so that `down`
        stops it too, even if whoever started it died."""
        start = processes.start_time(pid)
        if start is None:
            return
        records = [r for r in self._load() if r.name != name]
        records.append(ProcessRecord(name, pid, start, str(log), tuple(argv)))
        self._save(records)

    def release(self, name: str) -> None:
        """Forget a process recorded by ``adopt`` once it has stopped."""
        records = self._load()
        if any(r.name == name for r in records):
            self._save([r for r in records if r.name != name])

    def stop_component(self, name: str) -> None:
        """Stop one component (for failure drills); ``start_component`` brings it back."""
        records = self._load()
        self._stop([r for r in records if r.name == name])

    def start_component(self, name: str) -> None:
        records = self._load()
        index = next(i for i, r in enumerate(records) if r.name == name)
        if records[index].alive():
            return
        records[index] = self._start(name, list(records[index].argv))
        self._save(records)

    def running(self) -> bool:
        return any(record.alive() for record in self._load())

    # --- real nodes -----------------------------------------------------------------------

    def real_nodes(self) -> list[layout.Node]:
        """The real nodes: as recorded by a running cluster, else as configured."""
        count = self.config.real_nodes
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            count = int(json.loads(self.state_file.read_text())["real_nodes"])
        return layout.nodes_in(self.state_dir, count, self.slot)

    @property
    def slot(self) -> layout.Slot:
        """The host slot of the real nodes: as recorded by a running cluster, else as
        configured (so `down` and the node verbs need no --slot)."""
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
            return layout.Slot(int(json.loads(self.state_file.read_text())["slot"]))
        return self.config.slot

    def node(self, name: str) -> layout.Node:
        found = {node.name: node for node in self.real_nodes()}
        if name not in found:
            known = ", ".join(found) or "none (this cluster has no real nodes)"
            raise LocalClusterError(f"no real node {name!r}; the real nodes are: {known}")
        return found[name]

    def node_stop(self, name: str) -> None:
        """Power loss: the node's link goes down and all its processes die at once."""
        lifecycle.power_off(self.node(name))

    def node_start(self, name: str) -> None:
        """Power on after ``node_stop`` (or bring back components that died)."""
        node = self.node(name)
        if lifecycle.frozen(node):
            lifecycle.set_frozen(node, frozen=False)
        if not host.is_mountpoint(node.mount_ns):
            lifecycle.create_mount_ns(self.journal, node)
        lifecycle.set_link(node, up=True)
        for component in NODE_COMPONENTS:
            self.start_component(f"{node.name}.{component}")
            if component == "containerd":
                self._wait_containerd(node)
        self._set_out_of_service(node.name, marked=False)

    def node_out_of_service(self, name: str) -> None:
        """Mark a stopped node out of service (``node.kubernetes.io/out-of-service``), as a
        fencing agent or an administrator does once a node is known to be off: Kubernetes
        then deletes its pods and detaches its volumes, and Stateward fails a primary on it
        over at once. Refused for a node that is not stopped, since the mark asserts that
        nothing on the node can run; ``node start`` removes it."""
        node = self.node(name)
        state = dict((n.name, s) for n, s in self.node_states())[node.name]
        if state != "stopped":
            raise LocalClusterError(
                f"{name} is {state}: only a stopped node may be marked out of service"
                f" (the mark asserts nothing on it can run); run `stateward local node stop {name}`"
                " first"
            )
        self._set_out_of_service(node.name, marked=True)

    def _set_out_of_service(self, name: str, *, marked: bool) -> None:
        with self.http_client() as client:
            path = f"/api/v1/nodes/{name}"
            for _attempt in range(5):
                found = client.get(path)
                found.raise_for_status()
                body = found.json()
                taints = [t for t in body["spec"].get("taints") or [] if t["key"] != OUT_OF_SERVICE]
                if marked:
                    taints.append(
                        {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}
                    )
                elif len(taints) == len(body["spec"].get("taints") or []):
                    return
                patch = {
                    "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                    "spec": {"taints": taints},
                }
                response = client.patch(
                    path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
                )
                if response.status_code != 409:
                    response.raise_for_status()
                    return
            raise LocalClusterError(f"could not update the taints of {name}: kept conflicting")

    def node_freeze(self, name: str) -> None:
        """A hung node: every process of it stopped by the cgroup freezer."""
        lifecycle.set_frozen(self.node(name), frozen=True)

    def node_thaw(self, name: str) -> None:
        lifecycle.set_frozen(self.node(name), frozen=False)

    def node_partition(self, name: str) -> None:
        """The node's link is cut; its processes keep running, unable to reach anyone."""
        lifecycle.set_link(self.node(name), up=False)

    def node_heal(self, name: str) -> None:
        lifecycle.set_link(self.node(name), up=True)

    def node_states(self) -> list[tuple[layout.Node, str]]:
        states: list[tuple[layout.Node, str]] = []
        alive = {record.name for record in self._load() if record.alive()}
        for node in self.real_nodes():
            running = [c for c in NODE_COMPONENTS if f"{node.name}.{c}" in alive]
            if not running:
                state = "stopped"
            elif lifecycle.frozen(node):
                state = "frozen"
            elif not lifecycle.link_up(node):
                state = "partitioned"
            elif len(running) < len(NODE_COMPONENTS):
                state = "degraded"
            else:
                state = "running"
            states.append((node, state))
        return states

    def _undo_host(self) -> list[str]:
        return host.undo(self.journal, self.state_dir) if self.journal.path.exists() else []

    def _write_node_files(self, node: layout.Node, paths: binaries.Binaries) -> None:
        ca = self.pki_dir / "ca.crt"
        resolv = node.directory / "resolv.conf"
        resolv.write_text(f"nameserver {node.slot.host_ip}\n")
        (node.directory / "containerd.toml").write_text(
            daemons.containerd_config(
                node, cni_bin_dir=paths.cni_bin_dir, sandbox_image=catalog.PAUSE_REF
            )
        )
        (node.directory / "kubelet.yaml").write_text(
            yaml.safe_dump(daemons.kubelet_config(node, ca_file=ca, resolv_conf=resolv))
        )
        (node.directory / "kube-proxy.yaml").write_text(
            yaml.safe_dump(
                daemons.kube_proxy_config(node, kubeconfig=self.state_dir / "kube-proxy.kubeconfig")
            )
        )

    def _node_argv(self, node: layout.Node, component: str, paths: binaries.Binaries) -> list[str]:
        if component == "containerd":
            argv = [str(paths.containerd), f"--config={node.directory / 'containerd.toml'}"]
        elif component == "kubelet":
            argv = daemons.kubelet_argv(
                node,
                kubelet=paths.kubelet,
                config=node.directory / "kubelet.yaml",
                kubeconfig=self.state_dir / f"kubelet-{node.name}.kubeconfig",
                labels={layout.NODE_TYPE_LABEL: "real"},
            )
        else:
            argv = [str(paths.kube_proxy), f"--config={node.directory / 'kube-proxy.yaml'}"]
        return lifecycle.wrap(node, argv, path_dirs=(paths.containerd.parent,))

    def _wait_containerd(self, node: layout.Node, timeout: float = 60) -> Path:
        name = f"{node.name}.containerd"
        record = next((r for r in self._load() if r.name == name), None)
        if record is None:
            raise LocalClusterError(f"{name} is not recorded in {self.state_file}")
        socket_path = lifecycle.containerd_socket(record.pid)
        deadline = time.monotonic() + timeout
        while not socket_path.exists():
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"containerd on {node.name} did not start within {timeout:.0f}s; see"
                    f" {self.state_dir / 'logs' / (node.name + '.containerd.log')}"
                )
            time.sleep(0.1)
        return socket_path

    def _node_store(
        self, archives: list[catalog.Archive], paths: binaries.Binaries, progress: Progress
    ) -> Path:
        """The containerd root every real node starts from (``nodestore``)."""
        return nodestore.ensure(archives, paths, progress=progress)

    def _seed_node(self, node: layout.Node, store: Path) -> None:
        """The node's containerd root, as a copy of the store: its images, already unpacked."""
        nodestore.seed(store, node.path("containerd"))

    def _network_nodes(self) -> bool:
        """Once a real node has its pod CIDR, give it a CNI config and the host a route."""
        done = 0
        with self.http_client() as client:
            for node in self.real_nodes():
                conflist = node.path("cni-config") / "10-stateward.conflist"
                if conflist.exists():
                    done += 1
                    continue
                response = client.get(f"/api/v1/nodes/{node.name}")
                cidr = (
                    response.json().get("spec", {}).get("podCIDR") if response.is_success else None
                )
                if not cidr:
                    continue
                host.add_route(self.journal, cidr, node)
                temporary = conflist.with_suffix(".tmp")
                temporary.write_text(json.dumps(daemons.cni_conflist(cidr), indent=2))
                temporary.replace(conflist)
                done += 1
        return done == len(self.real_nodes())

    def _coredns_argv(self, paths: binaries.Binaries) -> list[str]:
        corefile = self.state_dir / "Corefile"
        corefile.write_text(
            daemons.corefile(self.state_dir / "coredns.kubeconfig", self.config.slot)
        )
        return [str(paths.coredns), "-conf", str(corefile)]

    @property
    def objectstore_dir(self) -> Path:
        """The object store's buckets (one directory each) and credentials."""
        return self.state_dir / "objectstore"

    def _start_objectstore(self, paths: binaries.Binaries) -> ProcessRecord:
        root = self.objectstore_dir / "data"
        (root / objectstore.BUCKET).mkdir(parents=True, exist_ok=True)
        credentials = objectstore.Credentials.generate()
        credentials.save(self.objectstore_dir / "credentials.json")
        argv = objectstore.argv(
            paths.versitygw,
            root=root,
            cert=self.pki_dir / "objectstore.crt",
            key=self.pki_dir / "objectstore.key",
            slot=self.config.slot,
        )
        return self._start("objectstore", argv, env=credentials.environment())

    def _objectstore_ready(self) -> bool:
        url = f"https://{self.config.slot.host_ip}:{objectstore.PORT}/"
        with httpx.Client(verify=ssl.create_default_context(cafile=self.pki_dir / "ca.crt")) as c:
            # Anonymous: refused (403) once it serves, which is all this asks.
            return c.get(url, timeout=2).status_code in (403, 200)

    def _publish_objectstore(self) -> None:
        credentials = objectstore.Credentials.load(self.objectstore_dir / "credentials.json")
        with self.http_client() as client:
            namespace = objectstore.SERVICE_NAMESPACE
            components.create(
                client, f"/api/v1/namespaces/{namespace}/services", objectstore.service()
            )
            components.create(
                client,
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                objectstore.endpoint_slice(self.config.slot),
            )
            components.create(
                client,
                f"/api/v1/namespaces/{objectstore.SECRET_NAMESPACE}/secrets",
                objectstore.secret(credentials, ca_pem=(self.pki_dir / "ca.crt").read_text()),
            )

    def _provisioner_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "stateward_local.services.provisioner",
            f"--kubeconfig={self.state_dir / 'provisioner.kubeconfig'}",
            f"--root={self.state_dir / 'volumes'}",
        ]

    @property
    def image_pins_file(self) -> Path:
        return self.state_dir / "image-pins.json"

    def _write_image_pins(self, archives: list[catalog.Archive]) -> None:
        pins = {a.ref: oci.manifest_digest(a.path) for a in archives}
        self.image_pins_file.write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")

    def image_pins(self) -> dict[str, str]:
        """``REPOSITORY:TAG`` to the digest of every image the real nodes hold (none without
        real nodes): what the operator runs them by (``--pin-image``)."""
        try:
            pins: dict[str, str] = json.loads(self.image_pins_file.read_text())
        except FileNotFoundError:
            return {}
        return pins

    def _netpol_argv(self) -> list[str]:
        """The NetworkPolicy enforcer of the real nodes (what a policy-enforcing CNI does)."""
        return [
            sys.executable,
            "-m",
            "stateward_local.services.netpol",
            f"--kubeconfig={self.state_dir / 'netpol.kubeconfig'}",
            f"--state-dir={self.state_dir}",
            f"--nodes={self.config.real_nodes}",
            f"--slot={self.config.slot.number}",
        ]

    # --- state ----------------------------------------------------------------------------

    def _load(self) -> list[ProcessRecord]:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return []
        return [
            ProcessRecord(**{**entry, "argv": tuple(entry.get("argv", ()))})
            for entry in data.get("processes", [])
        ]

    def _save(self, records: list[ProcessRecord]) -> None:
        payload = {
            "ports": dataclasses.asdict(self.config.ports),
            "real_nodes": len(self.real_nodes()),
            "slot": self.slot.number,
            "processes": [dataclasses.asdict(r) for r in records],
        }
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(payload, indent=2))
        temporary.replace(self.state_file)

    def _hold_starting_lock(self) -> int:
        """Held (as an open descriptor) while ``up`` runs, so that another ``up`` never takes
        this cluster for a crashed one in the moment it has a bridge and no process yet."""
        fd = os.open(self.state_dir / STARTING_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _starting(self) -> bool:
        try:
            fd = os.open(self.state_dir / STARTING_LOCK, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def _undo_crashed_owner(self, progress: Progress) -> None:
        """A cluster with real nodes that died without ``down`` (killed with its session, its
        machine's processes ended) leaves the bridge, routes, mounts and sysctls behind, and
        its journal of them. When nothing of it runs and no ``up`` is starting it, undo them
        from that journal instead of refusing: the next ``up`` after a crash just works."""
        owner = host.bridge_owner(self.config.slot)
        if owner is None or owner == self.state_dir:
            return
        crashed = LocalCluster(dataclasses.replace(self.config, state_dir=owner))
        if not crashed.journal.path.exists() or crashed.running() or crashed._starting():
            return
        progress(f"Undoing what a local cluster that crashed left on this host ({owner})")
        crashed.down()

    def _refuse_if_present(self) -> None:
        records = self._load()
        alive = [r for r in records if r.alive()]
        if alive:
            raise LocalClusterError(
                f"a local cluster is already running from {self.state_dir}"
                f" ({', '.join(f'{r.name} pid {r.pid}' for r in alive)});"
                " use it, or stop it with `stateward local down`"
            )
        leftovers = [p for p in self.state_dir.glob("*") if p.name != "logs"]
        if leftovers:
            raise LocalClusterError(
                f"stale state in {self.state_dir} from a run that did not stop cleanly (nothing"
                " of it is running); remove it with `stateward local down`, then `up` again"
            )

    def _remove_state(self, *, keep_logs: bool) -> None:
        """Delete the state; a failed ``up`` keeps ``logs/`` so its error can be read."""
        if not self.state_dir.exists():
            return
        for entry in self.state_dir.iterdir():
            if keep_logs and entry.name == "logs":
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        if not keep_logs:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # --- processes ------------------------------------------------------------------------

    def _start(
        self, name: str, argv: list[str], *, env: dict[str, str] | None = None
    ) -> ProcessRecord:
        return processes.start(self.state_dir, name, argv, env=env)

    def _stop(self, records: list[ProcessRecord], timeout: float = 15.0) -> list[str]:
        return processes.stop(records, timeout)

    def _wait(
        self,
        what: str,
        check: Callable[[], bool],
        records: list[ProcessRecord],
        timeout: float = 120.0,
    ) -> None:
        processes.wait(what, check, records, timeout)

    # --- the control plane's command lines (methods, so that a benchmark can adjust one)

    def _etcd_argv(self, paths: binaries.Binaries) -> list[str]:
        return components.etcd_argv(self.plane, paths)

    def _apiserver_argv(self, paths: binaries.Binaries) -> list[str]:
        return components.apiserver_argv(self.plane, paths)

    def _controller_manager_argv(self, paths: binaries.Binaries) -> list[str]:
        return components.controller_manager_argv(self.plane, paths)

    def _scheduler_argv(self, paths: binaries.Binaries) -> list[str]:
        return components.scheduler_argv(self.plane, paths)

    def _kwok_argv(self, paths: binaries.Binaries) -> list[str]:
        return components.kwok_argv(self.plane, paths, self.config.kwok_stages)

    # --- API calls during bring-up ----------------------------------------------------------

    @contextlib.contextmanager
    def http_client(self) -> Iterator[httpx.Client]:
        context = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        context.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        with httpx.Client(
            base_url=f"https://127.0.0.1:{self.config.ports.apiserver}", verify=context, timeout=5
        ) as client:
            yield client

    def _etcd_healthy(self) -> bool:
        response = httpx.get(f"http://127.0.0.1:{self.config.ports.etcd_client}/health", timeout=2)
        return response.status_code == 200 and bool(response.json().get("health") == "true")

    def _apiserver_ready(self) -> bool:
        with self.http_client() as client:
            return client.get("/readyz").status_code == 200

    def _nodes_ready(self) -> bool:
        """Every node Ready; real nodes also rid of the not-ready taint, so the next pod
        created can schedule on them."""
        with self.http_client() as client:
            found = client.get("/api/v1/nodes").json().get("items", [])
        real = {node.name for node in self.real_nodes()}
        ready = [
            n
            for n in found
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
            and not (n["metadata"]["name"] in real and n.get("spec", {}).get("taints"))
        ]
        return len(ready) >= self.config.kwok_nodes + len(real)

    def _default_sa_exists(self) -> bool:
        with self.http_client() as client:
            return client.get("/api/v1/namespaces/default/serviceaccounts/default").is_success

    def _create_nodes_and_storage(self) -> None:
        real = bool(self.config.real_nodes)
        with self.http_client() as client:
            storage_class: dict[str, Any] = {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": components.STORAGE_CLASS,
                    "annotations": {
                        "storageclass.kubernetes.io/is-default-class": str(not real).lower()
                    },
                },
                "provisioner": "kwok.x-k8s.io/volume",
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
                "allowVolumeExpansion": True,
            }
            components.create(client, "/apis/storage.k8s.io/v1/storageclasses", storage_class)
            if real:
                components.create(
                    client,
                    "/apis/storage.k8s.io/v1/storageclasses",
                    provisioner.storage_class(default=True),
                )
            for index in range(self.config.kwok_nodes):
                components.create(
                    client,
                    "/api/v1/nodes",
                    components.kwok_node(f"kwok-node-{index}", tainted=real),
                )
