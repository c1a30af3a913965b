"""A fake SQL layer for fast unit tests of MySQL and MariaDB replication (``replicate``).

The Database reconciler speaks to the servers only through the functions of
``stateward.controllers.mariadb.sql`` (``observe``, ``detach``, ``follow``, ...), looked up on that
module at each call. :class:`FakeSQL` replaces exactly those (``install``): it holds a
scripted state per server, answers ``observe`` from it, records every change sent, in order,
and applies it as the server would (``follow`` makes a server replicate from the source and
catch up, ``open_writes`` makes it writable, ...). :class:`Servers` runs the real
``Servers.replicate`` (``controllers.mariadb.reconcile``) over it with the pods, claims and
Secrets in a store.
"""

from __future__ import annotations

import base64
import dataclasses
import ssl
from typing import Any

import pytest

from stateward import pki
from stateward.api import v1alpha1
from stateward.controllers import core, database
from stateward.controllers.kube import Ref
from stateward.controllers.mariadb import failover, sql
from stateward.controllers.mariadb import reconcile as mariadb
from stateward.controllers.store import ObjectStore
from stateward.specs import meta, tls
from stateward.specs.mariadb import servers as mysql_spec
from tests.unit.test_specs_database import make_database

NAMESPACE = "apps"
NAME = "shop"


@dataclasses.dataclass
class Server:
    """One server: its pod as Kubernetes sees it, and what it answers over SQL."""

    pod: str
    role: str | None = meta.REPLICA_ROLE
    ready: bool = True
    answers: bool = True
    deleting: bool = False
    writable: bool = False
    source: str | None = None
    replicating: bool = False
    gtid: str = ""
    received: str = ""
    replica_error: int = 0
    semi_sync: bool | None = False
    claim: bool = True
    """Its data volume claim exists."""

    @property
    def address(self) -> str:
        return f"10.1.0.{failover.ordinal(self.pod) + 10}"


def host(pod: str) -> str:
    return failover.host_of(make_database("mariadb"), pod)


def primary(pod: str, gtid: str = "0-1-100", **kw: Any) -> Server:
    return Server(pod, **{"role": meta.PRIMARY_ROLE, "writable": True, "gtid": gtid,
                          "semi_sync": True, **kw})  # fmt: skip


def replica(pod: str, of: str, gtid: str = "0-1-100", **kw: Any) -> Server:
    return Server(pod, source=host(of), replicating=True, gtid=gtid, **kw)


LAYER = (
    "observe",
    "stop_receiving",
    "detach",
    "fence",
    "follow",
    "wait_for_replicas",
    "open_writes",
    "set_semi_sync",
    "switchover",
)
"""The functions of ``stateward.controllers.mariadb.sql`` that talk to a server."""


class FakeSQL:
    def __init__(self, *members: Server) -> None:
        self.servers = {s.pod: s for s in members}
        self.changes: list[tuple[str, str]] = []
        """(what, server) for every replication change sent, in order."""
        self.observed: list[str] = []

    def _at(self, address: str) -> Server:
        return next(s for s in self.servers.values() if s.address == address)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in LAYER:
            monkeypatch.setattr(sql, name, getattr(self, name))

    def _change(self, what: str, server: Server) -> None:
        if not server.answers:
            raise sql.SQLError(f"the server at {server.address} did not answer")
        self.changes.append((what, server.pod))

    async def observe(self, address: str | None, credentials: Any, engine: Any) -> dict[str, Any]:
        if not address:
            return {}
        server = self._at(address)
        self.observed.append(server.pod)
        if not server.answers:
            return {}
        return {
            "writable": server.writable, "semi_sync": server.semi_sync, "gtid": server.gtid,
            "source": server.source, "replicating": server.replicating,
            "received": server.received, "replica_error": server.replica_error,
        }  # fmt: skip

    async def stop_receiving(self, address: str, credentials: Any, engine: Any) -> None:
        server = self._at(address)
        self._change("stop_receiving", server)
        server.replicating = False

    async def detach(self, address: str, credentials: Any, engine: Any, received: str = "") -> None:
        server = self._at(address)
        self._change("detach", server)
        if received and sum(failover.positions(received).values()) > sum(
            failover.positions(server.gtid).values()
        ):
            server.gtid = received  # applies what its relay log held
        server.source, server.replicating, server.received = None, False, ""

    async def fence(self, address: str, credentials: Any, engine: Any) -> None:
        server = self._at(address)
        self._change("fence", server)
        server.writable = False

    async def follow(self, address: str, credentials: Any, engine: Any, source: str) -> None:
        server = self._at(address)
        self._change("follow", server)
        server.source, server.replicating, server.replica_error = source, True, 0
        leader = next(s for s in self.servers.values() if host(s.pod) == source)
        server.gtid = leader.gtid

    async def wait_for_replicas(
        self, address: str, credentials: Any, engine: Any, *, within: float = 5.0
    ) -> bool:
        self._change("wait_for_replicas", self._at(address))
        return True

    async def open_writes(
        self, address: str, credentials: Any, engine: Any, *, semi_sync: bool
    ) -> None:
        server = self._at(address)
        self._change(f"open_writes(semi_sync={semi_sync})", server)
        server.writable, server.semi_sync = True, semi_sync

    async def set_semi_sync(self, address: str, credentials: Any, engine: Any, *, on: bool) -> None:
        server = self._at(address)
        self._change(f"set_semi_sync({on})", server)
        server.semi_sync = on

    async def switchover(
        self, primary: str, target: str, credentials: Any, engine: Any, *, semi_sync: bool
    ) -> None:
        old, new = self._at(primary), self._at(target)
        self._change(f"switchover(to={new.pod})", old)
        old.writable, new.writable = False, True
        new.source, new.replicating, new.semi_sync = None, False, semi_sync


class Kube:
    """What ``replicate`` asks of the API server: Secrets, label patches, deletes, Events."""

    def __init__(self, sql: FakeSQL) -> None:
        self.sql = sql
        self.labels: list[tuple[str, str | None]] = []
        self.deleted: list[str] = []
        self.events: list[tuple[str, str, bool]] = []

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        assert kind == "Secret", f"unexpected read of {kind} {name}"
        cert, key = tls.client_files("operator")
        values = {
            f"{NAME}-credentials": {
                mysql_spec.ROOT_PASSWORD_KEY: "root", mysql_spec.REPLICATION_PASSWORD_KEY: "repl"},
            f"{NAME}-tls": {cert: "CERT", key: "KEY", tls.CA_CERT_KEY: "CA"},
        }[name]  # fmt: skip
        return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}

    async def patch(self, ref: Ref, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        assert ref.kind == "Pod", f"unexpected patch of {ref}"
        role = patch["metadata"]["labels"][meta.ROLE_LABEL]
        self.labels.append((ref.name, role))
        self.sql.servers[ref.name].role = role
        return Servers.pod(self.sql.servers[ref.name])

    async def delete(self, ref: Ref, **_: Any) -> None:
        self.deleted.append(ref.name)

    async def event(self, body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message, warning))


class Servers:
    """The Database reconciler's ``replicate`` phase over a :class:`FakeSQL`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sql: FakeSQL, *, replicas: int = 3):
        sql.install(monkeypatch)
        # The operator's TLS context for MariaDB is made from the Secret's certificate; the
        # fake servers check no certificate.
        monkeypatch.setattr(
            pki, "client_context", lambda **_: ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        )
        self.sql = sql
        self.kube = Kube(sql)
        self.replicas = replicas
        self.now = 100.0
        self.reconciler = database.DatabaseReconciler(
            self.kube,  # type: ignore[arg-type]
            ObjectStore(),
            clock=lambda: self.now,
        )
        self.status: dict[str, Any] = {}

    @staticmethod
    def pod(server: Server) -> dict[str, Any]:
        db = make_database("mariadb")
        labels = dict(mysql_spec.selector_labels(db))
        if server.role:
            labels[meta.ROLE_LABEL] = server.role
        metadata: dict[str, Any] = {
            "name": server.pod, "namespace": NAMESPACE, "resourceVersion": "1", "labels": labels,
        }  # fmt: skip
        if server.deleting:
            metadata["deletionTimestamp"] = "2026-12-04T00:00:00Z"
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "status": {
                "phase": "Running",
                "podIP": server.address,
                "conditions": [{"type": "Ready", "status": "True" if server.ready else "False"}],
            },
        }

    def restart(self) -> None:
        """A new operator process: what it kept in memory is gone."""
        self.reconciler = database.DatabaseReconciler(
            self.kube,  # type: ignore[arg-type]
            ObjectStore(),
            clock=lambda: self.now,
        )

    async def replicate(self) -> str | None:
        db = make_database("mariadb", replicas=self.replicas)
        store = ObjectStore()
        for server in self.sql.servers.values():
            store.observe(self.pod(server))
            if server.claim:
                store.observe({
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": f"{mysql_spec.DATA_VOLUME}-{server.pod}",
                                 "namespace": NAMESPACE, "labels": {meta.CLUSTER_LABEL: NAME}},
                })  # fmt: skip
        store.observe({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": NAME, "namespace": NAMESPACE,
                         "labels": {meta.CLUSTER_LABEL: NAME}},
            "spec": {"replicas": len(self.sql.servers)},
        })  # fmt: skip
        for secret in (db.credentials_secret_name, db.tls_secret_name):
            store.observe({"apiVersion": "v1", "kind": "Secret",
                           "metadata": {"name": secret, "namespace": NAMESPACE,
                                        "resourceVersion": "3"}})  # fmt: skip
        scope = database.Scope(
            database=db,
            body={
                "apiVersion": f"{v1alpha1.GROUP}/{v1alpha1.VERSION}",
                "kind": v1alpha1.DATABASE_KIND,
                "metadata": {"name": NAME, "namespace": NAMESPACE},
            },
            kube=self.kube,  # type: ignore[arg-type]
            store=store,
            secrets=self.reconciler.secret_cache,
            now=core.now(),
            conditions=[],
            primary=self.status.get("primaryPod"),
            last_failover=self.status.get("lastFailover"),
        )
        # What apply_servers decides first: a scale-down that would remove the primary waits
        # for it to move below the cut.
        mariadb._hold_scale_down(scope, [{"kind": "StatefulSet", "spec": {"replicas": 0}}])
        note = await self.reconciler.servers.replicate(scope)
        self.status["primaryPod"] = scope.primary
        if scope.last_failover is not None:
            self.status["lastFailover"] = scope.last_failover
        self.progressing = scope.progressing
        return note

    def forget(self) -> None:
        self.sql.changes.clear()
        self.kube.labels.clear()
        self.kube.events.clear()
        self.kube.deleted.clear()
