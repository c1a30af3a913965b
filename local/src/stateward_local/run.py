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
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.core_v1 import Namespace

from stateward.api import manifests, v1alpha1
from stateward.controllers.kube import DatabaseResource, PostgresClusterResource
from stateward.runtime import rbac
from stateward.specs.postgres import statefulset
from stateward_local import binaries
from stateward_local.cluster import Config, LocalCluster
from stateward_local.controlplane.components import OPERATOR_USER
from stateward_local.controlplane.processes import free_port_base
from stateward_local.images import catalog

OPERATOR_NAMESPACE = "stateward-system"
LOCAL_BINDING = "stateward-operator-local"
"""The (Cluster)RoleBindings that give the local operator user the generated roles. Not
``config/``'s names: those bind the ServiceAccount, and ``make deploy`` on the local cluster
must not take our subject away (or we its)."""


def sample_cluster() -> dict[str, Any]:
    """The sample PostgresCluster: the repository's ``config/samples`` file (users edit it),
    or, where there is none (an installed wheel run outside a checkout), the generated one."""
    path = manifests.default_root() / manifests.SAMPLE_PATH
    text = path.read_text() if path.is_file() else manifests.sample_yaml()
    sample: dict[str, Any] = yaml.safe_load(text)
    return sample


def sample_database() -> dict[str, Any]:
    """The sample Database (MariaDB), from ``config/samples`` or else the generated one."""
    path = manifests.default_root() / manifests.DATABASE_SAMPLE_PATH
    text = path.read_text() if path.is_file() else manifests.database_sample_yaml()
    sample: dict[str, Any] = yaml.safe_load(text)
    return sample


def say(message: str) -> None:
    print(message, flush=True)


def install_crds(client: Client) -> None:
    """Apply every CRD (PostgresCluster, Database) and wait until each is Established."""
    names = []
    for build in manifests.CRDS:
        definition: Any = CustomResourceDefinition.from_dict(build())
        client.apply(definition, field_manager="stateward-install", force=True)
        names.append(definition.metadata.name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        waiting = [name for name in names if not _established(client, name)]
        if not waiting:
            return
        time.sleep(0.2)
    raise RuntimeError(f"the CRDs {', '.join(waiting)} did not become Established within 30s")


def _established(client: Client, name: str) -> bool:
    found = client.get(CustomResourceDefinition, name)
    conditions = (found.status.conditions if found.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def ensure_namespace(client: Client, name: str) -> None:
    with contextlib.suppress(ApiError):
        client.create(Namespace(metadata=ObjectMeta(name=name)))


def grant_operator(client: Client, namespace: str = OPERATOR_NAMESPACE) -> None:
    """Bind the local operator user to the generated ClusterRole and leader-election Role.

    The user's certificate carries no group (``local/cluster.py``), so these bindings are all
    it holds besides what every authenticated user has: a permission missing from
    ``runtime/rbac.py`` fails on the local cluster as it would in a deployment. Returns once
    the API server's authorizer grants the Lease, the last rule to arrive.
    """
    ensure_namespace(client, namespace)
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}
    for document in (
        rbac.cluster_role(),
        rbac.leader_election_role(namespace),
        *rbac.bindings(subject, name=LOCAL_BINDING, namespace=namespace),
    ):
        client.apply(codecs.from_dict(document), field_manager="stateward-local", force=True)
    review = SubjectAccessReview(
        spec=SubjectAccessReviewSpec(
            user=OPERATOR_USER,
            resourceAttributes=ResourceAttributes(
                group="coordination.k8s.io", resource="leases", verb="update", namespace=namespace
            ),
        )
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = client.create(review)
        if answer.status is not None and answer.status.allowed:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the operator's RoleBinding in {namespace} did not take effect within 30s")


def admin_client(cluster: LocalCluster) -> Client:
    return Client(KubeConfig.from_file(cluster.kubeconfig), field_manager="stateward-run")


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
    cluster: LocalCluster,
    *,
    extra: list[str] | None = None,
    name: str = "operator",
    namespace: str = OPERATOR_NAMESPACE,
    kubeconfig: Path | None = None,
) -> OperatorProcess:
    """The operator as a child process on free ports, as user ``stateward-operator`` holding
    only the generated roles (:func:`grant_operator`, done here so that every way of starting
    the local operator — ``make run``, the tests, the benchmark — goes through it).

    ``kubeconfig`` runs it as another user instead, with no grant: the workstation case of a
    cluster admin running the operator after ``make install``. The images the real nodes
    hold are pinned by digest (``--pin-image``), as a release pins what it ships.
    """
    if kubeconfig is None:
        grant_operator(admin_client(cluster), namespace)
        kubeconfig = cluster.state_dir / "operator.kubeconfig"
    log_path = cluster.state_dir / "logs" / f"{name}.log"
    log = log_path.open("ab")
    base = free_port_base(count=2)
    pins = cluster.image_pins()
    argv = [
        sys.executable,
        "-m",
        "stateward",
        "operator",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        "--probe-address=127.0.0.1",
        f"--probe-port={base}",
        "--webhook-address=127.0.0.1",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={base + 1}",
        *(f"--pin-image={ref}@{digest}" for ref, digest in sorted(pins.items())),
        # The operator image is on the nodes: backup Jobs run it, as a deployed one's do.
        *([f"--operator-image={catalog.OPERATOR_REF}"] if catalog.OPERATOR_REF in pins else []),
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


def _database_line(obj: Any) -> str:
    status = obj.get("status") or {}
    ready = {c["type"]: c for c in status.get("conditions") or []}.get("Ready", {})
    return (
        f"{obj['metadata']['name']} (Database {obj['spec']['engine']}):"
        f" phase={status.get('phase', '-')}"
        f" ready={status.get('readyReplicas', 0)}/{obj['spec']['replicas']}"
        f" primary={status.get('primaryPod', '-')}"
        f" ({ready.get('reason', '-')}: {ready.get('message', '')})"
    )


def _psql(kubeconfig: Path, namespace: str, pod: str, statement: str) -> str | None:
    """One statement as the superuser over the pod's own socket; None if it failed."""
    result = subprocess.run(
        [
            str(binaries.locate().kubectl), f"--kubeconfig={kubeconfig}", "exec", "-n",
            namespace, pod, "-c", statefulset.CONTAINER_NAME, "--", "psql",
            "-h", "/var/run/postgresql", "-U", "postgres", "-X", "-tAc", statement,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return result.stdout.strip() if result.returncode == 0 else None


def replication_check(kubeconfig: Path, namespace: str, primary: str, replica: str) -> str:
    """Write a row on the primary and read it back on a replica: the sentence to show."""
    marker = f"make run at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    insert = f"insert into stateward_hello values ('{marker}')"  # noqa: S608 - our own text
    wrote = _psql(
        kubeconfig,
        namespace,
        primary,
        f"create table if not exists stateward_hello (note text); {insert}",
    )
    if wrote is None:
        return f"could not write a row on {primary}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = _psql(
            kubeconfig,
            namespace,
            replica,
            f"select count(*) from stateward_hello where note = '{marker}'",  # noqa: S608
        )
        if found == "1":
            return f"a row written on the primary {primary} was read back on the replica {replica}"
        time.sleep(0.5)
    return f"a row written on {primary} did not reach {replica} within 30s"


def what_now(cluster: LocalCluster, name: str, namespace: str, obj: dict[str, Any]) -> list[str]:
    """The short block shown once the sample is Ready: how to look and how to connect."""
    kubeconfig = cluster.kubeconfig
    status = obj.get("status") or {}
    primary, replicas = status.get("primaryPod"), status.get("replicaPods") or []
    lines = ["==> The sample cluster is Ready."]
    if primary and replicas:
        lines.append(
            f"    Replication: {replication_check(kubeconfig, namespace, primary, replicas[0])}"
        )
    secret = f"{name}-app"
    lines += [
        "    What now:",
        f"      export KUBECONFIG={kubeconfig}",
        f"      kubectl get pgc {name} -n {namespace}            # status at a glance",
        f"      kubectl exec -it -n {namespace} {primary or name + '-0'} -c postgres --"
        " psql -h /var/run/postgresql -U postgres   # a psql shell on the primary",
        "      # as the application, with the password from the Secret (never printed):",
        f"      PGPASSWORD=$(kubectl get secret {secret} -n {namespace}"
        " -o jsonpath='{.data.password}' | base64 -d) \\",
        f'        psql "host=$(kubectl get pod {primary or name + "-0"} -n {namespace}'
        " -o jsonpath='{.status.podIP}') dbname=app user=app\"",
        f"      kubectl annotate pgc {name} -n {namespace} {v1alpha1.SWITCHOVER_ANNOTATION}=any"
        "   # a switchover",
        f"      kubectl annotate pgc {name} -n {namespace} {v1alpha1.BACKUP_ANNOTATION}=$(date +%s)"
        "   # a pgBackRest backup now (or: kubectl stateward backup)",
    ]
    return lines


def run() -> int:
    config = Config.default()
    cluster = LocalCluster(config)
    if not cluster.running():
        say("==> Starting the local Kubernetes cluster")
        cluster.up(progress=say)
    else:
        say(f"==> Using the running local cluster ({cluster.kubeconfig})")
    client = admin_client(cluster)
    say("==> Installing the CRDs (PostgresCluster, Database)")
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
        database = sample_database()
        database["metadata"].setdefault("namespace", "default")
        client.apply(codecs.from_dict(database), field_manager="stateward-run", force=True)
        database_name = database["metadata"]["name"]
        say(
            f"==> Applied the sample PostgresCluster {name!r} and the sample MariaDB Database"
            f" {database_name!r}; status follows (Ctrl-C to stop)"
        )
        say(f"    kubectl --kubeconfig {cluster.kubeconfig} get pgc,db,sts,svc,pods -n default")
        last = ""
        last_database = ""
        shown_ready = False
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
                if not shown_ready and (obj.get("status") or {}).get("phase") == "Ready":
                    shown_ready = True
                    for text in what_now(cluster, name, "default", obj):
                        say(text)
            with contextlib.suppress(ApiError):
                found = client.get(DatabaseResource, database_name, namespace="default")
                line = _database_line(found.to_dict())  # type: ignore[no-untyped-call]
                if line != last_database:
                    say(f"[{time.strftime('%H:%M:%S')}] {line}")
                    last_database = line
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
