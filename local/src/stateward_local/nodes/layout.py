"""What a real node is: its name, index, address on the bridge and state directory; the slot
its cluster holds on the host (its bridge, addresses, CIDRs, nftables table and cgroup parent);
and the facts every part shares (the paths the components hard-code).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from stateward_local.errors import LocalClusterError

SLOTS = 4
"""Clusters with real nodes that fit one host side by side, each in a slot of its own."""
CLUSTER_DOMAIN = "cluster.local"
CGROUP_ROOT = Path("/sys/fs/cgroup")
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
class Slot:
    """What one cluster with real nodes holds on the host, disjoint from every other slot's:
    a bridge, the network on it, the pod and Service CIDRs routed through it, an nftables
    table and a cgroup parent. Slot 0 is the default; a second cluster takes another
    (``--slot``), so that two can run at once (the test suite's two workers do)."""

    number: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.number < SLOTS:
            raise LocalClusterError(
                f"there is no host slot {self.number}: pick one of 0 to {SLOTS - 1}"
                " (--slot, or $STATEWARD_LOCAL_SLOT)"
            )

    @property
    def bridge(self) -> str:
        return f"stw{self.number}"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.250.{self.number}.0/24")

    @property
    def host_ip(self) -> str:
        """The host's address on the bridge: API server, CoreDNS and the nodes' gateway."""
        return str(self.network.network_address + 1)

    @property
    def pod_cidr(self) -> str:
        return f"10.{244 + self.number}.0.0/16"

    @property
    def service_cidr(self) -> str:
        return f"10.{96 + self.number}.0.0/16"

    @property
    def kubernetes_service_ip(self) -> str:
        """The ``kubernetes`` Service's ClusterIP: the first address of the Service CIDR."""
        return str(ipaddress.IPv4Network(self.service_cidr).network_address + 1)

    @property
    def nft_table(self) -> str:
        return f"stateward-{self.number}"

    @property
    def cgroup_parent(self) -> str:
        return f"stateward-{self.number}"


@dataclasses.dataclass(frozen=True)
class Node:
    """One real node: its name, index on the bridge, state directory and its cluster's slot."""

    name: str
    index: int
    directory: Path
    slot: Slot = dataclasses.field(default_factory=Slot)

    @property
    def ip(self) -> str:
        return str(self.slot.network.network_address + 10 + self.index)

    @property
    def veth(self) -> str:
        """The host end of the node's link (the node end is ``eth0``)."""
        return f"{self.slot.bridge}v{self.index}"

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


def nodes_in(state_dir: Path, count: int, slot: Slot) -> list[Node]:
    return [
        Node(name, index, state_dir / "nodes" / name, slot)
        for index, name in enumerate(node_names(count), start=1)
    ]
