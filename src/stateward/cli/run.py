"""``stateward local run`` (``make run``): the whole story on the embedded local cluster.

Starts the local cluster if it is not running, installs the CRD, runs the operator as a child
process, applies the sample PostgresCluster and prints its status each time it changes, until
Ctrl-C. The cluster keeps running afterwards, for kubectl; ``stateward local down`` stops it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace

from stateward.api import crd, manifests, v1alpha1
from stateward.controllers.kube import PostgresClusterResource
from stateward.local.cluster import Config, LocalCluster, free_port_base

OPERATOR_NAMESPACE = "stateward-system"


def sample_cluster() -> dict[str, Any]:
    """The sample PostgresCluster: the repository's ``config/samples`` file (users edit it),
    or, where there is none (an installed wheel run outside a checkout), the generated one."""
    path = manifests.default_root() / manifests.SAMPLE_PATH
    text = path.read_text() if path.is_file() else manifests.sample_yaml()
    sample: dict[str, Any] = yaml.safe_load(text)
    return sample


def say(message: str) -> None:
    print(message, flush=True)


def install_crds(client: Client) -> None:
    definition: Any = CustomResourceDefinition.from_dict(crd.postgrescluster_crd())
    client.apply(
        definition,
        field_manager="stateward-install",
        force=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = client.get(CustomResourceDefinition, f"{v1alpha1.PLURAL}.{v1alpha1.GROUP}")
        conditions = (found.status.conditions if found.status else None) or []
        if any(c.type == "Established" and c.status == "True" for c in conditions):
            return
        time.sleep(0.2)
    raise RuntimeError("the PostgresCluster CRD did not become Established within 30s")


def ensure_namespace(client: Client, name: str) -> None:
    with contextlib.suppress(ApiError):
        client.create(Namespace(metadata=ObjectMeta(name=name)))


@dataclasses.dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    probe_port: int
    webhook_port: int
    log: Path
    argv: tuple[str, ...] = ()

    def stop(self, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def start_operator(
    cluster: LocalCluster, *, extra: list[str] | None = None, name: str = "operator"
) -> OperatorProcess:
    """The operator as a child process, as user ``stateward-operator``, on free ports."""
    log_path = cluster.state_dir / "logs" / f"{name}.log"
    log = log_path.open("ab")
    kubeconfig = cluster.state_dir / "operator.kubeconfig"
    base = free_port_base(count=2)
    argv = [
        sys.executable,
        "-m",
        "stateward",
        "operator",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={OPERATOR_NAMESPACE}",
        "--probe-address=127.0.0.1",
        f"--probe-port={base}",
        "--webhook-address=127.0.0.1",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={base + 1}",
        *(extra or []),
    ]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    return OperatorProcess(process, base, base + 1, log_path, tuple(argv))


def _status_line(obj: Any) -> str:
    status = obj.get("status") or {}
    ready = {c["type"]: c for c in status.get("conditions") or []}.get("Ready", {})
    return (
        f"{obj['metadata']['name']}: phase={status.get('phase', '-')}"
        f" ready={status.get('readyReplicas', 0)}/{obj['spec']['replicas']}"
        f" primary={status.get('primaryPod', '-')}"
        f" replicas={','.join(status.get('replicaPods', [])) or '-'}"
        f" ({ready.get('reason', '-')}: {ready.get('message', '')})"
    )


def run() -> int:
    config = Config.default()
    cluster = LocalCluster(config)
    if not cluster.running():
        say("==> Starting the local Kubernetes cluster")
        cluster.up(progress=say)
    else:
        say(f"==> Using the running local cluster ({cluster.kubeconfig})")
    client = Client(KubeConfig.from_file(cluster.kubeconfig), field_manager="stateward-run")
    say("==> Installing the PostgresCluster CRD")
    install_crds(client)
    ensure_namespace(client, OPERATOR_NAMESPACE)
    say(f"==> Starting the operator (log: {cluster.state_dir / 'logs' / 'operator.log'})")
    operator = start_operator(cluster)
    cluster.adopt("operator", operator.process.pid, list(operator.argv), operator.log)
    try:
        sample = sample_cluster()
        sample["metadata"].setdefault("namespace", "default")
        client.apply(codecs.from_dict(sample), field_manager="stateward-run", force=True)
        name = sample["metadata"]["name"]
        say(f"==> Applied the sample PostgresCluster {name!r}; status follows (Ctrl-C to stop)")
        say(f"    kubectl --kubeconfig {cluster.kubeconfig} get pgc,sts,svc,pods -n default")
        last = ""
        while True:
            if operator.process.poll() is not None:
                say("operator exited; see its log")
                return 1
            with contextlib.suppress(ApiError):
                obj = client.get(PostgresClusterResource, name, namespace="default").to_dict()  # type: ignore[no-untyped-call]
                line = _status_line(obj)
                if line != last:
                    say(f"[{time.strftime('%H:%M:%S')}] {line}")
                    last = line
            time.sleep(1)
    except KeyboardInterrupt:
        say(
            "\n==> Stopping the operator; the cluster keeps running"
            " (`stateward local down` stops it)"
        )
        return 0
    finally:
        operator.stop()
        cluster.release("operator")
