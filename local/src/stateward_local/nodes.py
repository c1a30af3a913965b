"""Real nodes: a kubelet, containerd and kube-proxy per node, each node in its own namespaces.

A node is what a kind node is without Docker: a network namespace with one veth into the
host bridge ``stw0`` (its own IP), a mount namespace in which the paths the components
hard-code (``/var/lib/kubelet``, ``/run/containerd``, ``/var/lib/cni``, ``/etc/cni/net.d``,
``/var/log/pods``, ``/run/netns``) are bind mounts of the node's own state directories, and a
cgroup subtree ``/stateward/NODE`` in every hierarchy that holds the node's daemons and, as the
kubelet's ``cgroupRoot``, its pods. Both namespaces are persistent: their files are bind
mounted under ``STATE/nodes/NODE/ns``, so the node outlives any one of its processes.

Routing lives on the host: each node's default route is the bridge address, and the host
routes each node's pod CIDR to the node's IP, so pods on different nodes, the host and the
API server reach each other. Forwarding from the bridge to anywhere else is dropped by our
own nftables table: nothing a pod sends leaves the machine.

Every change to the host is written to a journal *before* it is made, so ``down`` can undo
exactly what ``up`` did, even after a crash that left no process running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stateward_local.errors import LocalClusterError

BRIDGE = "stw0"
NETWORK = ipaddress.ip_network("10.250.0.0/24")
HOST_IP = "10.250.0.1"
"""The host's address on the bridge: API server, CoreDNS and the nodes' gateway."""
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
NFT_TABLE = "stateward"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "stateward"
NODE_TYPE_LABEL = "stateward.io/node-type"
"""``real`` on the nodes that run processes; kwok's simulated nodes carry ``kwok``."""
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
"""Simulated nodes carry this taint whenever real nodes exist: only pods that tolerate it
(scale tests, the benchmark) land on nodes where nothing runs."""
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KERNEL_TUNABLES = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
"""Machine-wide sysctls the kubelet sets at start; recorded first and restored by ``down``."""

# Paths the components hard-code, each bound to a directory of the node's own.
BIND_TARGETS = {
    "kubelet": "/var/lib/kubelet",
    "pod-logs": "/var/log/pods",
    "container-logs": "/var/log/containers",
    "cni-state": "/var/lib/cni",
    "cni-config": "/etc/cni/net.d",
}
# Runtime state (sockets, task state, pod network namespaces): a tmpfs of the node's mount
# namespace, gone with it at power loss as /run is at a real reboot.
TMPFS_TARGETS = ("/run/containerd", "/run/netns")


@dataclasses.dataclass(frozen=True)
class Node:
    """One real node: its name, index on the bridge and state directory."""

    name: str
    index: int
    directory: Path

    @property
    def ip(self) -> str:
        return str(NETWORK.network_address + 10 + self.index)

    @property
    def veth(self) -> str:
        """The host end of the node's link (the node end is ``eth0``)."""
        return f"stwv{self.index}"

    @property
    def net_ns(self) -> Path:
        return self.directory / "ns" / "net"

    @property
    def mount_ns(self) -> Path:
        return self.directory / "ns" / "mnt"

    def path(self, key: str) -> Path:
        return self.directory / key


def node_names(count: int) -> list[str]:
    return [f"node-{index}" for index in range(1, count + 1)]


def nodes_in(state_dir: Path, count: int) -> list[Node]:
    return [
        Node(name, index, state_dir / "nodes" / name)
        for index, name in enumerate(node_names(count), start=1)
    ]


# --- the journal of host changes ----------------------------------------------------------


class Journal:
    """Host changes in the order they were made; ``undo`` reverts them newest first."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        try:
            loaded: list[dict[str, Any]] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        return loaded

    def record(self, **entry: Any) -> None:
        entries = self.entries()
        if entry in entries:
            return
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps([*entries, entry], indent=1))
        temporary.replace(self.path)

    def undo(self) -> list[str]:
        """Revert every recorded change; failures are collected, not fatal."""
        problems: list[str] = []
        for entry in reversed(self.entries()):
            try:
                _undo(entry)
            except (OSError, subprocess.CalledProcessError, LocalClusterError) as error:
                problems.append(f"{entry}: {error}")
        self.path.unlink(missing_ok=True)
        return problems


def _undo(entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    if kind == "sysctl":
        write_sysctl(entry["key"], entry["old"])
    elif kind == "link":
        if link_exists(entry["name"]):
            run(["ip", "link", "del", entry["name"]])
    elif kind == "route":
        run(["ip", "route", "del", entry["dst"]], check=False)
    elif kind == "nft":
        run(["nft", "delete", "table", "inet", entry["table"]], check=False)
    elif kind == "mount":
        if is_mountpoint(Path(entry["target"])):
            run(["umount", "-l", entry["target"]])
    elif kind == "dir":
        with contextlib.suppress(FileNotFoundError, OSError):
            Path(entry["path"]).rmdir()
    elif kind == "cgroup":
        remove_cgroup(Path(entry["path"]))
    else:
        raise LocalClusterError(f"unknown host change {kind!r} in the journal")


# --- small host helpers --------------------------------------------------------------------


def run(argv: list[str], *, check: bool = True, input: str | None = None) -> str:
    """Run a host command; on failure raise one line with its stderr."""
    result = subprocess.run(argv, capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LocalClusterError(
            f"`{' '.join(argv)}` failed: {detail[-1] if detail else f'exit {result.returncode}'}"
        )
    return result.stdout


def in_node(node: Node, argv: list[str], *, check: bool = True) -> str:
    """Run a command inside the node's network and mount namespaces."""
    return run(
        ["nsenter", f"--net={node.net_ns}", f"--mount={node.mount_ns}", "--", *argv], check=check
    )


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def is_mountpoint(path: Path) -> bool:
    target = str(path.resolve()) if path.exists() else str(path)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == target for line in mountinfo)


def read_sysctl(key: str) -> str:
    return Path("/proc/sys", *key.split(".")).read_text().strip()


def write_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", *key.split(".")).write_text(value)


def set_sysctl(journal: Journal, key: str, value: str) -> None:
    old = read_sysctl(key)
    if old != value:
        journal.record(kind="sysctl", key=key, old=old)
        write_sysctl(key, value)


def record_sysctls(journal: Journal, keys: Iterable[str]) -> None:
    """Remember current values of sysctls someone else (the kubelet) is about to change."""
    for key in keys:
        with contextlib.suppress(OSError):
            journal.record(kind="sysctl", key=key, old=read_sysctl(key))


def make_dir(journal: Journal, path: Path) -> None:
    """Create ``path`` and each missing parent, recording each so ``down`` removes it."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        journal.record(kind="dir", path=str(directory))
        directory.mkdir()


# --- cgroups (v1 hierarchies, or the v2 unified tree) ----------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy under /sys/fs/cgroup."""
    found: list[Path] = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0] if right else ""
            target = Path(left.split()[4])
            if fstype in ("cgroup", "cgroup2") and CGROUP_ROOT in (target, *target.parents):
                found.append(target)
    return sorted(found)


def cgroup_paths(node: Node) -> list[Path]:
    return [h / CGROUP_PARENT / node.name for h in cgroup_hierarchies()]


def daemon_cgroup_procs(node: Node) -> list[Path]:
    return [path / "daemons" / "cgroup.procs" for path in cgroup_paths(node)]


def freezer_path(node: Node) -> Path | None:
    for hierarchy in cgroup_hierarchies():
        if (hierarchy / "freezer.state").exists() or hierarchy.name == "freezer":
            return hierarchy / CGROUP_PARENT / node.name
    return None


def create_cgroups(journal: Journal, node: Node) -> None:
    for hierarchy in cgroup_hierarchies():
        for relative in (CGROUP_PARENT, f"{CGROUP_PARENT}/{node.name}"):
            path = hierarchy / relative
            if not path.exists():
                journal.record(kind="cgroup", path=str(path))
                path.mkdir()
            _inherit_cpuset(path)
        daemons = hierarchy / CGROUP_PARENT / node.name / "daemons"
        daemons.mkdir(exist_ok=True)
        _inherit_cpuset(daemons)


def _inherit_cpuset(path: Path) -> None:
    for name in ("cpuset.cpus", "cpuset.mems"):
        own = path / name
        if own.exists() and not own.read_text().strip():
            own.write_text((path.parent / name).read_text())


def cgroup_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    if not root.exists():
        return pids
    for directory, _, files in os.walk(root):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                text = Path(directory, "cgroup.procs").read_text()
                pids.update(int(pid) for pid in text.split())
    return pids


def kill_cgroup(roots: Iterable[Path], *, timeout: float = 20.0) -> None:
    """SIGKILL every process under ``roots`` (frozen first, so nothing forks meanwhile)."""
    roots = list(roots)
    freezer = next((r for r in roots if (r / "freezer.state").exists()), None)
    deadline = time.monotonic() + timeout
    while True:
        pids = set().union(*(cgroup_pids(r) for r in roots)) if roots else set()
        if not pids:
            return
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")
        if time.monotonic() > deadline:
            raise LocalClusterError(f"processes {sorted(pids)} under {roots[0]} would not die")
        time.sleep(0.1)


def remove_cgroup(path: Path, *, timeout: float = 20.0) -> None:
    """Kill what runs under ``path`` and remove it with every child cgroup."""
    if not path.exists():
        return
    kill_cgroup([path])
    deadline = time.monotonic() + timeout
    while path.exists():
        for directory, _, _ in sorted(os.walk(path), key=lambda d: -len(d[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        if path.exists():
            if time.monotonic() > deadline:
                raise LocalClusterError(f"cgroup {path} could not be removed")
            time.sleep(0.1)


# --- the host side of the network --------------------------------------------------------


BRIDGE_ALIAS = "stateward local cluster "


def bridge_owner() -> Path | None:
    """The state directory of the cluster that made the bridge (from the alias it set), or
    None when there is no bridge or someone else made it."""
    alias = Path("/sys/class/net", BRIDGE, "ifalias")
    try:
        text = alias.read_text().strip()
    except OSError:
        return None
    return Path(text.removeprefix(BRIDGE_ALIAS)) if text.startswith(BRIDGE_ALIAS) else None


def refuse_if_taken() -> None:
    if link_exists(BRIDGE):
        alias = Path("/sys/class/net", BRIDGE, "ifalias")
        owner = alias.read_text().strip() if alias.exists() else ""
        raise LocalClusterError(
            f"the bridge {BRIDGE} already exists ({owner or 'owner unknown'}): another local"
            " cluster with real nodes is up; stop it with `stateward local down` (with its"
            " --state-dir), or start this one with --nodes 0; if that cluster's state directory"
            f" is gone, `ip link delete {BRIDGE}` and `nft delete table inet {NFT_TABLE}`"
            " remove what it left"
        )
    for route in run(["ip", "-4", "route", "show"]).splitlines():
        destination = route.split()[0]
        if destination == "default":
            continue
        with contextlib.suppress(ValueError):
            network = ipaddress.ip_network(destination, strict=False)
            for ours in (NETWORK, ipaddress.ip_network(POD_CIDR)):
                if network.overlaps(ours):
                    raise LocalClusterError(
                        f"the host already routes {network}, which overlaps the local"
                        f" cluster's {ours}; real nodes need that range free"
                    )


def prepare_host(journal: Journal, state_dir: Path) -> None:
    """The bridge, forwarding confined to it, and the private mount for namespace files."""
    set_sysctl(journal, "net.ipv4.ip_forward", "1")
    journal.record(kind="link", name=BRIDGE)
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "link", "set", BRIDGE, "alias", f"{BRIDGE_ALIAS}{state_dir}"])
    run(["ip", "addr", "add", f"{HOST_IP}/{NETWORK.prefixlen}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    journal.record(kind="nft", table=NFT_TABLE)
    run(["nft", "-f", "-"], input=nft_ruleset())
    nodes_dir = state_dir / "nodes"
    nodes_dir.mkdir(parents=True, exist_ok=True)
    # Namespace files may only be bind mounted under a mount that does not propagate
    # (what `ip netns` does for /run/netns): make the nodes directory such a mount.
    journal.record(kind="mount", target=str(nodes_dir))
    run(["mount", "--bind", str(nodes_dir), str(nodes_dir)])
    run(["mount", "--make-private", str(nodes_dir)])
    for target in (*BIND_TARGETS.values(), *TMPFS_TARGETS):
        make_dir(journal, Path(target))


def nft_ruleset() -> str:
    """Forward only between the bridge's own members: nothing from a pod leaves the host."""
    return f"""\
table inet {NFT_TABLE} {{
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" drop
    oifname "{BRIDGE}" iifname != "{BRIDGE}" drop
  }}
}}
"""


def create_node(journal: Journal, node: Node) -> None:
    """Namespaces, link and cgroups of a node (the processes come later)."""
    (node.directory / "ns").mkdir(parents=True, exist_ok=True)
    for key in (*BIND_TARGETS, "containerd", "logs"):
        node.path(key).mkdir(parents=True, exist_ok=True)
    node.net_ns.touch()
    journal.record(kind="mount", target=str(node.net_ns))
    run(["unshare", f"--net={node.net_ns}", "true"])
    journal.record(kind="link", name=node.veth)
    run(
        [
            "ip", "link", "add", node.veth, "type", "veth",
            "peer", "name", "eth0", "netns", str(node.net_ns),
        ]
    )  # fmt: skip
    run(["ip", "link", "set", node.veth, "master", BRIDGE, "up"])
    for argv in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{node.ip}/{NETWORK.prefixlen}", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "route", "add", "default", "via", HOST_IP],
        ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
    ):
        run(["nsenter", f"--net={node.net_ns}", "--", *argv])
    create_cgroups(journal, node)
    create_mount_ns(journal, node)


def create_mount_ns(journal: Journal, node: Node) -> None:
    """A fresh mount namespace whose hard-coded paths are the node's own directories."""
    node.mount_ns.touch()
    journal.record(kind="mount", target=str(node.mount_ns))
    run(["unshare", f"--mount={node.mount_ns}", "--propagation", "private", "true"])
    nodes_dir = node.directory.parent
    script = [
        # The copy of the host's mounts includes every node's namespace files; dropping them
        # here keeps one node's namespaces from pinning another's after it is powered off.
        f"umount -l {nodes_dir}",
        # The kubelet needs shared propagation for volume mounts; inside this namespace only.
        "mount --make-rshared /",
    ]
    for key, target in BIND_TARGETS.items():
        script.append(f"mount --bind {node.path(key)} {target}")
    for target in TMPFS_TARGETS:
        script.append(f"mount -t tmpfs -o mode=0755 tmpfs {target}")
    run(["nsenter", f"--mount={node.mount_ns}", "--", "sh", "-ec", "; ".join(script)])


def containerd_socket(pid: int) -> Path:
    """The node's containerd socket as the host sees it, through a process of the node."""
    return Path(f"/proc/{pid}/root{CONTAINERD_SOCKET}")


def destroy_mount_ns(node: Node) -> None:
    """Drop the node's mount namespace: with no process left in it, every mount in it
    (pod network namespaces, volume mounts) goes with it, as at power loss."""
    if is_mountpoint(node.mount_ns):
        run(["umount", "-l", str(node.mount_ns)])


def wrap(node: Node, argv: list[str], *, path_dirs: Iterable[Path] = ()) -> list[str]:
    """``argv`` as a node process: in the node's cgroups, then its namespaces."""
    procs = " ".join(str(p) for p in daemon_cgroup_procs(node))
    search = ":".join([*(str(d) for d in path_dirs), PATH])
    script = f'echo $$ | tee {procs} >/dev/null && export PATH={search} && exec "$@"'
    return [
        "sh",
        "-c",
        script,
        node.name,
        "nsenter",
        f"--net={node.net_ns}",
        f"--mount={node.mount_ns}",
        "--",
        *argv,
    ]


def add_route(journal: Journal, destination: str, node: Node) -> None:
    """Route ``destination`` (a node's pod CIDR, or the Service CIDR) through ``node``."""
    journal.record(kind="route", dst=destination)
    run(["ip", "route", "replace", destination, "via", node.ip, "dev", BRIDGE])


def set_link(node: Node, *, up: bool) -> None:
    run(["ip", "link", "set", node.veth, "up" if up else "down"])


def link_up(node: Node) -> bool:
    flags = Path("/sys/class/net", node.veth, "flags")
    return flags.exists() and bool(int(flags.read_text(), 16) & 1)


def set_frozen(node: Node, *, frozen: bool, timeout: float = 60.0) -> None:
    """Freeze (or thaw) every process of ``node`` and wait until the kernel says it is done.

    The v1 freezer stays FREEZING while a task sits where it cannot be frozen (in
    uninterruptible I/O, say, which a busy host makes common); writing FROZEN again retries
    them, so the request is repeated until it holds. A node that will not freeze is thawed
    again before the error, never left half frozen."""
    path = freezer_path(node)
    if path is None:
        raise LocalClusterError("no cgroup freezer on this host: `node freeze` needs one")
    state = path / "freezer.state"
    want = "FROZEN" if frozen else "THAWED"
    deadline = time.monotonic() + timeout
    retry = 0.0
    while state.read_text().strip() != want:
        now = time.monotonic()
        if now > deadline:
            if frozen:
                state.write_text("THAWED")
            raise LocalClusterError(
                f"{node.name} did not reach {want} in {timeout:.0f}s"
                f" (it is {state.read_text().strip()})"
            )
        if now >= retry:
            state.write_text(want)
            retry = now + 0.5
        time.sleep(0.05)


def frozen(node: Node) -> bool:
    path = freezer_path(node)
    return (
        path is not None
        and (path / "freezer.state").exists()
        and ((path / "freezer.state").read_text().strip() != "THAWED")
    )


def power_off(node: Node) -> None:
    """Power loss: the link goes down and every process of the node dies at once."""
    if link_exists(node.veth):
        set_link(node, up=False)
    kill_cgroup(cgroup_paths(node))
    destroy_mount_ns(node)


# --- component configuration (pure) -------------------------------------------------------


def containerd_config(node: Node, *, cni_bin_dir: Path, sandbox_image: str) -> str:
    """containerd 2.x (config version 3) for one node: its own root, CRI with CNI and runc."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = '{node.path("containerd")}'
state = '/run/containerd'

[grpc]
  address = '{CONTAINERD_SOCKET}'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{sandbox_image}'

[{cri_runtime}]
  enable_selinux = false
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below its own.
  restrict_oom_score_adj = true
  [{cri_runtime}.containerd]
    default_runtime_name = 'runc'
    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = '/usr/sbin/runc'
        SystemdCgroup = false
  [{cri_runtime}.cni]
    bin_dirs = ['{cni_bin_dir}']
    conf_dir = '/etc/cni/net.d'
    use_internal_loopback = true

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = '127.0.0.1'

# NRI listens on /var/run/nri/nri.sock, which every node's containerd would share: a second
# node's containerd then died with "address already in use". Nothing here uses NRI.
[plugins.'io.containerd.nri.v1.nri']
  disable = true
"""


def kubelet_config(node: Node, *, ca_file: Path, resolv_conf: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_PARENT}/{node.name}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [HOST_IP],
        "resolvConf": str(resolv_conf),
        # Images are imported locally and cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A development machine's disk is shared with everything else on it; do not evict
        # pods because of it. The kubelet refuses a memory threshold of 0.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
            "imagefs.inodesFree": "0%",
        },
        "serializeImagePulls": False,
        # How often the kubelet syncs each pod, and so how soon a changed Secret or ConfigMap
        # reaches the files of a volume (a renewed certificate, a new configuration): the
        # default minute, with jitter, made every rotation wait one to two minutes.
        "syncFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "nodeLeaseDurationSeconds": 20,
        "shutdownGracePeriod": "0s",
        "maxPods": 110,
    }


def kubelet_argv(
    node: Node, *, kubelet: Path, config: Path, kubeconfig: Path, labels: dict[str, str]
) -> list[str]:
    return [
        str(kubelet),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        "--v=1",
    ]


def kube_proxy_config(node: Node, *, kubeconfig: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "nftables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": node.name,
        "bindAddress": node.ip,
        "healthzBindAddress": f"{node.ip}:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Leave the kernel's conntrack settings alone: some of them are machine-wide.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def cni_conflist(pod_cidr: str) -> dict[str, Any]:
    """ptp + host-local from the node's pod CIDR (what kindnet does); routes live on the host."""
    return {
        "cniVersion": "1.0.0",
        "name": "stateward",
        "plugins": [
            {
                "type": "ptp",
                "ipMasq": False,
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": "/var/lib/cni/networks",
                },
            }
        ],
    }


def corefile(kubeconfig: Path) -> str:
    """Cluster DNS served from the host's bridge address; it answers only for the cluster."""
    return f"""\
.:53 {{
    bind {HOST_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""
