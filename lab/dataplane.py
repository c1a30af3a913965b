"""What the data-plane and fault tests share: making clusters on the real nodes, SQL over
``kubectl exec``, the roles in status, switchover records, and a writer that records every
acknowledged commit (and which server acknowledged it)."""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Pod, Secret, Service
from lightkube.types import PatchType
from prometheus_client.parser import text_string_to_metric_families

from lab.operator import RESYNC_SECONDS, get_pgc, wait_leading
from lab.waiting import Timeout, wait_for
from stateward.api import v1alpha1
from stateward.instance.patroni import PRIMARY_ROLE, ROLE_LABEL
from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.run import (
    OPERATOR_NAMESPACE,
    OperatorProcess,
    PostgresClusterResource,
    ensure_namespace,
    install_crds,
    start_operator,
)
from stateward_local.services import objectstore

APP_DATABASE = "app"
APP_USER = "app"
"""The application database and role every test cluster gets (``spec.bootstrap``'s default)."""


def client_of(real: LocalCluster) -> Client:
    return Client(KubeConfig.from_file(real.kubeconfig), field_manager="stateward-tests")


@contextlib.contextmanager
def operator_on(real: LocalCluster, client: Client, name: str) -> Iterator[OperatorProcess]:
    """An operator process of its own against ``real`` (CRD installed), leading."""
    install_crds(client)
    ensure_namespace(client, OPERATOR_NAMESPACE)
    handle = start_operator(real, extra=[f"--resync-interval={RESYNC_SECONDS}"], name=name)
    try:
        wait_leading(handle)
        yield handle
    finally:
        try:
            wait_namespaces_gone(client)
        finally:
            handle.stop()


def wait_namespaces_gone(client: Client, timeout: float = 300) -> None:
    """Every namespace being deleted is gone. Call it before stopping an operator: the
    PostgresClusters and Databases in a deleted namespace keep it until their finalizer ran,
    which needs a running operator, and a CRD cannot be deleted (``make undeploy``) while
    objects of it wait for one that no longer runs. The shared real-node cluster runs one
    test at a time, so every namespace being deleted is ours."""

    def terminating() -> list[str]:
        return [
            str(n.metadata.name)
            for n in client.list(Namespace)
            if n.metadata is not None and n.metadata.deletionTimestamp is not None
        ]

    wait_for(
        lambda: not terminating(),
        what="the deleted namespaces to be gone (finalizers run by the operator)",
        timeout=timeout,
        interval=1,
    )


@contextlib.contextmanager
def fresh_namespace(client: Client) -> Iterator[str]:
    """A namespace for one test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    try:
        yield name
    finally:
        client.delete(Namespace, name)


def create_cluster(client: Client, ns: str, name: str, replicas: int, **spec: Any) -> None:
    body: dict[str, Any] = {
        "apiVersion": "stateward.io/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "version": "15",
            "replicas": replicas,
            "storageSize": "1Gi",
            "deletionPolicy": {"finalBackup": False},
            **spec,
        },
    }
    client.create(codecs.from_dict(body))


def local_repository(client: Client, ns: str, path: str) -> dict[str, Any]:
    """A ``spec.backup`` on the local cluster's object store, at ``path`` in its bucket, with
    its credentials Secret copied into ``ns`` (a Secret is read in the cluster's namespace)."""
    source = client.get(
        Secret, objectstore.SECRET_NAME, namespace=objectstore.SECRET_NAMESPACE
    ).to_dict()
    copy = {"metadata": {"name": objectstore.SECRET_NAME}, "data": source["data"]}
    with contextlib.suppress(ApiError):
        client.create(Secret.from_dict(copy), namespace=ns)
    return {"repository": objectstore.repository(path)}


def ready(client: Client, ns: str, name: str, timeout: float = 240) -> dict[str, Any]:
    """The cluster once its phase is Ready; on timeout, the failure names what its status
    said last (phase and conditions), which is where to start looking."""
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        obj = get_pgc(client, name, ns)
        last["status"] = obj.get("status") or {}
        return obj if last["status"].get("phase") == "Ready" else None

    try:
        return wait_for(probe, what=f"{ns}/{name} Ready", timeout=timeout, interval=1)
    except Timeout as error:
        status = last.get("status") or {}
        said = "; ".join(
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in status.get("conditions") or []
        )
        raise Timeout(f"{error}; its status said: phase {status.get('phase')}; {said}") from None


def sql(real: LocalCluster, ns: str, pod: str, statement: str, database: str = "postgres") -> str:
    """Run SQL as the superuser over the pod's own socket (the only way the superuser logs in
    without the instances' client certificate); '' if the pod cannot answer."""
    result = subprocess.run(
        [
            str(binaries.locate().kubectl), "exec", "-n", ns, pod, "--",
            "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-d", database,
            "-v", "ON_ERROR_STOP=1", "-tAc", statement,
        ],
        env={**os.environ, "KUBECONFIG": str(real.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    return result.stdout.strip() if result.returncode == 0 else ""


def scrape(
    real: LocalCluster, ns: str, pod: str, port: int = 9187
) -> dict[tuple[str, frozenset[Any]], float]:
    """The instance's metrics as Prometheus would read them, keyed by (name, labels); fetched
    inside the pod (its metrics port on loopback), {} if it did not answer."""
    request = (
        f"exec 3<>/dev/tcp/127.0.0.1/{port} && printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3"
        " && cat <&3"
    )
    result = subprocess.run(
        [str(binaries.locate().kubectl), "exec", "-n", ns, pod, "--", "bash", "-c", request],
        env={**os.environ, "KUBECONFIG": str(real.kubeconfig)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0 or b"\r\n\r\n" not in result.stdout:
        return {}
    body = result.stdout.split(b"\r\n\r\n", 1)[1].decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def status_of(client: Client, ns: str, name: str) -> dict[str, Any]:
    return dict(get_pgc(client, name, ns).get("status") or {})


def roles(client: Client, ns: str, name: str) -> dict[str, str]:
    return {i["name"]: i.get("role", "") for i in status_of(client, ns, name).get("instances", [])}


def annotate(
    client: Client, ns: str, name: str, value: str, key: str = v1alpha1.SWITCHOVER_ANNOTATION
) -> None:
    """A request annotation on the cluster (a switchover unless ``key`` says otherwise)."""
    client.patch(
        PostgresClusterResource,
        name,
        {"metadata": {"annotations": {key: value}}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )


def switchover_done(client: Client, ns: str, name: str, started_after: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        obj = get_pgc(client, name, ns)
        record = (obj.get("status") or {}).get("switchover") or {}
        annotations = obj["metadata"].get("annotations") or {}
        if (
            record.get("phase") in ("Succeeded", "Failed")
            and record.get("startedAt", "") >= started_after
            and "stateward.io/switchover" not in annotations
        ):
            return dict(record)
        return None

    return wait_for(finished, what=f"{name}'s switchover to finish", timeout=120, interval=0.5)


def now_stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))


def event_reasons(client: Client, ns: str) -> list[str]:
    return [e.reason or "" for e in client.list(Event, namespace=ns)]


class Ack(NamedTuple):
    n: int
    at: float
    server: str
    """The address of the server that acknowledged the commit (``inet_server_addr()``)."""


class Writer:
    """A client inserting numbered rows through whichever instance accepts writes (libpq's
    ``target_session_attrs=read-write`` over every pod address), recording which commits were
    acknowledged, when, and by which server. It is the application: the app role in its
    database, with the app Secret's password, over TLS (the superuser may not log in over
    the network)."""

    def __init__(self, client: Client, ns: str, name: str, table: str = "w") -> None:
        self.client, self.ns, self.name, self.table = client, ns, name, table
        secret = client.get(Secret, f"{name}-app", namespace=ns)
        password = base64.b64decode((secret.data or {})["password"]).decode()
        self.env = {**os.environ, "PGPASSWORD": password}
        self.dsn = self._dsn()
        self.acknowledged: list[Ack] = []
        self.failed: list[float] = []
        """When each write that was not acknowledged ended."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _dsn(self) -> str:
        """Every instance's address, the primary's first, as the primary Service would lead
        there: libpq tries the hosts in order and waits out ``connect_timeout`` on each one
        that does not answer, so a dead replica listed before the primary cost every write
        2 s, which is the client's wait, not the database's. Read again after a write fails
        (pods replaced in a rolling update get new addresses, a failover moves the primary)."""
        pods = self.client.list(
            Pod,
            namespace=self.ns,
            labels={"stateward.io/cluster": self.name, "app.kubernetes.io/component": "instance"},
        )
        primary_first = sorted(
            pods, key=lambda p: (p.metadata.labels or {}).get(ROLE_LABEL) != PRIMARY_ROLE
        )
        hosts = ",".join(p.status.podIP for p in primary_first if p.status and p.status.podIP)
        return (
            f"host={hosts} port=5432 dbname={APP_DATABASE} user={APP_USER} connect_timeout=2"
            " sslmode=require target_session_attrs=read-write"
        )

    def run(self, statement: str) -> subprocess.CompletedProcess[str]:
        """One statement; a commit that gets no answer in 30 s counts as not acknowledged
        (it waits for a synchronous standby that is gone, or a server that hangs)."""
        argv = ["psql", self.dsn, "-v", "ON_ERROR_STOP=1", "-tAc", statement]
        try:
            return subprocess.run(
                argv, env=self.env, capture_output=True, text=True, timeout=30, check=False
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", "no answer within 30 s")

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            done = self.run(
                f"insert into {self.table} values ({n:d}) returning inet_server_addr()"  # noqa: S608
            )
            # psql prints the returned row, then the command tag.
            server = (done.stdout.strip().splitlines() or [""])[0]
            if done.returncode == 0 and server:
                self.acknowledged.append(Ack(n, time.monotonic(), server.split("/")[0]))
            else:
                self.failed.append(time.monotonic())
                # The API server may be down (a fault under test): keep the addresses known.
                with contextlib.suppress(Exception):
                    self.dsn = self._dsn()

    def __enter__(self) -> Writer:
        created = self.run(f"create table if not exists {self.table} (n int primary key)")
        assert created.returncode == 0, created.stderr
        self._thread.start()
        wait_for(lambda: len(self.acknowledged) >= 5, what="the writer to get going")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def wait_acks(self, count: int, timeout: float = 120) -> None:
        """Wait for ``count`` more acknowledged writes than there are now."""
        start = len(self.acknowledged)
        wait_for(
            lambda: len(self.acknowledged) >= start + count,
            what=f"{count} more acknowledged writes",
            timeout=timeout,
        )

    def longest_gap(self) -> float:
        stamps = [a.at for a in self.acknowledged]
        return max((b - a for a, b in itertools.pairwise(stamps)), default=0.0)

    def servers(self) -> list[str]:
        """The servers that acknowledged writes, in order, each run of acks counted once:
        ``[old, new]`` for one failover; a server that comes back after another took over
        (``[old, new, old]``) means two primaries accepted writes."""
        return [server for server, _ in itertools.groupby(a.server for a in self.acknowledged)]

    def missing_on(self, real: LocalCluster, ns: str, pod: str) -> set[int]:
        present = sql(
            real,
            ns,
            pod,
            f"select string_agg(n::text, ',') from {self.table}",  # noqa: S608 - our own table
            APP_DATABASE,
        )
        rows = {int(x) for x in present.split(",") if x}
        return {a.n for a in self.acknowledged} - rows


class PoolerWriter(Writer):
    """The same application through the pooler (``NAME-pooler``), verifying the Service's
    name against the app Secret's ``ca.crt`` (``sslmode=verify-full``), as an application in
    the cluster would; the host reaches the Service's address through a node."""

    def __init__(self, client: Client, ns: str, name: str, ca_file: str, table: str) -> None:
        self.ca_file = ca_file
        super().__init__(client, ns, name, table)

    def _dsn(self) -> str:
        return pooler_dsn(self.client, self.ns, self.name, self.ca_file)


def pooler_dsn(
    client: Client, ns: str, name: str, ca_file: str, *, user: str = APP_USER, **extra: str
) -> str:
    address = client.get(Service, f"{name}-pooler", namespace=ns).spec.clusterIP  # type: ignore[union-attr]
    options = {
        "host": f"{name}-pooler.{ns}.svc",
        "hostaddr": address,
        "port": "5432",
        "dbname": APP_DATABASE,
        "user": user,
        "connect_timeout": "5",
        "sslmode": "verify-full",
        "sslrootcert": ca_file,
        **extra,
    }
    return " ".join(f"{key}={value}" for key, value in options.items())


PATCH_CONFIG_AS_AN_ATTACKER = """
import base64, json, ssl, sys, urllib.error, urllib.request
body = json.dumps({"postgresql": {"parameters": {"archive_command": "touch /tmp/pwned"}}})
host = sys.argv[1]
try:  # plain HTTP first: Patroni speaks only TLS
    urllib.request.urlopen(f"http://{host}:8008/patroni", timeout=10)
    print("http-answered", flush=True)
except Exception:  # reset, or a TLS alert where a status line should be
    print("http-refused", flush=True)
for auth in (None, "stateward:guessed", "postgres:" + sys.argv[2]):
    request = urllib.request.Request(
        f"https://{host}:8008/config", data=body.encode(), method="PATCH"
    )
    request.add_header("Content-Type", "application/json")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:  # an attacker does not verify the certificate
        code = urllib.request.urlopen(
            request, timeout=10, context=ssl._create_unverified_context()
        ).status
    except urllib.error.HTTPError as error:
        code = error.code
    except OSError:  # no answer at all: the network policy dropped it
        code = "unreachable"
    print(code, flush=True)
"""
"""PATCH Patroni's /config with an archive_command (a shell on the primary, had it worked):
without credentials, with a guessed password, and with the superuser's name and password;
before that, try plain HTTP. Prints what each try got: a status, or ``unreachable``."""

CONNECT_AS_AN_APPLICATION = """
printf '%s' "$1" > /tmp/ca.crt
mine="select version || ' ' || ssl from pg_stat_ssl where pid = pg_backend_pid()"
echo "verify-full: $(PGSSLROOTCERT=/tmp/ca.crt psql "$2" -tAc "$mine" 2>&1)"
plain="host=$4 user=app dbname=app sslmode=disable"
echo "disable: $(PGPASSWORD="$3" psql "$plain" -tAc 'select 1' 2>&1)"
superuser="host=$4 user=postgres dbname=postgres sslmode=require"
echo "superuser: $(PGPASSWORD="$5" psql "$superuser" -tAc 'select 1' 2>&1)"
replication="host=$4 user=replicator dbname=postgres replication=database sslmode=require"
echo "replication: $(PGPASSWORD="$6" psql "$replication" -tAc 'IDENTIFY_SYSTEM' 2>&1)"
"""
"""In a pod of the namespace, as an application would: the app Secret's ``uri`` as it is,
with its ``ca.crt`` as the root certificate; then the same user and password without TLS;
then, as an attacker who stole them, the superuser's and the replication role's passwords.
Arguments: the CA (PEM), the URI, the app password, the primary Service's name, the
superuser's password, the replication password."""


def run_in_pod(client: Client, ns: str, name: str, image: str, argv: list[str]) -> str:
    """Run ``argv`` in a one-off pod of ``ns`` on a real node; its log once it ended."""
    client.create(
        Pod.from_dict(
            {
                "metadata": {"name": name, "namespace": ns},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": argv,
                        }
                    ],
                },
            }
        )
    )

    def ended() -> bool:
        pod = client.get(Pod, name, namespace=ns)
        return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))

    wait_for(ended, what=f"pod {name} to run to its end", timeout=120)
    return "".join(client.log(name, namespace=ns))
