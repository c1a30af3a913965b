"""The phases of a MySQL or MariaDB Database: its credentials, TLS (MariaDB), servers and
volumes, and replication — choosing the primary (``controllers.mariadb.failover``) and acting
on that choice over SQL (``controllers.mariadb.sql``) — and the status that reports them. The
Database reconciler (``controllers.database``) runs them after its own phases.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import Callable
from typing import Any

from stateward import pki
from stateward.api.v1alpha1 import DatabasePhase, Engine
from stateward.controllers import certificates, core
from stateward.controllers import conditions as cond
from stateward.controllers.dbscope import RECHECK, Scope, Stop, data_volumes
from stateward.controllers.kube import Body, Ref
from stateward.controllers.mariadb import failover, sql
from stateward.specs import meta, passwords, tls
from stateward.specs.mariadb import servers as mysql_spec

STUCK_AFTER = 60.0
"""Seconds a pending server pod may wait for a claim that does not exist."""
FAILOVER_GRACE = 10.0
"""How long a primary must stay unanswering over SQL, while Kubernetes still sees its pod
ready, before another server is promoted: one failed probe (the operator's own network, a
stall) is no reason to fail over. A pod gone, going, or not ready is proof enough at once."""


class Servers:
    """What the MariaDB/MySQL phases keep between reconciles, per Database: the primary this
    term decided, since when a primary has been silent, and the operator's TLS context. In
    memory only: made anew each term (the reconciler is), freed when the Database goes."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        leadership: Callable[[], float] = sql.always_leader,
    ) -> None:
        self.clock = clock
        self.leadership = leadership
        """Seconds this operator replica surely keeps the leader Lease (``LeaderElector.
        term_left``): no replication change is sent to a server past it."""
        self._silent_since: dict[tuple[str, str], tuple[str, float]] = {}
        """Per Database: the primary that stopped answering while its pod looked ready, and
        since when (in memory: an operator restart waits the grace again, never less)."""
        self._primaries: dict[tuple[str, str], str] = {}
        """Per Database: the primary this term last decided. The status read at a reconcile's
        start may not show it yet (the watch delivers our own status patch later); a primary
        lost seconds after its election must still count as a failover from it, not as a
        first election (found by a clean-clone run: lastFailover never named it). Made anew
        each term (the reconciler is), so another leader's decisions are never hidden."""
        self._tls: dict[tuple[str, str], tuple[dict[str, str], ssl.SSLContext]] = {}
        """Per MariaDB Database: the operator's TLS context and the Secret data it was made
        from."""

    def forget(self, namespace: str, name: str) -> None:
        self._silent_since.pop((namespace, name), None)
        self._primaries.pop((namespace, name), None)
        self._tls.pop((namespace, name), None)

    def primary(self, key: tuple[str, str]) -> str | None:
        """The primary this term last decided for the Database, if any."""
        return self._primaries.get(key)

    def remember_primary(self, key: tuple[str, str], scope: Scope) -> None:
        if scope.primary:
            self._primaries[key] = scope.primary

    def phases(self, engine: Engine) -> list[core.Phase[Scope]]:
        """A MySQL or MariaDB Database's phases, after the Database's own."""
        return [
            check_diverged,
            ensure_secrets,
            *([ensure_tls] if engine is Engine.MARIADB else []),
            apply_servers,
            expand_volumes,
            self.replicate,
        ]

    async def replicate(self, scope: Scope) -> str | None:
        """Choose the primary, make it writable, point every other server at it, and label
        the pods for the Services (``controllers.mariadb.failover.plan``)."""
        database = scope.database
        pods = _server_pods(scope)
        if not pods:
            return None
        credentials = await self._credentials_of(scope)
        if credentials is None:
            return "waiting for the credentials Secret"
        await _fence_departing(scope, credentials)
        answers = await asyncio.gather(
            *(sql.observe(_ip(pod), credentials, database.spec.engine) for pod in pods)
        )
        observed = [
            failover.Server(
                pod=pod["metadata"]["name"],
                ready=meta.pod_ready(pod),
                role=(pod["metadata"].get("labels") or {}).get(meta.ROLE_LABEL),
                **answer,
            )
            for pod, answer in zip(pods, answers, strict=True)
        ]
        decided = failover.plan(database, observed, scope.primary)
        notes: list[str] = []
        by_pod = {pod["metadata"]["name"]: pod for pod in pods}
        engine = database.spec.engine
        if decided.failover_from is not None:
            waiting = self._failover_wait(scope, by_pod.get(decided.failover_from))
            if waiting is not None:
                scope.progressing.append(("PrimaryUnreachable", waiting))
                scope.requeue(1.0)
                return waiting
            # The lost primary may still run. Every replica stops receiving from it first, so
            # none acknowledges another of its commits (and with semi-synchronous replication
            # it can have none acknowledged at all); then the choice sees what each finally
            # received.
            receiving = [
                s for s in observed if s.pod != decided.failover_from and s.reachable and s.source
            ]
            for server in receiving:
                await sql.stop_receiving(_ip(by_pod[server.pod]) or "", credentials, engine)
            if receiving:
                answers = await asyncio.gather(
                    *(sql.observe(_ip(pod), credentials, engine) for pod in pods)
                )
                observed = [
                    dataclasses.replace(server, **answer) if answer else server
                    for server, answer in zip(observed, answers, strict=True)
                ]
                decided = failover.plan(database, observed, scope.primary)
            unproven = _may_hold_more(decided, observed, _claims(scope, pods))
            if unproven:
                names = ", ".join(unproven)
                claims = " ".join(_claim_name(server) for server in unproven)
                message = (
                    f"not failing over from {decided.failover_from}: {names} cannot be asked"
                    " what it holds and may hold acknowledged writes no other server has;"
                    " waiting until it answers. To fail over without it, accepting the loss of"
                    f" what only it holds: kubectl delete pvc {claims}"
                )
                scope.progressing.append(("FailoverWaits", message))
                scope.requeue(RECHECK)
                return message
        else:
            self._silent_since.pop((scope.namespace, scope.name), None)
        by_server = {server.pod: server for server in observed}
        # Commits wait for a replica's acknowledgement while the Database has replicas.
        wants_replicas = database.spec.replicas > 1
        if decided.promote is not None:
            promoted = by_server[decided.promote]
            await sql.detach(
                _ip(by_pod[decided.promote]) or "", credentials, engine, promoted.received
            )
            if decided.failover_from is not None:
                await scope.event(
                    "Failover",
                    f"the primary {decided.failover_from} was lost or restarted; promoted"
                    f" {decided.promote}, the most advanced server ({promoted.gtid or 'empty'})",
                    warning=True,
                )
                scope.last_failover = {
                    "fromPod": decided.failover_from,
                    "toPod": decided.promote,
                    "at": scope.now,
                }
            else:
                await scope.event("PrimaryElected", f"{decided.promote} is the primary")
            notes.append(f"made {decided.promote} the primary")
        for pod in decided.fence:
            await sql.fence(_ip(by_pod[pod]) or "", credentials, engine)
            await scope.event(
                "ServerFenced", f"{pod} was writable but is not the primary: made read-only",
                warning=True,
            )  # fmt: skip
            notes.append(f"made {pod} read-only")
        if decided.primary is not None:
            source = failover.host_of(database, decided.primary)
            for pod in decided.follow:
                await sql.follow(_ip(by_pod[pod]) or "", credentials, engine, source)
                notes.append(f"pointed {pod} at {decided.primary}")
        if decided.promote is not None:
            # Writable last, once a replica is connected to acknowledge its commits (the
            # first commit would otherwise wait out the semi-synchronous timeout).
            address = _ip(by_pod[decided.promote]) or ""
            if decided.follow:
                await sql.wait_for_replicas(address, credentials, engine)
            await sql.open_writes(
                address, credentials, engine, semi_sync=wants_replicas and bool(decided.follow)
            )
        elif decided.primary is not None:
            await _keep_semi_sync(scope, by_server[decided.primary], observed, credentials,
                                  _ip(by_pod[decided.primary]) or "")  # fmt: skip
        gtids = {server.pod: server.gtid for server in observed}
        for pod in decided.reclone:
            await _reclone(scope, by_pod[pod], gtids)
            notes.append(f"recloning {pod}")
        await _unstick(scope)
        for pod, role in decided.labels.items():
            if scope.observed("Pod", pod) is None:
                continue  # deleted above (recloned, or stuck on a deleted volume)
            patched = await scope.kube.patch(
                Ref.of(by_pod[pod]), {"metadata": {"labels": {meta.ROLE_LABEL: role}}}
            )
            scope.observe(patched)
        scope.primary = decided.primary
        if decided.primary is not None and scope.switch_below is not None:
            target = _switchover_target(observed, decided.primary, scope.switch_below)
            if target is not None:
                await sql.switchover(
                    _ip(by_pod[decided.primary]) or "",
                    _ip(by_pod[target]) or "",
                    credentials,
                    engine,
                    semi_sync=wants_replicas,
                )
                await scope.event(
                    "SwitchedOver",
                    f"moved the primary from {decided.primary} to {target} before the"
                    f" scale-down to {scope.switch_below} removes it",
                )
                notes.append(f"switched over from {decided.primary} to {target}")
                scope.primary = target
                scope.requeue(RECHECK)
        if decided.waiting:
            scope.progressing.append(("NoPrimary", decided.waiting))
        if (
            decided.waiting
            or decided.follow
            or decided.promote
            or any(not s.replicating for s in observed if s.pod != decided.primary)
        ):
            scope.requeue(RECHECK)
        return "; ".join(notes) or None

    def _failover_wait(self, scope: Scope, pod: Body | None) -> str | None:
        """Why the failover from a silent primary must wait, or None once it may go: its pod
        is gone, going or not ready (Kubernetes' own proof), or it stayed silent for
        :data:`FAILOVER_GRACE`."""
        key = (scope.namespace, scope.name)
        if pod is None or pod["metadata"].get("deletionTimestamp") or not meta.pod_ready(pod):
            self._silent_since.pop(key, None)
            return None
        name, now = pod["metadata"]["name"], self.clock()
        silent = self._silent_since.get(key)
        if silent is None or silent[0] != name:
            self._silent_since[key] = silent = (name, now)
        if now - silent[1] >= FAILOVER_GRACE:
            self._silent_since.pop(key, None)
            return None
        return (
            f"the primary {name} does not answer over SQL but its pod is ready: failing over"
            f" if it stays silent for {FAILOVER_GRACE:.0f}s"
        )

    async def _credentials_of(self, scope: Scope) -> sql.Credentials | None:
        """The root and replication passwords, read from the Secret (the store keeps no
        Secret data) when its resourceVersion changed; kept in memory only."""
        name = scope.database.credentials_secret_name
        data = await scope.secrets.read(scope, name)
        if data is None:
            return None
        context = None
        if scope.database.spec.engine is Engine.MARIADB:
            context = await self._tls_of(scope)
            if context is None:
                return None
        try:
            return sql.Credentials(
                root_password=data[mysql_spec.ROOT_PASSWORD_KEY],
                replication_password=data[mysql_spec.REPLICATION_PASSWORD_KEY],
                tls=context,
                leadership=self.leadership,
            )
        except KeyError:
            await scope.degrade(
                "SecretInvalid",
                f"Secret {name} lacks {mysql_spec.ROOT_PASSWORD_KEY} or"
                f" {mysql_spec.REPLICATION_PASSWORD_KEY}; restore it from your backup",
            )
            return None

    async def _tls_of(self, scope: Scope) -> ssl.SSLContext | None:
        """MariaDB: the operator's client certificate and the CA, from ``NAME-tls``, as a TLS
        context made again only when that Secret changed."""
        name = scope.database.tls_secret_name
        cert_file, key_file = tls.client_files("operator")
        wanted = frozenset({cert_file, key_file, tls.CA_CERT_KEY})
        data = await scope.secrets.read(scope, name, keys=wanted)
        if data is None or not wanted <= set(data):
            return None
        key = (scope.namespace, scope.name)
        cached = self._tls.get(key)
        # The secret cache hands out the same data while the Secret is unchanged.
        if cached is None or cached[0] is not data:
            try:
                context = pki.client_context(
                    ca=data[tls.CA_CERT_KEY].encode(),
                    cert=data[cert_file].encode(),
                    key=data[key_file].encode(),
                )
            except (ssl.SSLError, ValueError):
                await scope.degrade(
                    "CertificateInvalid",
                    f"Secret {name} holds no usable client certificate for the operator;"
                    " delete it and Stateward issues it again",
                )
                return None
            self._tls[key] = cached = (data, context)
        return cached[1]


def _may_hold_more(
    decided: failover.Plan, observed: list[failover.Server], claims: dict[str, Body | None]
) -> list[str]:
    """The servers a failover cannot ask what they hold while their data still exists: with
    semi-synchronous replication any one replica acknowledges a commit, so a server that does
    not answer may hold acknowledged commits no other has — promoting another would lose
    them (a partition that cut off the primary's node took a replica on that node with it).
    Silent over SQL, not ready, or without a pod at all, it counts while its data volume
    claim exists (``claims``: server -> its claim, None when gone or going). Not waited for:
    the lost primary, the server to promote, servers that answer (stopped from receiving)."""
    if decided.promote is None:
        return []
    answering = {s.pod for s in observed if s.reachable}
    return sorted(
        server
        for server, claim in claims.items()
        if server not in (decided.failover_from, decided.promote, *answering)
        and claim is not None
        and not claim["metadata"].get("deletionTimestamp")
    )


def _claims(scope: Scope, pods: list[Body]) -> dict[str, Body | None]:
    """Every server the StatefulSet has (its pods, and each ordinal below its size) -> its
    data volume claim as observed (None: none)."""
    statefulset = scope.observed("StatefulSet", scope.name)
    size = int(((statefulset or {}).get("spec") or {}).get("replicas") or 0)
    names = {f"{scope.name}-{ordinal}" for ordinal in range(size)}
    names |= {pod["metadata"]["name"] for pod in pods}
    return {
        name: scope.observed("PersistentVolumeClaim", _claim_name(name)) for name in sorted(names)
    }


async def _keep_semi_sync(
    scope: Scope,
    primary: failover.Server,
    observed: list[failover.Server],
    credentials: sql.Credentials,
    address: str,
) -> None:
    """The primary waits for acknowledgements once a replica replicates from it, and stops
    only when the Database is scaled to one server — never because its replicas are gone:
    that is the fallback to asynchronous replication that could lose acknowledged writes."""
    if primary.semi_sync is None or not address:
        return
    source = failover.host_of(scope.database, primary.pod)
    if scope.database.spec.replicas == 1:
        wanted = False
    elif primary.semi_sync:
        return
    else:
        wanted = any(s.source == source and s.replicating for s in observed if s is not primary)
    if wanted == primary.semi_sync:
        return
    await sql.set_semi_sync(address, credentials, scope.database.spec.engine, on=wanted)
    await scope.event(
        "SemiSyncEnabled" if wanted else "SemiSyncDisabled",
        f"{primary.pod} now waits for a replica to acknowledge every commit"
        if wanted
        else f"{primary.pod} is the only server: it no longer waits for acknowledgements",
    )


async def _fence_departing(scope: Scope, credentials: sql.Credentials) -> None:
    """A server whose pod is being deleted still runs until its shutdown ends, and a primary
    among them still takes writes that no one else may ever receive: make every departing
    server read-only first (if it still answers), before anything is promoted."""
    selector = mysql_spec.selector_labels(scope.database)
    for pod in scope.owned("Pod"):
        labels = pod["metadata"].get("labels") or {}
        if not pod["metadata"].get("deletionTimestamp") or any(
            labels.get(k) != v for k, v in selector.items()
        ):
            continue
        address = _ip(pod)
        if address and (await sql.observe(address, credentials, scope.database.spec.engine)).get(
            "writable"
        ):
            try:
                await sql.fence(address, credentials, scope.database.spec.engine)
            except sql.SQLError:
                continue  # gone meanwhile: it takes no writes either


def _switchover_target(observed: list[failover.Server], primary: str, below: int) -> str | None:
    """The replica below the cut that replicates from the primary, most advanced first."""
    candidates = [
        s
        for s in observed
        if s.pod != primary and failover.ordinal(s.pod) < below and s.replicating
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda s: (sum(s.position.values()), -failover.ordinal(s.pod))).pod


def _claim_name(server: str) -> str:
    """The data volume claim the StatefulSet makes for its pod ``server``."""
    return f"{mysql_spec.DATA_VOLUME}-{server}"


def _claim_of(pod: Body) -> str:
    return _claim_name(pod["metadata"]["name"])


DIVERGED_FROM_LABEL = "stateward.io/diverged-from"
"""On a PersistentVolume the operator kept: the Database (``NAMESPACE.NAME``) whose server held
transactions the new primary never had."""
DIVERGED_ANNOTATIONS = ("stateward.io/diverged-pod", "stateward.io/diverged-gtid")


async def _retain_volume(scope: Scope, claim: Body, pod: str, gtid: str) -> str | None:
    """Keep the volume under ``claim`` when the claim goes: reclaim policy Retain, labelled
    with the Database and annotated with the pod and the GTID position it held. Returns the
    volume's name (None for a claim not bound yet, which holds no data)."""
    volume = (claim.get("spec") or {}).get("volumeName")
    if not volume:
        # Unbound as last observed: asked afresh before the claim is deleted for good, since
        # a binding no watch event has brought yet would otherwise go with its data.
        fresh = await scope.kube.get(
            "v1", "PersistentVolumeClaim", scope.namespace, claim["metadata"]["name"]
        )
        volume = ((fresh or {}).get("spec") or {}).get("volumeName")
    if not volume:
        return None
    await scope.kube.patch(
        Ref("v1", "PersistentVolume", "", volume),
        {
            "metadata": {
                "labels": {DIVERGED_FROM_LABEL: f"{scope.namespace}.{scope.name}"},
                "annotations": dict(zip(DIVERGED_ANNOTATIONS, (pod, gtid), strict=True)),
            },
            "spec": {"persistentVolumeReclaimPolicy": "Retain"},
        },
    )
    return str(volume)


async def _reclone(scope: Scope, pod: Body, gtids: dict[str, str]) -> None:
    """A server whose data diverged from the primary's (it holds writes the primary never
    had: an old primary's unacknowledged tail) gets a new volume: its claim and its pod are
    deleted, and the StatefulSet makes both anew; the new server replicates from scratch.

    The old volume is never deleted: it holds the only copy of those transactions. Before
    its claim goes, its PersistentVolume is set to Retain and labelled, and a Warning Event
    names it and the transactions; deleting it is the user's decision."""
    name = pod["metadata"]["name"]
    claim = scope.observed("PersistentVolumeClaim", _claim_of(pod))
    kept = None
    if claim is not None and not claim["metadata"].get("deletionTimestamp"):
        kept = await _retain_volume(scope, claim, name, gtids.get(name, ""))
        await scope.kube.delete(Ref.of(claim))
    await scope.kube.delete(Ref.of(pod))
    scope.forget("Pod", name)
    held = gtids.get(name) or "unknown"
    primary = gtids.get(scope.primary or "") or "unknown"
    if kept:
        scope.diverged.append({"volume": kept, "pod": name, "gtid": held, "at": scope.now})
        _diverged_condition(scope)
    await scope.event(
        "ServerRecloned",
        f"{name} held transactions the primary {scope.primary} does not have (a former"
        f" primary's unacknowledged writes; its GTID position {held}, the primary's {primary});"
        " it gets a new volume and replicates anew"
        + (
            f". Its old volume is kept as PersistentVolume {kept} (reclaim policy Retain,"
            f" label {DIVERGED_FROM_LABEL}={scope.namespace}.{scope.name}); delete it when"
            " you no longer need those transactions"
            if kept
            else ""
        ),
        warning=True,
    )


async def check_diverged(scope: Scope) -> str | None:
    """``Diverged`` while a volume kept by :func:`_reclone` still exists: it holds the only
    copy of transactions the primary never had. Each is looked up (one GET, only while the
    list is not empty); one the user deleted leaves the list, and the condition with it."""
    if not scope.diverged and not cond.is_true(scope.conditions, "Diverged"):
        return None
    kept = []
    for entry in scope.diverged:
        if await scope.kube.get("v1", "PersistentVolume", "", entry["volume"]) is not None:
            kept.append(entry)
    gone = [e["volume"] for e in scope.diverged if e not in kept]
    scope.diverged[:] = kept
    _diverged_condition(scope)
    return f"diverged volumes deleted: {', '.join(gone)}" if gone else None


def _diverged_condition(scope: Scope) -> None:
    if not scope.diverged:
        scope.set_condition(
            "Diverged", False, "NoDivergedVolumes", "no volume holds transactions the primary lacks"
        )
        return
    kept = "; ".join(
        f"PersistentVolume {e['volume']} (from {e['pod']}, GTID position {e['gtid']})"
        for e in scope.diverged
    )
    scope.set_condition(
        "Diverged",
        True,
        "DivergedVolumeKept",
        f"kept because they hold transactions the primary never had: {kept}; recover what you"
        " need from them, then delete them (label"
        f" {DIVERGED_FROM_LABEL}={scope.namespace}.{scope.name})",
    )


async def _unstick(scope: Scope) -> None:
    """A pod made while its old claim was still being deleted waits for a volume that will
    never come: delete it, and the StatefulSet makes the claim and the pod together."""
    for pod in _server_pods(scope):
        if (pod.get("status") or {}).get("phase") != "Pending":
            continue
        claim = scope.observed("PersistentVolumeClaim", _claim_of(pod))
        if claim is None:
            # Only once the claim has had time to be made and seen: a new pod's claim
            # may simply not have reached the store yet.
            created = pod["metadata"].get("creationTimestamp") or scope.now
            if core.seconds_between(created, scope.now) < STUCK_AFTER:
                continue
        elif not claim["metadata"].get("deletionTimestamp"):
            continue
        await scope.kube.delete(Ref.of(pod))
        scope.forget("Pod", pod["metadata"]["name"])


# --- phases ------------------------------------------------------------------------------------


async def ensure_secrets(scope: Scope) -> str | None:
    database = scope.database
    outcome = await core.ensure_credentials(
        scope,
        database.uid,
        (
            core.Credential(
                database.credentials_secret_name,
                lambda: mysql_spec.credentials_secret(
                    database,
                    root_password=passwords.generate_password(),
                    replication_password=passwords.generate_password(),
                ),
            ),
            core.Credential(
                database.app_secret_name,
                lambda: mysql_spec.app_secret(database, password=passwords.generate_password()),
            ),
        ),
        data_volumes(scope),
        kind="Database",
    )
    if outcome.waiting is not None:
        scope.requeue(RECHECK)
        raise Stop(outcome.waiting)
    if outcome.unrecoverable:
        # Nothing may start on data whose passwords are lost: Degraded says how to recover.
        raise Stop(f"Secret {', '.join(outcome.unrecoverable)} missing for existing data")
    return f"created {', '.join(outcome.made)}" if outcome.made else None


async def ensure_tls(scope: Scope) -> str | None:
    """MariaDB: the Database's CA and its serving and client certificates (``NAME-ca``,
    ``NAME-tls``), before the servers that mount them."""
    database = scope.database
    note = await certificates.ensure(scope, database)
    ca_pem = await certificates.ca_cert(scope, database)
    if ca_pem is not None:
        await certificates.refresh_ca_copy(scope, database, database.app_secret_name, ca_pem)
    if scope.observed("Secret", database.tls_secret_name) is None:
        # No certificate to serve yet (the user's CA, spec.tls.caSecretName, is not there):
        # servers made now could not start. Degraded already says what to do.
        raise Stop(f"waiting for {database.tls_secret_name}")
    return note


async def apply_servers(scope: Scope) -> str | None:
    database = scope.database
    # Once the Database has had a primary it has data, for good: the mark is read back from
    # the ConfigMap itself, so it outlives the primary, the status and an operator restart.
    observed_config = scope.observed("ConfigMap", database.config_map_name)
    has_data = scope.primary is not None or mysql_spec.has_data_marked(observed_config)
    desired = mysql_spec.children(
        database, operator_namespace=scope.operator_namespace, has_data=has_data
    )
    _hold_scale_down(scope, desired)
    return await core.converge(scope, desired)


def _hold_scale_down(scope: Scope, desired: list[Body]) -> None:
    """``replicate`` moves the primary below the cut (``switch_below``) first."""
    scope.switch_below = core.hold_scale_down(
        scope,
        desired,
        wanted=scope.database.spec.replicas,
        primary=scope.primary,
        pods=_server_pods(scope),
    )


async def expand_volumes(scope: Scope) -> str | None:
    return await core.expand_volumes(scope, data_volumes(scope), scope.database.spec.storage.size)


# --- status ------------------------------------------------------------------------------------


def servers_status(scope: Scope, *, deleting: bool) -> dict[str, Any]:
    wanted = scope.database.spec.replicas
    statefulset = scope.observed("StatefulSet", scope.name) or {}
    ready = int((statefulset.get("status") or {}).get("readyReplicas") or 0)
    pods = _server_pods(scope)
    replicas = [
        p
        for p in pods
        if (p["metadata"].get("labels") or {}).get(meta.ROLE_LABEL) == meta.REPLICA_ROLE
    ]
    primary = scope.primary if scope.primary in {p["metadata"]["name"] for p in pods} else None
    is_ready = ready == wanted and primary is not None and len(replicas) == wanted - 1
    if is_ready:
        scope.set_condition(
            "Ready", True, "AllServersReady", f"{ready}/{wanted} ready, primary {primary}"
        )
    elif primary is None:
        scope.set_condition("Ready", False, "NoPrimary", f"{ready}/{wanted} ready, no primary yet")
    else:
        scope.set_condition(
            "Ready", False, "ServersNotReady",
            f"{ready}/{wanted} ready, {len(replicas)} of {wanted - 1} replicas replicating",
        )  # fmt: skip
    unschedulable = _unschedulable(pods)
    if unschedulable:
        scope.progressing.append(("ServersUnschedulable", unschedulable))
    if not is_ready and not scope.progressing:
        scope.progressing.append(("ServersStarting", f"{ready}/{wanted} ready"))
    scope.summarize("the servers match the spec")
    if deleting:
        phase = DatabasePhase.DELETING
    elif scope.degraded:
        phase = DatabasePhase.FAILED
    elif is_ready:
        phase = DatabasePhase.RUNNING
    elif (scope.body.get("status") or {}).get("phase") in (None, DatabasePhase.PENDING.value):
        phase = DatabasePhase.PENDING
    else:
        phase = DatabasePhase.UPDATING
    return {
        "phase": phase.value,
        "readyReplicas": ready,
        "primaryPod": primary,
        "conditions": scope.conditions,
        "lastFailover": scope.last_failover,
        "divergedVolumes": scope.diverged or None,
        "observedGeneration": scope.generation,
    }


# --- observations ------------------------------------------------------------------------------


def _server_pods(scope: Scope) -> list[Body]:
    selector = mysql_spec.selector_labels(scope.database)
    return [
        pod
        for pod in scope.owned("Pod")
        if all((pod["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
        and not pod["metadata"].get("deletionTimestamp")
    ]


def _unschedulable(pods: list[Body]) -> str | None:
    """Why servers wait for a node, as the scheduler says: each needs one of its own
    (``specs.mariadb.servers``: required anti-affinity), so a node lost to a fault takes one
    server."""
    waiting = []
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
                "PodScheduled", "False", "Unschedulable"
            ):  # fmt: skip
                waiting.append(f"{pod['metadata']['name']}: {condition.get('message') or ''}")
    if not waiting:
        return None
    return (
        f"{'; '.join(sorted(waiting))} — every server needs a node of its own, so that losing"
        " one node never takes two of them: add nodes, make one schedulable again, or lower"
        " spec.replicas"
    )


def _ip(pod: Body) -> str | None:
    return (pod.get("status") or {}).get("podIP")
