"""What a real node is: its name, index, address on the bridge and state directory, and the
fixed facts every part shares (the bridge, the CIDRs, the paths the components hard-code).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

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
