"""Real nodes: containers from locally built images, networking, storage and failure drills.

They run on the session's cluster with real nodes (`real_cluster`): node-1 and node-2 take
the pods, node-2 the failure drills; every drill puts the node back as it found it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lab.waiting import wait_for
from lightkube import Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import (
    Namespace,
    Node,
    PersistentVolume,
    PersistentVolumeClaim,
    Pod,
    Service,
)

from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.images import catalog
from stateward_local.nodes import host, layout

pytestmark = pytest.mark.integration

SERVER = (
    "perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalPort => 8080, Listen => 16,"
    ' ReuseAddr => 1) or die "listen: $!"; $| = 1; print "listening\\n";'
    ' while ($c = $s->accept) { print $c "hello from $ENV{HOSTNAME}\\n"; close $c }\''
)


@pytest.fixture(scope="module")
def real(real_cluster: LocalCluster) -> LocalCluster:
    return real_cluster


@pytest.fixture(scope="module")
def client(real: LocalCluster) -> Client:
    return Client(KubeConfig.from_file(real.kubeconfig), field_manager="stateward-tests")


@pytest.fixture
def ns(client: Client) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    client.delete(Namespace, name)


def kubectl(
    real: LocalCluster, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries.locate().kubectl), *args],
        env={**os.environ, "KUBECONFIG": str(real.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pod(
    name: str,
    node: str,
    command: str,
    *,
    labels: dict[str, str] | None = None,
    volumes: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod of the locally built base image, pinned to ``node`` through the scheduler."""
    mounts = [{"name": claim, "mountPath": path} for claim, path in (volumes or {}).items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [
                {
                    "name": "main",
                    "image": catalog.BASE_REF,
                    "imagePullPolicy": "Never",
                    "command": ["bash", "-c", command],
                    "volumeMounts": mounts,
                }
            ],
            "volumes": [
                {"name": claim, "persistentVolumeClaim": {"claimName": claim}}
                for claim in (volumes or {})
            ],
        },
    }


def create(client: Client, ns: str, body: dict[str, Any]) -> None:
    client.create(codecs.from_dict(body), namespace=ns)  # type: ignore[call-overload]


def ready_pod(client: Client, ns: str, name: str, timeout: float = 90) -> Pod:
    def probe() -> Pod | None:
        found = client.get(Pod, name, namespace=ns)
        conditions = (found.status.conditions if found.status else None) or []
        return found if any(c.type == "Ready" and c.status == "True" for c in conditions) else None

    return wait_for(probe, what=f"pod {ns}/{name} Ready", timeout=timeout)


def node_ready(client: Client, name: str) -> bool:
    found = client.get(Node, name)
    conditions = (found.status.conditions if found.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def read_line(host: str, port: int, timeout: float = 3) -> str:
    with socket.create_connection((host, port), timeout=timeout) as connection:
        connection.settimeout(timeout)
        return connection.makefile().readline().strip()


def fetch_in_pod(real: LocalCluster, ns: str, pod_name: str, host: str, port: int) -> str:
    script = f"exec 3<>/dev/tcp/{host}/{port} && head -1 <&3"
    result = kubectl(real, "exec", "-n", ns, pod_name, "--", "timeout", "5", "bash", "-c", script)
    return result.stdout.strip() if result.returncode == 0 else ""


# --- the nodes ----------------------------------------------------------------------------


def test_real_nodes_are_ready_beside_tainted_kwok_nodes(real: LocalCluster, client: Client) -> None:
    wide = kubectl(real, "get", "nodes", "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    for node in real.real_nodes():
        assert node_ready(client, node.name)
        assert node.ip in wide.stdout
        found = client.get(Node, node.name)
        assert found.metadata and found.metadata.labels
        assert found.metadata.labels[layout.NODE_TYPE_LABEL] == "real"
        assert not (found.spec and found.spec.taints)
    kwok = client.get(Node, "kwok-node-0")
    assert kwok.spec and kwok.spec.taints
    assert [(t.key, t.effect) for t in kwok.spec.taints] == [
        (layout.KWOK_TAINT["key"], layout.KWOK_TAINT["effect"])
    ]
    assert [s for _, s in real.node_states()] == ["running"] * len(real.real_nodes())


def test_a_pod_of_the_local_base_image_runs_with_logs_and_exec(
    real: LocalCluster, client: Client, ns: str
) -> None:
    create(client, ns, pod("hello", "node-1", "echo started as $(id -u); exec sleep 3600"))
    found = ready_pod(client, ns, "hello")
    assert found.spec and found.spec.nodeName == "node-1"
    logs = wait_for(
        lambda: kubectl(real, "logs", "-n", ns, "hello").stdout,
        what="the pod's log",
    )
    assert logs.strip() == "started as 1000"
    release = kubectl(real, "exec", "-n", ns, "hello", "--", "cat", "/etc/os-release")
    assert release.returncode == 0, release.stderr
    assert "bookworm" in release.stdout


# --- networking ---------------------------------------------------------------------------


def test_pods_services_and_dns_connect_across_nodes_and_from_the_host(
    real: LocalCluster, client: Client, ns: str
) -> None:
    create(client, ns, pod("server", "node-2", SERVER, labels={"app": "server"}))
    create(client, ns, pod("client", "node-1", "exec sleep 3600"))
    create(
        client,
        ns,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    server = ready_pod(client, ns, "server")
    ready_pod(client, ns, "client")
    assert server.status and server.status.podIP
    pod_ip = server.status.podIP
    greeting = "hello from server"
    # pod -> pod on another node
    wait_for(
        lambda: fetch_in_pod(real, ns, "client", pod_ip, 8080) == greeting,
        what="the client pod on node-1 to reach the server pod on node-2",
    )
    # pod -> Service by its DNS name (CoreDNS), routed by kube-proxy
    service_name = f"echo.{ns}.svc.cluster.local"
    wait_for(
        lambda: fetch_in_pod(real, ns, "client", service_name, 80) == greeting,
        what=f"the client pod to reach the Service as {service_name}",
    )
    # host -> pod IP and host -> Service IP (the operator runs on the host)
    assert read_line(pod_ip, 8080) == greeting
    service = client.get(Service, "echo", namespace=ns)
    assert service.spec and service.spec.clusterIP
    cluster_ip = service.spec.clusterIP
    wait_for(
        lambda: read_line(cluster_ip, 80) == greeting,
        what="the host to reach the Service's cluster IP",
    )
    # pod -> API server through the `kubernetes` Service
    probe = kubectl(
        real,
        "exec", "-n", ns, "client", "--", "timeout", "5", "bash", "-c",
        "exec 3<>/dev/tcp/kubernetes.default.svc.cluster.local/443 && echo connected",
    )  # fmt: skip
    assert probe.stdout.strip() == "connected", probe.stderr


# --- storage ------------------------------------------------------------------------------


def test_a_local_volume_keeps_its_data_across_pod_restarts_on_its_node(
    real: LocalCluster, client: Client, ns: str
) -> None:
    create(
        client,
        ns,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    writer = "test -f /data/mark || echo written-once > /data/mark; exec sleep 3600"
    create(client, ns, pod("app", "node-2", writer, volumes={"data": "/data"}))
    ready_pod(client, ns, "app")
    first = kubectl(real, "exec", "-n", ns, "app", "--", "cat", "/data/mark")
    assert first.stdout.strip() == "written-once", first.stderr
    claim = client.get(PersistentVolumeClaim, "data", namespace=ns)
    assert claim.spec and claim.spec.volumeName
    volume = client.get(PersistentVolume, claim.spec.volumeName)
    assert volume.spec and volume.spec.nodeAffinity
    terms = volume.spec.nodeAffinity.required.nodeSelectorTerms
    assert terms[0].matchExpressions[0].values == ["node-2"]
    client.delete(Pod, "app", namespace=ns)
    wait_for(
        lambda: not any(p.metadata.name == "app" for p in client.list(Pod, namespace=ns)),  # type: ignore[union-attr]
        what="the pod to be gone",
    )
    create(client, ns, pod("app", "node-2", writer, volumes={"data": "/data"}))
    ready_pod(client, ns, "app")
    again = kubectl(real, "exec", "-n", ns, "app", "--", "cat", "/data/mark")
    assert again.stdout.strip() == "written-once"


# --- failure drills -----------------------------------------------------------------------


def unreachable(host: str, port: int) -> bool:
    try:
        read_line(host, port, timeout=2)
    except OSError:
        return True
    return False


def test_a_partitioned_node_keeps_running_but_nobody_reaches_it(
    real: LocalCluster, client: Client, ns: str
) -> None:
    create(client, ns, pod("server", "node-2", SERVER, labels={"app": "server"}))
    create(client, ns, pod("client", "node-1", "exec sleep 3600"))
    server = ready_pod(client, ns, "server")
    ready_pod(client, ns, "client")
    assert server.status and server.status.podIP
    pod_ip = server.status.podIP
    # Ready means its container started; the server listens a moment later.
    wait_for(
        lambda: read_line(pod_ip, 8080) == "hello from server",
        what="the server pod to answer before the partition",
    )
    real.node_partition("node-2")
    try:
        assert dict((n.name, s) for n, s in real.node_states())["node-2"] == "partitioned"
        assert unreachable(pod_ip, 8080)
        assert fetch_in_pod(real, ns, "client", pod_ip, 8080) == ""
        # Its processes still run: nothing was killed.
        alive = {s.name for s in real.status() if s.running}
        assert {f"node-2.{c}" for c in ("containerd", "kubelet", "kube-proxy")} <= alive
    finally:
        real.node_heal("node-2")
    wait_for(
        lambda: read_line(pod_ip, 8080) == "hello from server",
        what="the server pod to be reachable again after heal",
    )


def test_a_frozen_node_goes_not_ready_and_comes_back_when_thawed(
    real: LocalCluster, client: Client
) -> None:
    real.node_freeze("node-2")
    try:
        assert dict((n.name, s) for n, s in real.node_states())["node-2"] == "frozen"
        wait_for(
            lambda: not node_ready(client, "node-2"),
            what="node-2 to go NotReady while frozen",
            timeout=180,
            interval=1,
        )
        assert node_ready(client, "node-1")
    finally:
        real.node_thaw("node-2")
    wait_for(lambda: node_ready(client, "node-2"), what="node-2 Ready after thaw", timeout=120)


def test_a_stopped_node_loses_every_process_and_restarts_its_pods_on_start(
    real: LocalCluster, client: Client, ns: str
) -> None:
    create(client, ns, pod("server", "node-2", SERVER, labels={"app": "server"}))
    server = ready_pod(client, ns, "server")
    assert server.status and server.status.podIP
    real.node_stop("node-2")
    node = real.node("node-2")
    try:
        assert dict((n.name, s) for n, s in real.node_states())["node-2"] == "stopped"
        assert not host.cgroup_pids(host.cgroup_paths(node)[0])
        assert unreachable(server.status.podIP, 8080)
        wait_for(
            lambda: not node_ready(client, "node-2"),
            what="node-2 to go NotReady after power loss",
            timeout=180,
            interval=1,
        )
    finally:
        real.node_start("node-2")
    wait_for(lambda: node_ready(client, "node-2"), what="node-2 Ready after start", timeout=120)
    # The pod's container died with the node; the kubelet starts it again.
    wait_for(
        lambda: (
            read_line(client.get(Pod, "server", namespace=ns).status.podIP, 8080)  # type: ignore[union-attr,arg-type]
            == "hello from server"
        ),
        what="the server pod serving again after the node came back",
        timeout=120,
    )
