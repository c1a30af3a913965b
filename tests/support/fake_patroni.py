"""A fake Patroni for fast unit tests of the PostgresCluster data plane.

The operator reaches Patroni through the ``Kube`` object every ``Scope`` carries: its REST
API (``post_patroni``, ``patch_patroni_config``), the state Patroni keeps in ConfigMaps
(``NAME-sync``, ``NAME-config``, read with ``get``) and the member records it writes on the
pods (read from the store). :class:`FakePatroni` stands in for that object only: it holds a
scripted state per member, serves the pods and ConfigMaps Patroni would make of it, records
every request, and answers as Patroni does — a switchover hands the lock over, a restart
leaves the member not ready until :meth:`FakePatroni.settle`, a parameter that needs a
restart flags every member ``pending_restart``.

:class:`Operator` runs the reconciler's data-plane phases over it, in the reconciler's order,
and keeps between runs only what the operator keeps: the status it wrote (through the real
``write_status``) and the ``DataPlane``'s memory, which :meth:`Operator.restart` drops.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime
import json
from typing import Any

from stateward.api import v1alpha1
from stateward.controllers import core
from stateward.controllers.kube import PatroniAccess, PatroniError, Ref
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.postgres.dataplane import DataPlane
from stateward.controllers.postgres.status import write_status
from stateward.controllers.store import ObjectStore
from stateward.instance import patroni
from stateward.specs import meta, tls
from stateward.specs.postgres import secrets
from tests.support.clusters import make_cluster

NAMESPACE = "db"
NAME = "demo"
USERNAME = "patroni-api"
REVISION = "r1"

RESTART_PARAMETERS = frozenset({"shared_buffers", "max_connections", "max_wal_senders"})
"""Parameters PostgreSQL applies only at a restart (Patroni flags ``pending_restart``)."""


@dataclasses.dataclass
class Member:
    """What Patroni reports of one member (its pod's role label, readiness and record)."""

    name: str
    role: str | None = meta.REPLICA_ROLE
    ready: bool = True
    replication_state: str | None = "streaming"
    wal: int = 1000
    pending_restart: bool = False
    revision: str = REVISION
    restarts: int = 0

    @property
    def ordinal(self) -> int:
        return int(self.name.rsplit("-", 1)[1])

    @property
    def address(self) -> str:
        return f"10.0.0.{self.ordinal + 10}"


@dataclasses.dataclass(frozen=True)
class Call:
    """One request to Patroni's REST API: which member it went to, and what it asked."""

    member: str
    method: str
    path: str
    body: dict[str, Any]


class FakePatroni:
    """The ``Kube`` a PostgresCluster's scope holds, as far as the data plane uses it."""

    def __init__(self, *members: Member, sync: set[str] | None = None) -> None:
        self.members = {x.name: x for x in members}
        self.sync: set[str] = set(sync or ())
        """The synchronous standbys Patroni chose (``NAME-sync``)."""
        self.sync_written = True
        """False: Patroni has no ``NAME-sync`` record (nothing runs Patroni)."""
        self.dcs: dict[str, Any] | None = None
        """Patroni's dynamic configuration (``NAME-config``); None: not written yet."""
        self.calls: list[Call] = []
        self.events: list[tuple[str, str, bool]] = []
        self.deleted: list[str] = []
        self.annotation_patches: list[dict[str, Any]] = []
        self.status_patches = 0
        self.status: dict[str, Any] = {}
        """The PostgresCluster's status, as the operator last patched it."""
        self.annotations: dict[str, str] = {}
        self.answers: dict[str, list[tuple[int, str] | Exception]] = {}
        self.switch_at_once = True
        """Whether a switchover is done by the time the next reconcile looks (Patroni answers
        once the new primary runs); False: still under way."""
        self.secrets_present = True
        self.poolers: list[str] = []
        """PgBouncer pods (``spec.pooler``), each answering the console (:meth:`console`)."""
        self.paused: set[str] = set()
        self.console_calls: list[tuple[str, str]] = []
        self.console_fails: dict[tuple[str, str], str] = {}
        """(pod, command) -> the ConsoleError message it answers with instead."""
        self.primary_endpoints: list[str] | None = None
        """The primary Service's ready addresses; None: the primary's, as kube-proxy has it."""

    # --- scripting ------------------------------------------------------------------------

    def answer(self, path: str, *answers: tuple[int, str] | Exception) -> None:
        """Patroni's next answers to ``POST path`` (then: success again)."""
        self.answers.setdefault(path, []).extend(answers)

    def primary(self) -> str | None:
        found = [x.name for x in self.members.values() if x.role == meta.PRIMARY_ROLE]
        return found[0] if len(found) == 1 else None

    def settle(self) -> None:
        """Every restarted member is back: ready, streaming again if a replica."""
        for x in self.members.values():
            x.ready = True

    def posts(self, path: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.method == "POST" and (path is None or c.path == path)]

    def reasons(self) -> list[str]:
        return [reason for reason, _, _ in self.events]

    def forget_calls(self) -> None:
        self.calls.clear()
        self.events.clear()
        self.deleted.clear()
        self.annotation_patches.clear()
        self.status_patches = 0

    def complete_switchover(self, candidate: str) -> None:
        """What Patroni does once a switchover succeeds: the candidate holds the lock and is
        labelled primary, the old primary rejoins as a streaming replica."""
        old = self.primary()
        for x in self.members.values():
            if x.name == candidate:
                x.role, x.replication_state = meta.PRIMARY_ROLE, None
            elif x.name == old:
                x.role, x.replication_state = meta.REPLICA_ROLE, "streaming"
        if old is not None and self.sync:
            self.sync = {old}  # Patroni picks a synchronous standby among the replicas

    # --- what the store holds -------------------------------------------------------------

    def pod(self, x: Member) -> dict[str, Any]:
        labels = {
            meta.NAME_LABEL: meta.APP_NAME,
            meta.CLUSTER_LABEL: NAME,
            meta.COMPONENT_LABEL: meta.INSTANCE_COMPONENT,
            meta.TLS_LABEL: meta.TLS_GENERATION,
            postgrescluster.REVISION_LABEL: x.revision,
        }
        if x.role:
            labels[meta.ROLE_LABEL] = x.role
        record: dict[str, Any] = {
            "state": "running",
            "role": "primary" if x.role == meta.PRIMARY_ROLE else "replica",
            "timeline": 2,
            "xlog_location": x.wal,
        }
        if x.role == meta.REPLICA_ROLE and x.replication_state:
            record["replication_state"] = x.replication_state
        if x.pending_restart:
            record["pending_restart"] = True
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": x.name,
                "namespace": NAMESPACE,
                "uid": f"uid-{x.name}",
                "resourceVersion": str(1 + x.restarts),  # Patroni's record changed meanwhile
                "labels": labels,
                "annotations": {"status": json.dumps(record)},
            },
            "spec": {"nodeName": f"node-{x.ordinal}"},
            "status": {
                "phase": "Running",
                "podIP": x.address,
                "conditions": [{"type": "Ready", "status": "True" if x.ready else "False"}],
                "containerStatuses": [{"name": "postgres", "state": {"running": {}}}],
            },
        }

    def pooler_pod(self, name: str) -> dict[str, Any]:
        labels = {meta.NAME_LABEL: meta.APP_NAME, meta.CLUSTER_LABEL: NAME,
                  meta.COMPONENT_LABEL: "pooler"}  # fmt: skip
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": f"uid-{name}",
                "resourceVersion": "1",
                "labels": labels,
            },
            "status": {
                "phase": "Running",
                "podIP": self.pooler_address(name),
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }

    @staticmethod
    def pooler_address(name: str) -> str:
        return f"10.9.0.{int(name.rsplit('-', 1)[1]) + 1}"

    async def console(self, host: str, _port: int, _context: Any, command: str, **_: Any) -> None:
        """PgBouncer's admin console on the pooler pod at ``host``."""
        from stateward.controllers.postgres import pgbouncer

        name = next(n for n in self.poolers if self.pooler_address(n) == host)
        self.console_calls.append((name, command))
        failure = self.console_fails.get((name, command))
        if failure is not None:
            raise pgbouncer.ConsoleError(failure)
        if command == "PAUSE":
            if name in self.paused:
                raise pgbouncer.ConsoleError("already suspended/paused")
            self.paused.add(name)
        elif command == "RESUME":
            if name not in self.paused:
                raise pgbouncer.ConsoleError("pooler is not paused/suspended")
            self.paused.discard(name)

    async def list_objects(
        self, api_version: str, kind: str, namespace: str, labels: dict[str, Any]
    ) -> list[dict[str, Any]]:
        assert kind == "EndpointSlice", kind
        primary = self.primary()
        addresses = (
            self.primary_endpoints
            if self.primary_endpoints is not None
            else [self.members[primary].address]
            if primary
            else []
        )
        return [{"endpoints": [{"addresses": [a], "conditions": {"ready": True}}
                               for a in addresses]}]  # fmt: skip

    def statefulset(self, replicas: int, revision: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": NAME, "namespace": NAMESPACE, "generation": 2, "resourceVersion": "1",
                "labels": {meta.CLUSTER_LABEL: NAME},
            },
            "spec": {"replicas": replicas},
            "status": {
                "updateRevision": revision, "observedGeneration": 2,
                "replicas": replicas, "readyReplicas": sum(x.ready for x in self.members.values()),
            },
        }  # fmt: skip

    def _secret_data(self, name: str) -> dict[str, str] | None:
        values = {
            f"{NAME}-patroni-api": {secrets.USERNAME_KEY: USERNAME, secrets.PASSWORD_KEY: "pw"},
            f"{NAME}-tls": {tls.CA_CERT_KEY: "CA PEM", "tls.key": "KEY PEM"},
        }.get(name)
        if values is None or not self.secrets_present:
            return None
        return {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}

    def secrets(self) -> list[dict[str, Any]]:
        return [
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": "7"}}
            for name in (f"{NAME}-patroni-api", f"{NAME}-tls")
            if self._secret_data(name) is not None
        ]  # fmt: skip

    # --- the Kube surface the data plane uses ---------------------------------------------

    def _member_at(self, address: str) -> Member:
        return next(x for x in self.members.values() if x.address == address)

    async def post_patroni(
        self,
        address: str,
        port: int,
        path: str,
        body: dict[str, Any],
        *,
        auth: PatroniAccess,
        wait: float = 30,
    ) -> tuple[int, str]:
        assert port == patroni.RESTAPI_PORT and auth.username == USERNAME
        target = self._member_at(address)
        self.calls.append(Call(target.name, "POST", path, dict(body)))
        queued = self.answers.get(path) or []
        answer = queued.pop(0) if queued else (200, "")
        if isinstance(answer, Exception):
            raise answer
        code, text = answer
        if code >= 400:
            return code, text
        if path in ("/switchover", "/failover"):
            if path == "/switchover" and body.get("leader") != target.name:
                return 412, "leader name does not match"
            if path == "/switchover" and self.sync and body.get("candidate") not in self.sync:
                return 412, "candidate name does not match with sync_standby"
            if self.switch_at_once:
                self.complete_switchover(body["candidate"])
        elif path == "/restart":
            target.pending_restart = False
            target.restarts += 1
            target.ready = False  # back once PostgreSQL has started: settle()
        return code, text

    async def patch_patroni_config(
        self, address: str, port: int, patch: dict[str, Any], *, auth: PatroniAccess
    ) -> None:
        assert port == patroni.RESTAPI_PORT and auth.username == USERNAME
        target = self._member_at(address)
        self.calls.append(Call(target.name, "PATCH", "/config", copy.deepcopy(patch)))
        if target.role != meta.PRIMARY_ROLE:
            raise PatroniError("not the leader")
        dcs = self.dcs if self.dcs is not None else {}
        for key, value in patch.items():
            if key != "postgresql":
                dcs[key] = value
        parameters = dcs.setdefault("postgresql", {}).setdefault("parameters", {})
        changed = (patch.get("postgresql") or {}).get("parameters") or {}
        for key, value in changed.items():
            if value is None:
                parameters.pop(key, None)
            else:
                parameters[key] = value
        self.dcs = dcs
        if RESTART_PARAMETERS & set(changed):
            for x in self.members.values():
                x.pending_restart = True

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        self.calls.append(Call(name, "GET", kind, {}))
        if kind == "Secret":
            data = self._secret_data(name)
            return None if data is None else {"metadata": {"name": name}, "data": data}
        if kind == "ConfigMap" and name == f"{NAME}-sync" and self.sync_written:
            leader = self.primary() or ""
            return {"metadata": {"name": name, "annotations": {
                "leader": leader, "sync_standby": ",".join(sorted(self.sync))}}}  # fmt: skip
        if kind == "ConfigMap" and name == f"{NAME}-config" and self.dcs is not None:
            return {"metadata": {"name": name, "annotations": {"config": json.dumps(self.dcs)}}}
        return None

    async def patch(self, ref: Ref, patch: dict[str, Any], *, status: bool = False) -> Any:
        assert (ref.kind, ref.name) == (v1alpha1.KIND, NAME), f"unexpected patch of {ref}"
        if status:
            self.status_patches += 1
            self.status = _merge(self.status, patch["status"])
        else:
            self.annotation_patches.append(patch)
            changes = patch["metadata"]["annotations"]
            self.annotations = {
                k: v for k, v in {**self.annotations, **changes}.items() if v is not None
            }
        return self.body()

    async def delete(self, ref: Ref, **_: Any) -> None:
        self.deleted.append(ref.name)
        self.members[ref.name].ready = False  # replaced by the StatefulSet: settle()
        self.members[ref.name].revision = "new"

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))

    async def settle_events(self, involved: Any = None) -> None:
        """Events are recorded as they are sent: none is ever pending."""

    def body(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{v1alpha1.GROUP}/{v1alpha1.VERSION}",
            "kind": v1alpha1.KIND,
            "metadata": {
                "name": NAME, "namespace": NAMESPACE, "uid": "uid-1", "generation": 1,
                "resourceVersion": "5", "annotations": dict(self.annotations),
            },
            "status": copy.deepcopy(self.status),
        }  # fmt: skip


def _merge(current: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch applied, as the API server does."""
    result = dict(current)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = _merge(result[key], value)
        else:
            result[key] = value
    return result


def stamp(seconds_ago: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Operator:
    """The PostgresCluster reconciler's data-plane phases over a :class:`FakePatroni`, in
    the reconciler's order; the status is written by the real ``write_status``."""

    def __init__(self, fake: FakePatroni, **spec: Any) -> None:
        self.fake = fake
        self.spec = spec
        self.revision = REVISION
        self.data_plane = DataPlane()
        self.secret_cache = core.SecretCache()
        self.paused_poolers: dict[tuple[str, str], list[str]] = {}
        self.clock: str | None = None
        """The reconcile's ``now``; None: the real time."""
        self.notes: list[str] = []

    def restart(self) -> None:
        """A new operator process: only the status and the world are left."""
        self.data_plane = DataPlane()
        self.secret_cache = core.SecretCache()
        self.paused_poolers = {}

    def request_switchover(self, target: str) -> None:
        self.fake.annotations[v1alpha1.SWITCHOVER_ANNOTATION] = target

    @property
    def switchover(self) -> dict[str, Any]:
        return dict(self.fake.status.get("switchover") or {})

    @property
    def roll(self) -> dict[str, Any]:
        return dict(self.fake.status.get("rollingRestart") or {})

    async def reconcile(self) -> list[str]:
        fake = self.fake
        cluster = make_cluster(
            metadata={"annotations": dict(fake.annotations)},
            replicas=len(fake.members),
            **self.spec,
        )
        store = ObjectStore()
        store.observe(fake.statefulset(cluster.spec.replicas, self.revision))
        for body in [*(fake.pod(x) for x in fake.members.values()), *fake.secrets()]:
            store.observe(body)
        for name in fake.poolers:
            store.observe(fake.pooler_pod(name))
        body = fake.body()
        status = body["status"]
        scope = postgrescluster.Scope(
            cluster=cluster,
            body=body,
            kube=fake,  # type: ignore[arg-type]
            store=store,
            secrets=self.secret_cache,
            now=self.clock or core.now(),
            conditions=[dict(c) for c in status.get("conditions") or []],
            switchover=status.get("switchover"),
            last_failover=status.get("lastFailover"),
            rolling_restart=status.get("rollingRestart"),
            paused_poolers=self.paused_poolers,
        )
        data_plane = self.data_plane
        for phase in (
            data_plane.follow_leader_lock,
            data_plane.report_failover,
            data_plane.apply_configuration,
            data_plane.observe_sync,
            data_plane.run_switchover,
            postgrescluster.roll_pods,
            data_plane.restart_pending,
        ):
            note = await phase(scope)
            if note:
                scope.notes.append(note)
        await write_status(scope, deleting=False)
        self.notes = scope.notes
        return scope.notes
