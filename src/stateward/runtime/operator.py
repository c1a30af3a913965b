"""The operator process: leader election, Kopf watches feeding a work queue, probes, metrics.

Kopf is used level-triggered only: ``on.event`` handlers record each observed body in the
store and enqueue the owning cluster; no change handlers, so Kopf never writes its own
annotations or finalizers anywhere. Reconciles run from our work queue, one cluster at a time
per key, with a periodic resync of every known cluster.

Only the leader runs Kopf and the queue. A leader that cannot renew its Lease stops both at
once (and its writes are refused even before that, see ``Kube.may_write``), drops what it had
observed, and campaigns again: after an API-server outage the process comes back by itself
with fresh watches instead of relying on a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any, Final

import httpx2
import kopf
from aiohttp import web
from kopf._core.reactor import inventory  # the type kopf.operator(memories=) takes
from lightkube import ApiError, AsyncClient
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pythonjsonlogger.json import JsonFormatter

from stateward.api import v1alpha1
from stateward.controllers.database import DatabaseReconciler
from stateward.controllers.kube import FIELD_MANAGER, UNREACHABLE, Kube, transient
from stateward.controllers.postgres.members import progress_only
from stateward.controllers.postgres.reconcile import Reconciler
from stateward.controllers.queue import Outcome, WorkQueue
from stateward.controllers.store import CLUSTER_LABEL, ObjectStore
from stateward.runtime import metrics, webhook
from stateward.runtime.leader import LeaderElector

logger = logging.getLogger("stateward")

MANAGED_BY = "app.kubernetes.io/managed-by=stateward"
PRIMARY_KINDS = (v1alpha1.KIND, v1alpha1.DATABASE_KIND)
"""The kinds users create and the operator reconciles: the work queue's keys are
``(kind, namespace, name)``. A postgres Database owns a PostgresCluster, which is both."""
PRIMARY_RESOURCES = (
    (v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.PLURAL, v1alpha1.KIND),
    (v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.DATABASE_PLURAL, v1alpha1.DATABASE_KIND),
)
Key = tuple[str, str, str]
ALL_NAMESPACES = "*"  # lightkube's spelling of a cluster-wide list

# (api group, version, plural, kind) of every child kind the operator watches.
CHILD_RESOURCES = (
    ("apps", "v1", "statefulsets", "StatefulSet"),
    ("apps", "v1", "deployments", "Deployment"),
    ("", "v1", "services", "Service"),
    ("", "v1", "configmaps", "ConfigMap"),
    ("", "v1", "secrets", "Secret"),
    ("", "v1", "serviceaccounts", "ServiceAccount"),
    ("", "v1", "pods", "Pod"),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    ("batch", "v1", "cronjobs", "CronJob"),
    ("batch", "v1", "jobs", "Job"),
)


class NoDiffBase(kopf.DiffBaseStorage):
    """Kopf's per-event "essence" of a body, turned off. Kopf builds one for every event of
    every watched resource (a deep copy of the body, another to strip its progress, and a
    diff against the last) for its change-detecting handlers; this operator registers only
    event handlers and compares what it observes itself, so nothing ever read it, and it
    cost about a tenth of the operator's CPU while a thousand clusters were created."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return None

    def fetch(self, *, body: kopf.Body) -> None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


class UnheldMemories(inventory.ResourceMemories):
    """Kopf's memory of each object, not kept between events. Kopf remembers every object it
    has seen (a memo, an error throttler, index and daemon state: about 0.9 KB each, measured
    with tracemalloc) for its change handlers, daemons and indices; this operator registers
    only event handlers and keeps its own store, so nothing read them between two events of
    an object. At 1000 clusters, about 20 watched objects each, they held ~18 MiB of an RSS
    goal of 200. Each event gets a fresh memory, which Kopf's event handling reads and
    drops."""

    async def recall(
        self,
        raw_body: Any,
        *,
        memobase: Any = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> inventory.ResourceMemory:
        return await super().recall(
            raw_body, memobase=memobase, noticed_by_listing=noticed_by_listing, ephemeral=True
        )


class StartupError(Exception):
    """The operator cannot start as configured; the message says what to change."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    namespace: str = "stateward-system"
    lease_name: str = "stateward-operator-leader"
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    resync_interval: float = 300.0
    workers: int = 8
    probe_address: str = "0.0.0.0"  # noqa: S104 - probes and metrics serve the kubelet/Prometheus
    probe_port: int = 8081
    webhook_address: str = "0.0.0.0"  # noqa: S104
    webhook_port: int = 9443
    webhook_host: str | None = None
    webhook_service: str | None = None
    webhooks: bool = True
    webhook_certificate_interval: float = 30.0
    watch_namespaces: tuple[str, ...] = ()
    """Namespaces whose PostgresClusters this operator runs; empty: every namespace."""
    log_level: str = "INFO"
    foreign_repository_paths: bool = False
    """Let repository paths leave their namespace's prefix (``--allow-foreign-repository-paths``):
    off, a cluster cannot name another namespace's backups."""
    image_pins: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """``REPOSITORY:TAG`` to the digest every container of that image runs by
    (``--pin-image``, ``specs.pinning``)."""
    operator_image: str = ""
    """This operator's image (``--operator-image``), which backup Jobs run; in a pod, the
    pod's own image is read instead (:func:`own_image`)."""


class Operator:
    def __init__(self, options: Options, client: AsyncClient) -> None:
        self.options = options
        self.operator_image = options.operator_image
        identity = options.identity or f"{socket.gethostname()}-{os.getpid()}"
        self.elector = LeaderElector(
            client,
            namespace=options.namespace,
            name=options.lease_name,
            identity=identity,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
        )
        self.kube = Kube(
            client,
            may_write=self.elector.is_leader,
            on_write=lambda verb, kind: metrics.API_WRITES.labels(verb, kind).inc(),
            on_event=lambda reason, type: metrics.EVENTS.labels(reason, type).inc(),
        )
        metrics.CLUSTERS.source = lambda: self.store
        self._new_reconcilers()
        self.queue: WorkQueue[Key] = WorkQueue(
            self._reconcile, workers=options.workers, transient=transient
        )
        self.kopf_ready = asyncio.Event()
        self.client = client
        self.endpoint = webhook.Endpoint(
            namespace=options.namespace,
            port=options.webhook_port,
            service=options.webhook_service,
            host=options.webhook_host,
        )
        self.certificate: webhook.Certificate | None = None
        self.admission: webhook.AdmissionServer | None = None
        self.certificate_monitor: webhook.CertificateMonitor | None = None

    async def _reconcile(self, key: Key) -> Outcome:
        kind, namespace, name = key
        started = time.monotonic()
        try:
            if kind == v1alpha1.DATABASE_KIND:
                outcome = await self.databases.reconcile((namespace, name))
            else:
                outcome = await self.reconciler.reconcile((namespace, name))
        except Exception:
            metrics.RECONCILES.labels(kind, "error").inc()
            metrics.RECONCILE_ERRORS.labels(kind).inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.labels(kind).observe(time.monotonic() - started)
            metrics.QUEUE_DEPTH.set(len(self.queue))
        metrics.RECONCILES.labels(kind, "success").inc()
        return outcome

    # --- watch events --------------------------------------------------------------------

    def on_cluster_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A PostgresCluster or a Database changed: reconcile it (unless only its status
        moved), and its owner when it is a Database's PostgresCluster."""
        metadata = body["metadata"]
        kind = body.get("kind") or v1alpha1.KIND
        key = (kind, metadata["namespace"], metadata["name"])
        if event_type == "DELETED":
            self.store.deleted(body)
            self.queue.forget(key)
            reconciler = self.reconciler if kind == v1alpha1.KIND else self.databases
            reconciler.forget(metadata["namespace"], metadata["name"])
        else:
            previous = self.store.get(*key)
            self.store.observe(body)
            # Status-only updates (ours, mostly) change neither generation nor metadata we
            # act on; reacting to them would only make a second, empty reconcile.
            if previous is None or not _same_intent(previous, body):
                self.queue.add(key, urgent=True)  # the user's intent: even past a backoff
        metrics.WATCHED_OBJECTS.set(len(self.store))
        if kind == v1alpha1.KIND:
            self._enqueue_owners(metadata, exclude=kind)

    def on_child_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        metadata = body["metadata"]
        if event_type == "DELETED":
            self.store.deleted(body)
        else:
            key = (body["kind"], metadata.get("namespace", ""), metadata["name"])
            previous = self.store.get(*key)
            self.store.observe(body)
            current = self.store.get(*key)
            if previous is not None and current is not None and progress_only(previous, current):
                metrics.EVENTS_FILTERED.inc()
                return
        metrics.WATCHED_OBJECTS.set(len(self.store))
        self._enqueue_owners(metadata)

    def _enqueue_owners(self, metadata: dict[str, Any], exclude: str = "") -> None:
        """Every known PostgresCluster or Database that the object's cluster label names:
        a postgres Database and its PostgresCluster share a name and both follow the pods."""
        cluster = (metadata.get("labels") or {}).get(CLUSTER_LABEL)
        if not cluster:
            return
        namespace = metadata.get("namespace", "")
        for kind in PRIMARY_KINDS:
            if kind != exclude and self.store.has(kind, namespace, cluster):
                self.queue.add((kind, namespace, cluster))

    async def _reclaim_signals(self, stop: asyncio.Event) -> None:
        """Kopf installs its own SIGINT/SIGTERM handlers when it starts; take them back.

        Kopf treats a signal as an unplanned stop (and arms a last-resort SIGKILL); ours ends
        the term through the stop flag and then the process, cleanly and with exit code 0.
        """
        await self.kopf_ready.wait()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)

    async def _prime_store_while_leading(
        self, stop: asyncio.Event, kopf_task: asyncio.Task[Any]
    ) -> bool:
        """:meth:`_prime_store` until it succeeds (True), within this term and with the
        watches already running; False once the process stops, the Lease is lost or Kopf
        ended. An API server that just came back answers lists with 429 for a moment
        ("storage is (re)initializing"). Kopf is not stopped and started again for that: a
        restart right after its start left the new term with watches that delivered nothing,
        so the store never saw another change (two clean-clone CI runs)."""
        while True:
            try:
                await self._prime_store()
                return True
            except Exception as error:
                logger.warning("could not list the watched objects yet: %s; retrying", error)
            await _first(
                stop.wait(),
                self.elector.lost.wait(),
                kopf_task,
                asyncio.sleep(self.options.retry_period),
            )
            if stop.is_set() or self.elector.lost.is_set() or kopf_task.done():
                return False

    async def _prime_store(self) -> None:
        """List every watched kind once before the first reconcile.

        Kopf's watches deliver the existing objects too, but without saying when the initial
        listing is complete; a reconcile that ran before the Secrets or the StatefulSets had
        arrived would take them for missing. One LIST per kind makes the first reconcile of a
        new term as well-informed as every later one (and a restart write nothing).
        """
        kinds = [(f"{g}/{v}" if g else v, kind) for g, v, _plural, kind in CHILD_RESOURCES]
        kinds += [(v1alpha1.API_VERSION, kind) for kind in PRIMARY_KINDS]
        listed = await asyncio.gather(
            *(
                self.kube.list_objects(
                    api_version,
                    kind,
                    namespace,
                    {} if kind in PRIMARY_KINDS else {"app.kubernetes.io/managed-by": "stateward"},
                )
                for namespace in self.options.watch_namespaces or (ALL_NAMESPACES,)
                for api_version, kind in kinds
            )
        )
        for bodies in listed:
            for body in bodies:
                self.store.observe(body)
        metrics.WATCHED_OBJECTS.set(len(self.store))

    async def resync(self) -> None:
        while True:
            await self._ensure_webhook_configuration()
            await asyncio.sleep(self.options.resync_interval)
            self._enqueue_all()

    def _enqueue_all(self) -> None:
        for kind in PRIMARY_KINDS:
            for namespace, name in self.store.names(kind):
                self.queue.add((kind, namespace, name))

    async def _ensure_webhook_configuration(self) -> None:
        if self.certificate is None:
            return
        try:
            if await webhook.ensure_configuration(self.kube, self.endpoint, self.certificate):
                logger.info("pointed the webhook configuration at %s", self.endpoint)
        except Exception as error:  # retried at the next resync
            logger.warning("could not update the webhook configuration: %s", error)

    async def _start_admission(self, stop: asyncio.Event) -> None:
        """Serve admission in every replica; retry the shared certificate until it exists."""
        delay = 1.0
        while not stop.is_set():
            try:
                self.certificate = await webhook.ensure_certificate(self.client, self.endpoint)
                break
            except Exception as error:
                logger.warning("webhook certificate not available yet: %s", error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 30.0)
        if self.certificate is None:
            return
        self.admission = webhook.AdmissionServer(
            address=self.options.webhook_address,
            port=self.options.webhook_port,
            certificate=self.certificate,
            foreign_repository_paths=self.options.foreign_repository_paths,
        )
        await self.admission.start()
        logger.info("admission webhook serving on port %d", self.options.webhook_port)
        self.certificate_monitor = webhook.CertificateMonitor(
            self.client,
            self.endpoint,
            self.admission,
            identity=self.elector.identity,
            on_change=self._certificate_changed,
        )
        await self.certificate_monitor.check()

    async def _watch_certificate(self, stop: asyncio.Event) -> None:
        """Re-read the webhook certificate's Secret periodically, in every replica: another
        replica may have renewed it, and a replica serving a stale one fails silently."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.options.webhook_certificate_interval)
            if stop.is_set() or self.certificate_monitor is None:
                return
            # The next check tries again; the gauge keeps its verdict.
            try:
                await self.certificate_monitor.check()
            except Exception as error:
                if transient(error):
                    logger.warning("the webhook certificate check failed: %s", error)
                else:
                    logger.exception("the webhook certificate check failed")

    async def _certificate_changed(self, certificate: webhook.Certificate) -> None:
        self.certificate = certificate
        if self.elector.is_leader():
            await self._ensure_webhook_configuration()

    # --- Kopf -----------------------------------------------------------------------------

    def registry(self) -> kopf.OperatorRegistry:
        registry = kopf.OperatorRegistry()

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.posting.enabled = False
            settings.persistence.diffbase_storage = NoDiffBase()
            settings.peering.standalone = True
            settings.scanning.disabled = True
            # Watches are restarted by the server every minute at most; a stream that has
            # gone quiet for longer than that is dead, however healthy its socket looks.
            settings.watching.server_timeout = 60
            settings.watching.client_timeout = 90
            settings.watching.connect_timeout = 10
            settings.watching.inactivity_timeout = 75
            settings.networking.request_timeout = 30
            settings.networking.connect_timeout = 10
            for _group, _version, plural, _kind in CHILD_RESOURCES:
                settings.watching.label_selectors[plural] = MANAGED_BY

        @kopf.on.login(registry=registry)
        def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"):
                return kopf.login_with_service_account(**kwargs)
            return kopf.login_with_kubeconfig(**kwargs)

        for group, version, plural, kind in PRIMARY_RESOURCES:

            async def cluster_event(*, event: Any, _kind: str = kind, **_: Any) -> None:
                # Async on purpose: Kopf runs sync handlers in a thread pool, and the store
                # and the queue belong to the event loop.
                body = event["object"]
                if "kind" not in body:
                    body = {**body, "kind": _kind}
                self.on_cluster_event(event.get("type"), body)

            kopf.on.event(group, version, plural, id=f"observe-{plural}", registry=registry)(
                cluster_event
            )

        for group, version, plural, kind in CHILD_RESOURCES:

            async def child_event(*, event: Any, _kind: str = kind, **_: Any) -> None:
                body = event["object"]  # the raw dict; the store keeps its own slim copy
                if "kind" not in body:
                    body = {**body, "kind": _kind}
                self.on_child_event(event.get("type"), body)

            kopf.on.event(
                group or "",
                version,
                plural,
                id=f"observe-{plural}",
                registry=registry,
            )(child_event)

        return registry

    # --- process ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> int:
        """Campaign; while leading, watch and reconcile; on losing the Lease, stop and campaign
        again. Returns 0 on a requested stop, 1 if Kopf itself failed."""
        await self._ensure_namespace()
        await self._learn_own_image()
        probes = await self._start_probes()
        watch_certificate: asyncio.Task[None] | None = None
        if self.options.webhooks:
            await self._start_admission(stop)
            watch_certificate = asyncio.create_task(self._watch_certificate(stop))
        election = asyncio.create_task(self.elector.run(stop))
        try:
            while not stop.is_set():
                await _first(self.elector.acquired.wait(), stop.wait(), election)
                if stop.is_set() or election.done():
                    break
                outcome = await self._lead(stop)
                if outcome == "kopf-failed":
                    return 1
            return 0
        finally:
            metrics.LEADER.set(0)
            stop.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(election, 5)
            if watch_certificate is not None:
                watch_certificate.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watch_certificate
            if self.admission is not None:
                await self.admission.stop()
            await probes.cleanup()

    async def _ensure_namespace(self) -> None:
        """The Lease (and the webhook Secret) live in ``options.namespace``. ``make deploy``
        creates it; a user who ran ``make install`` and then the operator on their machine has
        none, so create it when allowed, or say in one line what to run."""
        namespace = self.options.namespace
        try:
            await self.client.get(Namespace, namespace)
            return
        except ApiError as error:
            if error.status.code != 404:
                return  # e.g. in-cluster without permission to read namespaces: it exists
        try:
            await self.client.create(Namespace(metadata=ObjectMeta(name=namespace)))
            logger.info("created namespace %s for the leader Lease", namespace)
        except ApiError as error:
            if error.status.code == 409:
                return
            raise StartupError(
                f"namespace {namespace!r} (--namespace) does not exist and this user may not"
                f" create it ({error.status.reason}): run `kubectl create namespace {namespace}`"
                " or `make deploy`, or pass --namespace with an existing namespace"
            ) from None

    async def _learn_own_image(self) -> None:
        """In a pod (``POD_NAME``), the image it runs, by digest when the runtime reports
        one: what backup Jobs run. Else ``--operator-image``; else each cluster's own."""
        pod_name = os.environ.get("POD_NAME")
        if not pod_name:
            return
        try:
            pod = await self.client.get(Pod, pod_name, namespace=self.options.namespace)
        except (ApiError, *UNREACHABLE) as error:
            logger.warning(
                "cannot read this operator's pod %s to learn its image (%s); backup Jobs run %s",
                pod_name, error, self.operator_image or "each cluster's instance image",
            )  # fmt: skip
            return
        self.operator_image = own_image(pod.to_dict()) or self.operator_image

    def _new_reconcilers(self) -> None:
        """An empty store and the reconcilers over it (each term as leader starts afresh)."""
        self.store = ObjectStore()
        self.reconciler = Reconciler(
            self.kube,
            self.store,
            foreign_repository_paths=self.options.foreign_repository_paths,
            operator_namespace=self.options.namespace,
            image_pins=self.options.image_pins,
            backup_image=self.operator_image or None,
        )
        self.databases = DatabaseReconciler(
            self.kube,
            self.store,
            leadership=self.elector.term_left,
            operator_namespace=self.options.namespace,
            image_pins=self.options.image_pins,
        )

    async def _lead(self, stop: asyncio.Event) -> str:
        """One term as leader: Kopf watches and the work queue run until it ends."""
        metrics.LEADER.set(1)
        logger.info("leading: starting the watches")
        self._new_reconcilers()
        self.kopf_ready.clear()
        kopf_stop = asyncio.Event()
        kopf_task = asyncio.create_task(
            kopf.operator(
                registry=self.registry(),
                clusterwide=not self.options.watch_namespaces,
                namespaces=list(self.options.watch_namespaces),
                standalone=True,
                memories=UnheldMemories(),
                stop_flag=kopf_stop,
                ready_flag=self.kopf_ready,
            )
        )
        resync: asyncio.Task[None] | None = None
        reclaim = asyncio.create_task(self._reclaim_signals(stop))
        try:
            if await self._prime_store_while_leading(stop, kopf_task):
                self.queue.start()
                self._enqueue_all()
                resync = asyncio.create_task(self.resync())
                await _first(stop.wait(), self.elector.lost.wait(), kopf_task)
        finally:
            reclaim.cancel()
            kopf_stop.set()
            if resync is not None:
                resync.cancel()
            await self.queue.stop()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(kopf_task, 10)
            metrics.LEADER.set(0)
        if self.elector.lost.is_set():
            logger.warning("leadership lost: stopped reconciling; campaigning again")
            self.elector.reset()
            return "lost"
        if not stop.is_set():
            logger.error("Kopf stopped unexpectedly; exiting")
            return "kopf-failed"
        return "stopped"

    async def _start_probes(self) -> web.AppRunner:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            # Every replica serves admission, so a standby is Ready; a leader is Ready once
            # its watches are up.
            if self.options.webhooks and self.admission is None:
                return web.Response(status=503, text="admission webhook not serving yet")
            if self.elector.is_leader() and not self.kopf_ready.is_set():
                return web.Response(status=503, text="leader: watches starting")
            return web.Response(text="ok")

        async def serve_metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(metrics.REGISTRY),
                headers={"Content-Type": CONTENT_TYPE_LATEST},
            )

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", serve_metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.options.probe_address, self.options.probe_port).start()
        return runner


def own_image(pod: Mapping[str, Any], container: str = "operator") -> str | None:
    """The image ``container`` of ``pod`` runs: by the digest the runtime resolved
    (``status.containerStatuses[].imageID``, ``REPOSITORY@sha256:...``) when it reports
    one, else as the pod spec names it; None when the pod has no such container."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            resolved = str(status.get("imageID") or "").removeprefix("docker-pullable://")
            if "@sha256:" in resolved:
                return resolved
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container and spec.get("image"):
            return str(spec["image"])
    return None


def _same_intent(previous: dict[str, Any], current: dict[str, Any]) -> bool:
    """True when only status (or bookkeeping) changed between two bodies of one cluster."""
    before, after = previous["metadata"], current["metadata"]
    return bool(
        before.get("uid") == after.get("uid")
        and before.get("generation") == after.get("generation")
        and before.get("deletionTimestamp") == after.get("deletionTimestamp")
        and before.get("finalizers") == after.get("finalizers")
        and before.get("labels") == after.get("labels")
        and all(
            (before.get("annotations") or {}).get(key) == (after.get("annotations") or {}).get(key)
            for key in v1alpha1.REQUEST_ANNOTATIONS
        )
    )


async def _first(*waitables: Any) -> None:
    tasks = [w if isinstance(w, asyncio.Task) else asyncio.ensure_future(w) for w in waitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            if task not in waitables:
                task.cancel()


def _check_port(address: str, port: int, flag: str) -> None:
    """Fail before anything starts if a port we serve on is taken (the usual cause: another
    operator already runs on this host)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as error:
            raise StartupError(
                f"cannot listen on {address}:{port} ({error.strerror}); another operator may"
                f" be running on this host: stop it or pass {flag} with a free port"
            ) from None


CHATTY_LOGGERS = (
    # lightkube 1.0 speaks HTTP through httpx2 (its fork of httpx, a separate distribution),
    # which logs every request at INFO under the logger "httpx2"; leases alone would drown
    # the log. The name is httpx2's, not a typo: quieting "httpx" alone misses every API call.
    "httpx2",
    # Our own direct HTTP calls (controllers/kube.py) use httpx, which logs the same way.
    "httpx",
    # Kopf reports every successful event handler at INFO; ours only record observations.
    "kopf.objects",
)
"""Loggers raised to WARNING when the operator runs."""


def quiet_chatty_loggers() -> None:
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class RetriesAreWarnings(logging.Filter):
    """Kopf logs every failed attempt of a request it will retry at ERROR ("Request attempt
    #1/9 failed; will retry"): an API server restarting makes a burst of them, although
    nothing is wrong yet. They become warnings; the attempt it gives up on ("escalating")
    stays an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.ERROR
            and record.name.startswith("kopf.")
            and "; will retry:" in record.getMessage()
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def run(options: Options) -> int:
    """Run until SIGINT/SIGTERM (exit 0) or lost leadership (exit 1). Raises StartupError,
    with a message naming the flag to change, when it cannot start."""
    _check_port(options.probe_address, options.probe_port, "--probe-port")
    if options.webhooks:
        _check_port(options.webhook_address, options.webhook_port, "--webhook-port")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    )
    handler.addFilter(RetriesAreWarnings())
    logging.basicConfig(level=options.log_level.upper(), handlers=[handler])
    quiet_chatty_loggers()

    async def main() -> int:
        client = api_client(KubeConfig.from_env())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            return await Operator(options, client).run(stop)
        finally:
            await client.close()

    return asyncio.run(main())


API_CONNECTIONS: Final = 100
"""Connections to the API server the operator keeps open for its requests (Kopf's watches
have their own). httpx keeps at most 20 idle: with 8 reconciles fanning their writes out, the
connections above 20 were closed after every burst and opened again, each with a TLS
handshake, about 8 % of the operator's CPU while 300 clusters were created, and the API
server paid its half of each."""


def api_client(config: KubeConfig) -> AsyncClient:
    """The operator's API client: lightkube's, with a connection pool that keeps
    :data:`API_CONNECTIONS` open. The transport verifies the server and presents the client
    certificate exactly as lightkube would (its own ``verify_cluster``); the credentials of
    the kubeconfig (token, exec plugin) stay lightkube's."""
    single = config.get()
    if single is None or single.user is None:
        raise RuntimeError("the kubeconfig names no current context with a user")
    limits = httpx2.Limits(
        max_connections=API_CONNECTIONS, max_keepalive_connections=API_CONNECTIONS
    )
    verify = verify_cluster(single.cluster, single.user, single.abs_file)
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=limits)
    return AsyncClient(single, field_manager=FIELD_MANAGER, transport=transport)
