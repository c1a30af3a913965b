"""Configuration of a node's components (pure): containerd, the kubelet, kube-proxy, the CNI
conflist, CoreDNS's Corefile.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateward_local.nodes.layout import CLUSTER_DOMAIN, CONTAINERD_SOCKET

if TYPE_CHECKING:
    from stateward_local.nodes.layout import Node, Slot


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
        "cgroupRoot": f"/{node.slot.cgroup_parent}/{node.name}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [node.slot.host_ip],
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
        "clusterCIDR": node.slot.pod_cidr,
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


def corefile(kubeconfig: Path, slot: Slot) -> str:
    """Cluster DNS served from the host's bridge address; it answers only for the cluster."""
    return f"""\
.:53 {{
    bind {slot.host_ip}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""
