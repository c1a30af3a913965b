"""The operator process: leader election, watches feeding a work queue, probes, metrics.

Level-triggered only: each watch (``runtime.watch``, one per kind) records every observed body
in the store and enqueues the owning cluster; reconciles run from our work queue, one cluster
at a time per key, with a periodic resync of every known cluster. Nothing is written to the
watched objects for the watching's sake (no bookkeeping annotations or finalizers).

Only the leader runs the watches and the queue. A leader that cannot renew its Lease stops both
at once (and its writes are refused even before that, see ``Kube.may_write``), drops what it
had observed, and campaigns again: after an API-server outage the process comes back by itself
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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import httpx2
import uvloop
from aiohttp import web
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
from stateward.runtime.transport import WatchTransport, for_kubeconfig
from stateward.runtime.watch import Body, Resource, Watch

logger = logging.getLogger("stateward")

MANAGED_BY = "app.kubernetes.io/managed-by=stateward"
PRIMARY_KINDS = (v1alpha1.KIND, v1alpha1.DATABASE_KIND)
"""The kinds users create and the operator reconciles: the work queue's keys are
``(kind, namespace, name)``. A postgres Database owns a PostgresCluster, which is both."""
PRIMARY_RESOURCES = (
    Resource(v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.PLURAL, v1alpha1.KIND),
    Resource(v1alpha1.GROUP, v1alpha1.VERSION, v1alpha1.DATABASE_PLURAL, v1alpha1.DATABASE_KIND),
)
Key = tuple[str, str, str]

# Every child kind the operator watches, narrowed to what it manages (MANAGED_BY).
CHILD_RESOURCES = (
    Resource("apps", "v1", "statefulsets", "StatefulSet"),
    Resource("apps", "v1", "deployments", "Deployment"),
    Resource("", "v1", "services", "Service"),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "secrets", "Secret"),
    Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    Resource("", "v1", "pods", "Pod"),
    Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    Resource("batch", "v1", "cronjobs", "CronJob"),
    Resource("batch", "v1", "jobs", "Job"),
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
    def __init__(self, options: Options, client: AsyncClient, transport: WatchTransport) -> None:
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
            transport,
            may_write=self.elector.is_leader,
            on_write=lambda verb, kind: metrics.API_WRITES.labels(verb, kind).inc(),
            on_event=lambda reason, type: metrics.EVENTS.labels(reason, type).inc(),
            in_flight=API_REQUESTS,
        )
        metrics.CLUSTERS.source = lambda: self.store
        self._new_reconcilers()
        self.queue: WorkQueue[Key] = WorkQueue(
            self._reconcile, workers=options.workers, transient=transient
        )
        self.watches_synced = asyncio.Event()
        self.client = client
        self.transport = transport
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
        kind = body["kind"]
        if event_type == "DELETED":
            self.store.deleted(body)
        elif self.store.holds(body):  # the echo of our own write, observed from its response
            metrics.EVENTS_FILTERED.inc()
            metrics.WATCH_EVENTS.labels(kind, "filtered").inc()
            return
        else:
            key = (kind, metadata.get("namespace", ""), metadata["name"])
            previous = self.store.get(*key)
            self.store.observe(body)
            current = self.store.get(*key)
            if previous is not None and current is not None and progress_only(previous, current):
                metrics.EVENTS_FILTERED.inc()
                metrics.WATCH_EVENTS.labels(kind, "filtered").inc()
                return
        metrics.WATCHED_OBJECTS.set(len(self.store))
        enqueued = self._enqueue_owners(metadata)
        metrics.WATCH_EVENTS.labels(kind, "reconcile" if enqueued else "none").inc()

    def _enqueue_owners(self, metadata: dict[str, Any], exclude: str = "") -> bool:
        """Every known PostgresCluster or Database that the object's cluster label names:
        a postgres Database and its PostgresCluster share a name and both follow the pods.
        True if there was one."""
        cluster = (metadata.get("labels") or {}).get(CLUSTER_LABEL)
        if not cluster:
            return False
        namespace = metadata.get("namespace", "")
        enqueued = False
        for kind in PRIMARY_KINDS:
            if kind != exclude and self.store.has(kind, namespace, cluster):
                self.queue.add((kind, namespace, cluster))
                enqueued = True
        return enqueued

    async def resync(self) -> None:
        while True:
            await self._ensure_webhook_configuration()
            await asyncio.sleep(self.options.resync_interval)
            self._enqueue_all()

    def _enqueue_all(self) -> None:
        """Every cluster and Database, behind whatever else waits: a resync finds nothing to
        do in nearly all of them, and a changed spec or a lost pod must not wait for that
        (at 1000 clusters, a change that came just after a resync waited 0.76 s)."""
        for kind in PRIMARY_KINDS:
            for namespace, name in self.store.names(kind):
                self.queue.add((kind, namespace, name), background=True)

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

    # --- watches ----------------------------------------------------------------------------

    def _new_watches(self) -> list[Watch]:
        """One watch per kind and watched namespace (or one per kind for all namespaces):
        the clusters and Databases whole, their children by the managed-by label."""
        transport = self.transport
        namespaces: Iterable[str | None] = self.options.watch_namespaces or (None,)
        watches = []
        for namespace in namespaces:
            for resource in PRIMARY_RESOURCES:
                watches.append(
                    Watch(
                        transport, resource, self.on_cluster_event,
                        namespace=namespace, known=self._known(resource.kind),
                    )
                )  # fmt: skip
            for resource in CHILD_RESOURCES:
                watches.append(
                    Watch(
                        transport, resource, self.on_child_event,
                        namespace=namespace, selector=MANAGED_BY, known=self._known(resource.kind),
                    )
                )  # fmt: skip
        return watches

    def _known(self, kind: str) -> Callable[[], list[Body]]:
        """What the store holds of ``kind``: after a relist, what the LIST lacks is deleted."""

        def known() -> list[Body]:
            return [
                body
                for namespace, name in self.store.names(kind)
                if (body := self.store.get(kind, namespace, name)) is not None
            ]

        return known

    async def _until_synced(self, stop: asyncio.Event, watches: list[Watch]) -> bool:
        """Wait until every watch has delivered its first LIST (True), so that the first
        reconcile of a term is as well-informed as every later one: one that ran before the
        Secrets or the StatefulSets had arrived would take them for missing. False once the
        process stops or the Lease is lost first. A LIST that is refused (an API server that
        just came back answers 429 for a moment; a permission not granted yet) is retried
        within the term by its watch."""
        synced = asyncio.ensure_future(asyncio.gather(*(w.synced.wait() for w in watches)))
        try:
            await _first(synced, stop.wait(), self.elector.lost.wait())
        finally:
            if not synced.done():
                synced.cancel()
        return synced.done() and not synced.cancelled()

    # --- process ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> int:
        """Campaign; while leading, watch and reconcile; on losing the Lease, stop and campaign
        again. Returns 0 once stopped."""
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
                await self._lead(stop)
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

    async def _lead(self, stop: asyncio.Event) -> None:
        """One term as leader: the watches and the work queue run until it ends."""
        metrics.LEADER.set(1)
        logger.info("leading: starting the watches")
        self._new_reconcilers()
        self.watches_synced.clear()
        watches = self._new_watches()
        watching = [asyncio.create_task(w.run(), name=f"watch {w.name}") for w in watches]
        resync: asyncio.Task[None] | None = None
        try:
            if await self._until_synced(stop, watches):
                self.watches_synced.set()
                metrics.WATCHED_OBJECTS.set(len(self.store))
                self.queue.start()
                self._enqueue_all()
                resync = asyncio.create_task(self.resync())
                await _first(stop.wait(), self.elector.lost.wait())
        finally:
            for task in watching:
                task.cancel()
            if resync is not None:
                resync.cancel()
            await self.queue.stop()
            await asyncio.gather(*watching, return_exceptions=True)
            self.watches_synced.clear()
            metrics.LEADER.set(0)
        if self.elector.lost.is_set():
            logger.warning("leadership lost: stopped reconciling; campaigning again")
            self.elector.reset()

    async def _start_probes(self) -> web.AppRunner:
        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            # Every replica serves admission, so a standby is Ready; a leader is Ready once
            # its watches are up.
            if self.options.webhooks and self.admission is None:
                return web.Response(status=503, text="admission webhook not serving yet")
            if self.elector.is_leader() and not self.watches_synced.is_set():
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
)
"""Loggers raised to WARNING when the operator runs."""


def quiet_chatty_loggers() -> None:
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def run(options: Options) -> int:
    """Run until SIGINT/SIGTERM (exit 0); a lost Lease ends the term, not the process. Raises
    StartupError, with a message naming the flag to change, when it cannot start."""
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
    logging.basicConfig(level=options.log_level.upper(), handlers=[handler])
    quiet_chatty_loggers()

    async def main() -> int:
        config = KubeConfig.from_env()
        client = api_client(config, watches=watch_count(options))
        transport = for_kubeconfig(
            config, connections=API_REQUESTS + watch_count(options), fallback=raw_http(client)
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            return await Operator(options, client, transport).run(stop)
        finally:
            await transport.close()
            await client.close()

    # libuv's event loop rather than asyncio's own: the operator is a loop of small
    # requests and watch events, and at 100 x 3 its CPU until every cluster converged fell
    # from 6.1-6.5 to 5.2 s and its last converging write from 15.3-15.8 to 11.7 s.
    return uvloop.run(main())


API_REQUESTS: Final = 24
"""Requests the reconciles have in flight to the API server at once (``Kube``); the rest
wait their turn. Eight reconciles that each apply a dozen children at once had 120 in
flight while a hundred clusters were created, and the HTTP client held as many
connections: its pool walks all of them on every request and response, 11 % of the
operator's CPU. Twenty-four keep the API server (two CPUs here, and every write a
round trip to etcd) as busy as 120 did; a changed spec's one write never waits long."""
API_CONNECTIONS: Final = API_REQUESTS + 4
"""Connections lightkube's client keeps open for requests (its own, and ``Kube``'s when the
kubeconfig's credentials need it: ``runtime.transport``), besides one per
watch (:func:`watch_count`): one for each request ``Kube`` lets through, and some for what
goes around it (the Lease, the webhook's certificate, the namespace check). All are kept
open: httpx keeps at most 20 idle by default, and with more in use the rest were closed
after every burst and opened again, a TLS handshake on both sides each time (8 % of the
operator's CPU while 300 clusters were created)."""


def watch_count(options: Options) -> int:
    """How many watches a term runs: one per kind, in each watched namespace."""
    kinds = len(PRIMARY_RESOURCES) + len(CHILD_RESOURCES)
    return kinds * max(1, len(options.watch_namespaces))


def api_client(config: KubeConfig, *, watches: int = 0) -> AsyncClient:
    """The operator's API client: lightkube's, with a connection pool that keeps
    :data:`API_CONNECTIONS` open for requests and one more for each of ``watches`` (each
    holds its connection for as long as it streams). The transport verifies the server and
    presents the client certificate exactly as lightkube would (its own ``verify_cluster``);
    the credentials of the kubeconfig (token, exec plugin) stay lightkube's."""
    single = config.get()
    if single is None or single.user is None:
        raise RuntimeError("the kubeconfig names no current context with a user")
    connections = API_CONNECTIONS + watches
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    verify = verify_cluster(single.cluster, single.user, single.abs_file)
    transport = httpx2.AsyncHTTPTransport(verify=verify, limits=limits)
    return AsyncClient(single, field_manager=FIELD_MANAGER, transport=transport)


def raw_http(client: AsyncClient) -> httpx2.AsyncClient:
    """The HTTP client under lightkube's: its base URL, TLS and credentials (token, client
    certificate, exec plugin) are the kubeconfig's, exactly as for every lightkube call.
    ``Kube`` and the watches go through it when the kubeconfig's user authenticates in a way
    only lightkube speaks (``runtime.transport.HttpxTransport``)."""
    http = getattr(getattr(client, "_client", None), "_client", None)
    if not isinstance(http, httpx2.AsyncClient):
        raise RuntimeError(
            "lightkube's AsyncClient no longer keeps its httpx2 client at ._client._client;"
            " runtime.operator.raw_http must follow its new layout"
        )
    return http
