"""The control plane's components: etcd, kube-apiserver, the controller-manager, the
scheduler and kwok. Their command lines, their identities (one certificate and kubeconfig
each, from the cluster's own CA), the audit policy, kwok's stages and simulated nodes: pure
functions of a :class:`Plane` and the binaries, except for the files they write."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from stateward_local import binaries
from stateward_local.controlplane import pki
from stateward_local.errors import LocalClusterError
from stateward_local.nodes import layout
from stateward_local.services import objectstore

ADMIN_USER = "stateward-admin"
OPERATOR_USER = "stateward-operator"
NODE_ANNOTATION = "kwok.x-k8s.io/node"
STORAGE_CLASS = "kwok-volume"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ports:
    """Every port the local cluster listens on (all bound to 127.0.0.1)."""

    apiserver: int
    etcd_client: int
    etcd_peer: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        return cls(
            apiserver=base,
            etcd_client=base + 1,
            etcd_peer=base + 2,
            controller_manager=base + 3,
            scheduler=base + 4,
            kwok=base + 5,
        )


@dataclasses.dataclass(frozen=True)
class Plane:
    """Where one control plane keeps its state, what it listens on, and the host slot of
    its real nodes (whose addresses and CIDRs it serves)."""

    state_dir: Path
    ports: Ports
    real_nodes: int
    slot: layout.Slot = dataclasses.field(default_factory=layout.Slot)

    @property
    def pki_dir(self) -> Path:
        return self.state_dir / "pki"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig."""
        return self.state_dir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "logs" / "audit.log"


def write_identities(plane: Plane) -> None:
    """The CA, the API server's certificate, every component's identity and kubeconfig, and
    the audit policy."""
    authority = pki.Authority(plane.pki_dir)
    authority.issue(
        "apiserver",
        common_name="kube-apiserver",
        hosts=(
            "127.0.0.1",
            "localhost",
            plane.slot.kubernetes_service_ip,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            plane.slot.host_ip,
        ),
        server=True,
    )
    pki.service_account_key(plane.pki_dir / "service-account.key")
    users = {
        "admin": (ADMIN_USER, ("system:masters",)),
        # No group: the operator holds only what `stateward_local.run.grant_operator` binds
        # to it, the generated roles of config/rbac, so a missing right fails locally.
        "operator": (OPERATOR_USER, ()),
        "controller-manager": ("system:kube-controller-manager", ()),
        "scheduler": ("system:kube-scheduler", ()),
        "kwok": ("kwok-controller", ("system:masters",)),
    }
    for stem, (user, groups) in users.items():
        pair = authority.issue(stem, common_name=user, groups=groups)
        target = plane.kubeconfig if stem == "admin" else plane.state_dir / f"{stem}.kubeconfig"
        write_kubeconfig(plane, target, pair, user)
    if plane.real_nodes:
        _write_node_identities(plane, authority)
    (plane.state_dir / "audit-policy.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived"],
                "rules": [
                    {"level": "None", "verbs": ["get", "list", "watch"]},
                    {"level": "Metadata"},
                ],
            }
        )
    )


def _write_node_identities(plane: Plane, authority: pki.Authority) -> None:
    """Identities of the node components (reaching the API server over the bridge), the
    API server's client certificate for kubelets, and the host's helpers."""
    bridge = f"https://{plane.slot.host_ip}:{plane.ports.apiserver}"
    for node in layout.nodes_in(plane.state_dir, plane.real_nodes, plane.slot):
        user = f"system:node:{node.name}"
        pair = authority.issue(f"kubelet-{node.name}", common_name=user, groups=("system:nodes",))
        write_kubeconfig(
            plane, plane.state_dir / f"kubelet-{node.name}.kubeconfig", pair, user, server=bridge
        )
    authority.issue(
        "objectstore",
        common_name=objectstore.endpoint(),
        hosts=objectstore.certificate_hosts(plane.slot),
        server=True,
    )
    pair = authority.issue("kube-proxy", common_name="system:kube-proxy")
    write_kubeconfig(
        plane, plane.state_dir / "kube-proxy.kubeconfig", pair, "system:kube-proxy", server=bridge
    )
    authority.issue(
        "apiserver-kubelet-client",
        common_name="kube-apiserver-kubelet-client",
        groups=("system:masters",),
    )
    for stem, user in (
        ("coredns", "stateward-coredns"),
        ("provisioner", "stateward-provisioner"),
        ("netpol", "stateward-netpol"),
    ):
        pair = authority.issue(stem, common_name=user, groups=("system:masters",))
        write_kubeconfig(plane, plane.state_dir / f"{stem}.kubeconfig", pair, user)


def write_kubeconfig(
    plane: Plane, path: Path, pair: pki.CertPair, user: str, *, server: str | None = None
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "stateward-local",
                "cluster": {
                    "server": server or f"https://127.0.0.1:{plane.ports.apiserver}",
                    "certificate-authority": str(plane.pki_dir / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(pair.cert),
                    "client-key": str(pair.key),
                },
            }
        ],
        "contexts": [
            {"name": "stateward-local", "context": {"cluster": "stateward-local", "user": user}}
        ],
        "current-context": "stateward-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def etcd_argv(plane: Plane, paths: binaries.Binaries) -> list[str]:
    ports = plane.ports
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(paths.etcd),
        "--name=local",
        f"--data-dir={plane.state_dir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        "--unsafe-no-fsync=true",  # a throwaway development cluster: speed over durability
        "--log-level=warn",
    ]


def apiserver_argv(plane: Plane, paths: binaries.Binaries) -> list[str]:
    ports, tls = plane.ports, plane.pki_dir
    if plane.real_nodes:
        # Nodes and pods reach the API server on the bridge (pods through the
        # `kubernetes` Service, whose endpoint is the advertised address).
        network = [
            "--bind-address=0.0.0.0",
            f"--advertise-address={plane.slot.host_ip}",
            f"--kubelet-client-certificate={tls / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={tls / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    else:
        # The endpoint reconciler refuses loopback addresses; without real nodes nothing
        # reaches the API server through the `kubernetes` Service, so it is switched off.
        network = [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
        ]
    return [
        str(paths.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--secure-port={ports.apiserver}",
        *network,
        f"--cert-dir={tls}",
        f"--tls-cert-file={tls / 'apiserver.crt'}",
        f"--tls-private-key-file={tls / 'apiserver.key'}",
        f"--client-ca-file={tls / 'ca.crt'}",
        f"--service-cluster-ip-range={plane.slot.service_cidr}",
        "--allow-privileged=true",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={tls / 'service-account.key'}",
        f"--service-account-signing-key-file={tls / 'service-account.key'}",
        f"--audit-policy-file={plane.state_dir / 'audit-policy.yaml'}",
        f"--audit-log-path={plane.audit_log}",
        "--audit-log-maxsize=100",
        "--audit-log-maxbackup=1",
        "--profiling=false",
    ]


def _component_auth(kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
    ]


def controller_manager_argv(plane: Plane, paths: binaries.Binaries) -> list[str]:
    return [
        str(paths.kube_controller_manager),
        *_component_auth(plane.state_dir / "controller-manager.kubeconfig"),
        f"--secure-port={plane.ports.controller_manager}",
        f"--service-account-private-key-file={plane.pki_dir / 'service-account.key'}",
        f"--root-ca-file={plane.pki_dir / 'ca.crt'}",
        "--use-service-account-credentials=true",
        "--controllers=*",
        "--allocate-node-cidrs=true",
        f"--cluster-cidr={plane.slot.pod_cidr}",
        f"--service-cluster-ip-range={plane.slot.service_cidr}",
    ]


def scheduler_argv(plane: Plane, paths: binaries.Binaries) -> list[str]:
    return [
        str(paths.kube_scheduler),
        *_component_auth(plane.state_dir / "scheduler.kubeconfig"),
        f"--secure-port={plane.ports.scheduler}",
    ]


def kwok_argv(
    plane: Plane, paths: binaries.Binaries, stages_hook: Callable[[str], str] | None
) -> list[str]:
    stages = plane.state_dir / "kwok-stages.yaml"
    composed = compose_stages(paths.kwok_stages.read_text())
    if stages_hook is not None:
        composed = stages_hook(composed)
    stages.write_text(composed)
    port = plane.ports.kwok
    return [
        str(paths.kwok),
        f"--kubeconfig={plane.state_dir / 'kwok.kubeconfig'}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
        "--node-ip=127.0.0.1",
        f"--node-port={port}",
        f"--server-address=127.0.0.1:{port}",
        "--node-lease-duration-seconds=40",
        f"--tls-cert-file={plane.pki_dir / 'kwok.crt'}",
        f"--tls-private-key-file={plane.pki_dir / 'kwok.key'}",
    ]


def create(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    response = client.post(path, json=body)
    if response.status_code not in (201, 409):
        raise LocalClusterError(
            f"creating {body['kind']} {body['metadata']['name']} failed: {response.text}"
        )


def kwok_node(name: str, *, tainted: bool = False) -> dict[str, Any]:
    """A simulated node: kwok answers for it. Ordinary pods schedule on it unless real nodes
    exist; then it is tainted and takes only pods that tolerate ``layout.KWOK_TAINT``."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "1Ti"}
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                layout.NODE_TYPE_LABEL: "kwok",
            },
        },
        "status": {"allocatable": capacity, "capacity": capacity},
    }
    if tainted:
        node["spec"] = {"taints": [layout.KWOK_TAINT]}
    return node


def compose_stages(stock: str) -> str:
    """kwok's stock stages plus PVC expansion (see ``PVC_RESIZE_STAGE``): the stages of kwok
    nodes as a product feature, for scale. Simulations only tests need (roles, failing Jobs)
    are added by the tests themselves through ``Config.kwok_stages``."""
    documents = [d for d in yaml.safe_load_all(stock) if d]
    return yaml.safe_dump_all([*documents, yaml.safe_load(PVC_RESIZE_STAGE)], sort_keys=False)


# Real clusters finish a PVC expansion through the CSI resizer; kwok has no stage for it, so
# this one reports the requested size as the new capacity, as a resizer would.
PVC_RESIZE_STAGE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pvc-resize
spec:
  resourceRef:
    apiGroup: v1
    kind: PersistentVolumeClaim
  selector:
    matchExpressions:
    - cel:
        expression: >-
          self.spec.storageClassName == 'kwok-volume'
    - cel:
        expression: >-
          !has(self.metadata.deletionTimestamp)
    - cel:
        expression: >-
          self.status.phase == 'Bound'
    - cel:
        expression: >-
          self.spec.resources.requests['storage'] != self.status.capacity['storage']
  steps:
  - patch:
      root: status
      subresource: status
      template: |
        capacity:
        {{ YAML .spec.resources.requests 1 }}
"""
