"""The operator as a process: leader election, losing the API server, probes and metrics.

These tests run operators against their own API-server-only control plane (the session's
`apiserver` fixture), so stopping the API server or running rival leaders cannot disturb the
tests that share the full control plane.
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import socket
import ssl
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from lab.operator import metric, wait_leading
from lab.waiting import wait_for
from lightkube import ApiError, Client, codecs
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.resources.admissionregistration_v1 import ValidatingWebhookConfiguration
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.authentication_v1 import SelfSubjectReview
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Event, Namespace, Secret, Service
from lightkube.resources.rbac_authorization_v1 import RoleBinding

from stateward.runtime import rbac, webhook
from stateward_local.cluster import LocalCluster
from stateward_local.controlplane.components import OPERATOR_USER
from stateward_local.run import (
    LOCAL_BINDING,
    OPERATOR_NAMESPACE,
    OperatorProcess,
    PostgresClusterResource,
    admin_client,
    ensure_namespace,
    grant_operator,
    install_crds,
    start_operator,
)
from tests.conftest import client_for
from tests.integration.conftest import AuditLog, pgc_body
from tests.support import clusters

pytestmark = pytest.mark.integration

FAST_LEASE = ["--lease-duration=6", "--renew-deadline=4", "--retry-period=1"]
# The webhook certificate's Secret is re-read every second instead of every 30.
FAST_CERTIFICATE = ["--webhook-certificate-interval=1"]


@pytest.fixture(scope="module")
def bare(apiserver: LocalCluster) -> Client:
    client = client_for(apiserver)
    install_crds(client)
    ensure_namespace(client, OPERATOR_NAMESPACE)
    return client


@pytest.fixture
def operators(apiserver: LocalCluster) -> Iterator[list[OperatorProcess]]:
    started: list[OperatorProcess] = []
    yield started
    for handle in started:
        if handle.process.poll() is None:
            os.kill(handle.process.pid, signal.SIGCONT)
        handle.stop()


def _launch(
    cluster: LocalCluster, started: list[OperatorProcess], identity: str
) -> OperatorProcess:
    handle = start_operator(
        cluster,
        extra=[f"--identity={identity}", *FAST_LEASE, *FAST_CERTIFICATE],
        name=f"operator-{identity}",
    )
    started.append(handle)
    return handle


def _holder(client: Client) -> str | None:
    lease = client.get(Lease, "stateward-operator-leader", namespace=OPERATOR_NAMESPACE)
    return lease.spec.holderIdentity if lease.spec else None


def _ready(handle: OperatorProcess) -> bool:
    try:
        response = httpx.get(f"http://127.0.0.1:{handle.probe_port}/readyz", timeout=2)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def _api_ready(cluster: LocalCluster) -> bool:
    with cluster.http_client() as http:
        return http.get("/readyz").status_code == 200


def _new_namespace(client: Client) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    client.create(Namespace.from_dict({"metadata": {"name": name}}))
    return name


def _reconciled(client: Client, namespace: str, name: str, timeout: float = 30) -> None:
    wait_for(
        lambda: (
            client.get(StatefulSet, name, namespace=namespace)
            and client.get(Service, f"{name}-primary", namespace=namespace)
        ),
        what=f"the children of {name}",
        timeout=timeout,
    )


def test_exactly_one_leader_and_failover_by_lease(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    first = _launch(apiserver, operators, "first")
    wait_leading(first)
    second = _launch(apiserver, operators, "second")
    wait_for(
        lambda: httpx.get(f"http://127.0.0.1:{second.probe_port}/healthz", timeout=2).text == "ok",
        what="the second operator to serve probes",
    )
    assert _holder(bare) == "first"

    namespace = _new_namespace(bare)
    bare.create(codecs.from_dict(pgc_body("one", namespace)))
    _reconciled(bare, namespace, "one")
    assert metric(first.probe_port, "stateward_leader") == 1
    assert metric(second.probe_port, "stateward_leader") == 0
    assert metric(second.probe_port, "stateward_reconcile_total") == 0
    assert metric(second.probe_port, "stateward_api_writes_total") == 0
    assert _ready(second), "a standby serves admission, so it is Ready"
    # The children exist before the reconcile that made them ends; its duration (a labelled
    # histogram, absent until observed) is recorded when it does.
    wait_for(
        lambda: metric(first.probe_port, "stateward_reconcile_total", 'result="success"') >= 1,
        what="the first reconcile to finish",
    )
    exposed = httpx.get(f"http://127.0.0.1:{first.probe_port}/metrics", timeout=5).text
    for name in (
        "stateward_reconcile_total",
        "stateward_reconcile_errors_total",
        "stateward_reconcile_duration_seconds_bucket",
        "stateward_api_writes_total",
        "stateward_leader",
        "stateward_workqueue_depth",
    ):
        assert name in exposed, name

    killed_at = time.monotonic()
    first.process.kill()
    wait_for(lambda: _holder(bare) == "second", what="the second operator to take the lease")
    wait_for(lambda: _ready(second), what="the second operator to lead")
    takeover = time.monotonic() - killed_at
    assert takeover < 6 + 5, f"takeover took {takeover:.1f}s with a 6s lease"
    bare.create(codecs.from_dict(pgc_body("two", namespace)))
    _reconciled(bare, namespace, "two")


def test_a_leader_that_cannot_renew_stops_reconciling(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    stalled = _launch(apiserver, operators, "stalled")
    wait_leading(stalled)
    wait_for(lambda: _holder(bare) == "stalled", what="the lease")
    # Freeze the leader: it cannot renew, and a rival takes over once the lease expires.
    os.kill(stalled.process.pid, signal.SIGSTOP)
    rival = _launch(apiserver, operators, "rival")
    wait_for(lambda: _holder(bare) == "rival", what="the rival to take the lease", timeout=30)
    wait_leading(rival)
    writes_before = metric(rival.probe_port, "stateward_api_writes_total")
    os.kill(stalled.process.pid, signal.SIGCONT)
    # On waking it must notice at once that its term is over: no writes, not ready, not leader.
    wait_for(
        lambda: metric(stalled.probe_port, "stateward_leader") == 0,
        what="the stalled operator to step down",
        timeout=15,
    )
    stalled_writes = metric(stalled.probe_port, "stateward_api_writes_total")
    namespace = _new_namespace(bare)
    bare.create(codecs.from_dict(pgc_body("after", namespace)))
    _reconciled(bare, namespace, "after")
    assert metric(stalled.probe_port, "stateward_api_writes_total") == stalled_writes
    assert metric(rival.probe_port, "stateward_api_writes_total") > writes_before
    assert metric(stalled.probe_port, "stateward_leader") == 0
    assert stalled.process.poll() is None, "a stepped-down operator keeps campaigning"
    assert _holder(bare) == "rival"


def test_operator_recovers_after_the_api_server_is_down_for_30s(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    handle = _launch(apiserver, operators, "survivor")
    wait_leading(handle)
    namespace = _new_namespace(bare)
    bare.create(codecs.from_dict(pgc_body("before", namespace)))
    _reconciled(bare, namespace, "before")

    logged_before = handle.log.stat().st_size
    apiserver.stop_component("kube-apiserver")
    down_since = time.monotonic()
    # The outage itself is the scenario: hold it for 30 s while checking the operator lives.
    wait_for(
        lambda: handle.process.poll() is None and time.monotonic() - down_since >= 30,
        what="30 s of API-server outage",
        timeout=45,
        interval=1,
    )
    apiserver.start_component("kube-apiserver")
    wait_for(lambda: _api_ready(apiserver), what="the API server to be ready again", timeout=60)
    client = client_for(apiserver)
    wait_leading(handle, timeout=60)
    changed_at = time.monotonic()
    client.create(codecs.from_dict(pgc_body("after", namespace)))
    _reconciled(client, namespace, "after", timeout=30)
    reaction = time.monotonic() - changed_at
    assert reaction < 20, f"the operator took {reaction:.1f}s to react after the outage"
    assert handle.process.poll() is None
    # An outage is ridden out, not a defect: warnings, and no error with a traceback every
    # two seconds (the leader election's renewals failing logged one each).
    with handle.log.open("rb") as log:
        log.seek(logged_before)
        errors = [line for line in log.read().decode().splitlines() if '"level": "ERROR"' in line]
    assert errors == [], "\n".join(errors[:5])


def _withhold_from_operator(client: Client, group: str, resource: str) -> None:
    """The operator's ClusterRole without ``resource``: its LISTs of it are refused (403)."""
    role = rbac.cluster_role()
    role["rules"] = [
        {**rule, "resources": [r for r in rule["resources"] if r != resource]}
        for rule in role["rules"]
        if rule["resources"] != [resource] or rule["apiGroups"] != [group]
    ]
    client.apply(codecs.from_dict(role), field_manager="stateward-local", force=True)


def _operator_may_list(client: Client, group: str, resource: str) -> bool:
    return _may(client, "list", resource, group)


def test_a_leader_whose_first_lists_are_refused_retries_them_in_its_term(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    # Two clean-clone CI runs lost a cluster's events for good when an API server that had
    # just come back answered the new leader's first LIST with 429: the operator restarted
    # its watches, and the new ones delivered nothing. It must retry the LIST in its term,
    # whatever refused it (here RBAC: a 403 for one kind, given back a moment later).
    grant_operator(bare)
    as_operator = _operator_client(apiserver)
    namespace = _new_namespace(bare)
    bare.create(codecs.from_dict(pgc_body("waiting", namespace)))
    _withhold_from_operator(bare, "policy", "poddisruptionbudgets")
    try:
        wait_for(
            lambda: not _operator_may_list(as_operator, "policy", "poddisruptionbudgets"),
            what="the operator's list of PodDisruptionBudgets to be refused",
        )
        handle = start_operator(
            apiserver,
            extra=["--identity=refused", *FAST_LEASE],
            name=f"operator-refused-{uuid.uuid4().hex[:6]}",
            kubeconfig=apiserver.state_dir / "operator.kubeconfig",  # as granted above
        )
        operators.append(handle)
        wait_for(
            lambda: "could not list the watched objects yet" in handle.log.read_text(),
            what="the leader's first list to be refused",
        )
        # Refused, it does nothing rather than act on a store it could not fill.
        assert bare.get(PostgresClusterResource, "waiting", namespace=namespace).status is None
    finally:
        grant_operator(bare)
    _reconciled(bare, namespace, "waiting")
    log = handle.log.read_text()
    assert "forbidden" in log, log[-2000:]
    assert log.count("leading: starting the watches") == 1, "the watches were restarted"
    assert handle.process.poll() is None
    # The same term goes on following changes: a second cluster is acted on.
    bare.create(codecs.from_dict(pgc_body("later", namespace)))
    _reconciled(bare, namespace, "later")


def test_a_restarted_operator_writes_nothing_for_a_converged_cluster(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    first = _launch(apiserver, operators, "before-restart")
    wait_leading(first)
    namespace = _new_namespace(bare)
    bare.create(codecs.from_dict(pgc_body("steady", namespace)))
    _reconciled(bare, namespace, "steady")
    audit = AuditLog(apiserver.audit_log)
    # Converged means: the status describes the current generation, nothing is queued, and
    # the first operator has reconciled at least twice more (its 5 s progress re-checks)
    # without writing anything. "Queue empty and some writes" alone passed on a busy machine
    # between a reconcile and its follow-up, and the restarted operator then legitimately
    # finished the work.
    seen: dict[str, float] = {}

    def settled() -> bool:
        status = bare.get(PostgresClusterResource, "steady", namespace=namespace).to_dict()
        current = status.get("status", {}).get("observedGeneration") == status["metadata"].get(
            "generation"
        )
        if not current or metric(first.probe_port, "stateward_workqueue_depth") != 0:
            seen.clear()
            return False
        count = float(len(audit.writes(namespace=namespace)))
        reconciles = metric(first.probe_port, "stateward_reconcile_total")
        if not seen or seen["writes"] != count:
            seen.update(writes=count, reconciles=reconciles)
            return False
        return reconciles >= seen["reconciles"] + 2

    wait_for(settled, what="the first operator to converge the cluster", timeout=90, interval=1)
    assert first.stop() == 0
    writes = len(audit.writes(namespace=namespace))
    second = _launch(apiserver, operators, "after-restart")
    wait_leading(second)
    # Its first reconciles (at term start) and one full resync must find nothing to do.
    wait_for(
        lambda: metric(second.probe_port, "stateward_reconcile_total") >= 2,
        what="the restarted operator to reconcile",
    )
    assert len(audit.writes(namespace=namespace)) == writes, [
        (e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("name"))
        for e in audit.writes(namespace=namespace)[writes:]
    ]


def test_a_second_operator_on_a_busy_port_exits_with_one_line_naming_the_flag(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    first = _launch(apiserver, operators, "first")
    wait_leading(first)
    # A second operator on the same host, on the first one's probe port (the default 8081
    # clash): it must say which flag to change and exit, not die with a traceback.
    second = start_operator(
        apiserver,
        extra=["--identity=second", f"--probe-port={first.probe_port}"],
        name="operator-busy-port",
    )
    operators.append(second)
    code = wait_for(lambda: second.process.poll(), what="the second operator to exit")
    output = second.log.read_text()
    assert code == 2
    assert "Traceback" not in output
    assert f"127.0.0.1:{first.probe_port}" in output and "--probe-port" in output
    # The first one was not disturbed.
    assert _ready(first)


def test_the_operator_creates_its_lease_namespace_when_it_is_missing(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    # The kubebuilder habit: `make install` (CRDs only), then the operator on a workstation,
    # with no namespace made by `make deploy` — by the cluster admin who ran `make install`
    # (the operator user, holding only the generated roles, may not create namespaces).
    namespace = f"stateward-{uuid.uuid4().hex[:8]}"
    handle = start_operator(
        apiserver,
        extra=["--identity=fresh", *FAST_LEASE],
        name="operator-fresh-namespace",
        namespace=namespace,
        kubeconfig=apiserver.kubeconfig,
    )
    operators.append(handle)
    try:
        wait_leading(handle)
        lease = bare.get(Lease, "stateward-operator-leader", namespace=namespace)
        assert lease.spec is not None and lease.spec.holderIdentity == "fresh"
    finally:
        handle.stop()
        bare.delete(Namespace, namespace)


# --- the operator's identity: an ordinary user holding only the generated roles -----------


def _operator_client(cluster: LocalCluster) -> Client:
    return client_for(cluster, kubeconfig=cluster.state_dir / "operator.kubeconfig")


def _may(client: Client, verb: str, resource: str, group: str = "", namespace: str = "") -> bool:
    review = client.create(
        SelfSubjectAccessReview(
            spec=SelfSubjectAccessReviewSpec(
                resourceAttributes=ResourceAttributes(
                    verb=verb, resource=resource, group=group, namespace=namespace or None
                )
            )
        )
    )
    return bool(review.status and review.status.allowed)


def test_the_operator_user_is_not_a_cluster_admin(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    handle = _launch(apiserver, operators, "ordinary")
    wait_leading(handle)
    as_operator = _operator_client(apiserver)

    review = as_operator.create(SelfSubjectReview())
    user = review.status.userInfo if review.status else None
    assert user is not None and user.username == OPERATOR_USER
    assert "system:masters" not in (user.groups or [])
    # What the generated roles grant, and nothing past them.
    assert _may(as_operator, "patch", "postgresclusters/status", "stateward.io", "anywhere")
    assert _may(as_operator, "update", "leases", "coordination.k8s.io", OPERATOR_NAMESPACE)
    assert not _may(as_operator, "update", "leases", "coordination.k8s.io", "kube-node-lease")
    assert not _may(as_operator, "create", "clusterroles", "rbac.authorization.k8s.io")
    assert not _may(as_operator, "create", "namespaces")
    assert not _may(as_operator, "delete", "nodes")
    assert not _may(as_operator, "impersonate", "users")
    assert not _may(as_operator, "create", "pods", namespace="default")


def test_a_permission_taken_from_the_operator_fails_it_visibly(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    # Without system:masters, the bindings are all the operator holds: take the Lease rule
    # away and it must stop leading, saying why; give it back and it leads again.
    handle = _launch(apiserver, operators, "trimmed")
    wait_leading(handle)
    bare.delete(RoleBinding, LOCAL_BINDING, namespace=OPERATOR_NAMESPACE)
    try:
        # The log is JSON: the API server's quotes around the user name come escaped.
        refusal = f'forbidden: User \\"{OPERATOR_USER}\\" cannot get resource \\"leases\\"'
        wait_for(
            lambda: (
                metric(handle.probe_port, "stateward_leader") == 0
                and refusal in handle.log.read_text()
            ),
            what="the operator to lose the Lease to a 403",
        )
    finally:
        grant_operator(admin_client(apiserver))
    wait_leading(handle)


# --- the webhook certificate: reloaded when the Secret changes, mismatch reported -----------


def _served_fingerprint(handle: OperatorProcess) -> str | None:
    """SHA-256 of the certificate the operator's webhook port presents, by a TLS handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # we read the certificate, we do not trust it
    try:
        with (
            socket.create_connection(("127.0.0.1", handle.webhook_port), timeout=5) as raw,
            context.wrap_socket(raw) as tls,
        ):
            der = tls.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None
    return hashlib.sha256(der).hexdigest() if der else None


def _replace_certificate(client: Client, certificate: webhook.Certificate) -> None:
    secret = client.get(Secret, webhook.CERT_SECRET, namespace=OPERATOR_NAMESPACE)
    secret.data = certificate.secret_data()
    client.replace(secret)


def _serves(handle: OperatorProcess, certificate: webhook.Certificate, *, matching: bool) -> bool:
    mismatch = metric(handle.probe_port, "stateward_webhook_certificate_mismatch")
    return _served_fingerprint(handle) == certificate.fingerprint and mismatch == (
        0 if matching else 1
    )


def test_the_webhook_serves_a_replaced_certificate_and_reports_one_it_cannot_serve(
    apiserver: LocalCluster, bare: Client, operators: list[OperatorProcess]
) -> None:
    handle = _launch(apiserver, operators, "certs")
    wait_leading(handle)
    hosts = ("127.0.0.1", "localhost")  # start_operator's --webhook-host=127.0.0.1
    secret = bare.get(Secret, webhook.CERT_SECRET, namespace=OPERATOR_NAMESPACE)
    started_with = webhook.Certificate.from_secret(secret)
    assert started_with is not None
    wait_for(
        lambda: _serves(handle, started_with, matching=True),
        what="the webhook to serve the Secret's certificate",
    )

    # Another replica (or a person) rotates the certificate: CA and serving pair both new.
    rotated = webhook.make_certificate(hosts)
    _replace_certificate(bare, rotated)
    wait_for(
        lambda: _serves(handle, rotated, matching=True),
        what="the webhook to serve the rotated certificate",
        timeout=60,
    )
    assert metric(handle.probe_port, "stateward_webhook_certificate_reloads_total") >= 1

    # The leader points the API server at the new CA, and admission works through it: the
    # API server calls the webhook, trusts the new certificate, and the webhook refuses a
    # schedule that never fires (failurePolicy Ignore would admit it on a TLS failure).
    def ca_bundle() -> bytes:
        found = bare.get(ValidatingWebhookConfiguration, webhook.CONFIGURATION_NAME)
        (hook,) = found.webhooks or []
        return base64.b64decode(hook.clientConfig.caBundle or "")

    wait_for(lambda: ca_bundle() == rotated.ca, what="the webhook configuration's new CA")
    namespace = _new_namespace(bare)

    def refused_by_the_webhook() -> bool:
        body = pgc_body("feb30", namespace, backupSchedule="0 0 30 2 *", backup=clusters.BACKUP)
        try:
            bare.create(codecs.from_dict(body), dry_run=True)
        except ApiError as error:
            return "admission webhook" in str(error.status.message)
        return False

    wait_for(refused_by_the_webhook, what="admission through the rotated certificate")

    # A certificate this replica cannot serve (not for its hosts): it keeps the one it has,
    # writes nothing, and says so (gauge, Warning Event on the Secret).
    foreign = webhook.make_certificate(("stateward-webhook.elsewhere.svc",))
    _replace_certificate(bare, foreign)
    try:
        wait_for(
            lambda: _serves(handle, rotated, matching=False),
            what="the mismatch to be reported while the previous certificate is served",
            timeout=60,
        )

        def warned() -> bool:
            return any(
                event.reason == "WebhookCertificateMismatch"
                and event.type == "Warning"
                and event.involvedObject.name == webhook.CERT_SECRET
                and foreign.fingerprint is not None
                and foreign.fingerprint in (event.message or "")
                for event in bare.list(Event, namespace=OPERATOR_NAMESPACE)
            )

        wait_for(warned, what="a Warning Event about the mismatch")
        stored = webhook.Certificate.from_secret(
            bare.get(Secret, webhook.CERT_SECRET, namespace=OPERATOR_NAMESPACE)
        )
        assert stored == foreign  # not fought over
    finally:
        _replace_certificate(bare, rotated)
    wait_for(
        lambda: _serves(handle, rotated, matching=True),
        what="the mismatch to clear once the Secret is servable again",
        timeout=60,
    )
