"""The scope of one PostgresCluster reconcile: the cluster, its observed children, and what
the phases decided. Shared by the reconciler (``reconcile``), its phase modules
(``backup_phases``, ``deletion``, ``status``) and the data plane (``dataplane``), which
import it from here rather than from each other; so are the helpers and recheck intervals
that more than one of them uses."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from typing import Any, Final

from stateward.api.v1alpha1 import PostgresCluster
from stateward.controllers import core
from stateward.controllers.kube import Body, PatroniAccess, Ref
from stateward.controllers.postgres.members import Member, member
from stateward.instance import patroni
from stateward.specs import meta, tls
from stateward.specs.postgres import config as config_spec
from stateward.specs.postgres import secrets

JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
# Seconds after which the phases look again: while pods roll or the cluster's own objects are
# awaited; while something makes progress (a Job runs, instances start); while only the user
# can fix what is wrong (a backstop: most changes arrive by watch).
ROLL_RECHECK = 2.0
PROGRESS_RECHECK = 5.0
STARTING_RECHECK = 30.0
"""While instances start: everything that moves them (pods, the StatefulSet's counts,
Patroni's member records) arrives by watch, so this is only a backstop. At 5 s, 300
clusters coming up at once made 40 reconciles a second that found nothing new, on the CPUs
their pods were starting on."""
UNSATISFIABLE_RECHECK = 30.0


class PatroniConfigs:
    """Patroni's configuration of each cluster, rendered once for each distinct cluster
    object. A reconcile renders it to compare the ConfigMap and to stamp the pod template;
    rendering (building the document, dumping it as YAML, hashing it) was a tenth of the
    operator's CPU while 300 starting pods reconciled their clusters 25 times each, with
    the same cluster every time. Keyed by a digest of the whole cluster object the
    configuration is rendered from, so any change of it renders anew; freed with the
    cluster (:meth:`forget`)."""

    def __init__(self) -> None:
        self._rendered: dict[tuple[str, str], tuple[bytes, config_spec.PatroniConfig]] = {}

    def of(self, cluster: PostgresCluster) -> config_spec.PatroniConfig:
        key = (cluster.namespace, cluster.name)
        digest = hashlib.sha256(cluster.model_dump_json().encode()).digest()
        cached = self._rendered.get(key)
        if cached is not None and cached[0] == digest:
            return cached[1]
        rendered = config_spec.patroni_config(cluster)
        self._rendered[key] = (digest, rendered)
        return rendered

    def forget(self, namespace: str, name: str) -> None:
        self._rendered.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._rendered)


@dataclasses.dataclass(kw_only=True)
class Scope(core.Scope):
    """One reconcile's view: the cluster, its observed children, and what was decided."""

    cluster: PostgresCluster
    final_backup_attempts: int | None = None
    switchover: dict[str, Any] | None = None
    """``status.switchover``: read at the start, updated by the switchover phases."""
    last_failover: dict[str, Any] | None = None
    """``status.lastFailover``: read at the start, replaced when a failover is seen."""
    rolling_restart: dict[str, Any] | None = None
    """``status.rollingRestart``: the restart being rolled for a parameter change."""
    sync: frozenset[str] = frozenset()
    """The synchronous standbys, as Patroni last recorded them."""
    scale_down_to: int | None = None
    """Set when a scale-down waits for the primary to move below this ordinal."""
    fenced: list[str] = dataclasses.field(default_factory=list)
    """The fenced instances the annotation asks for (``["*"]`` for all)."""
    backups: dict[str, Any] | None = None
    """``status.backups``: read at the start, updated from the backup pods' reports."""
    on_demand_backup: dict[str, Any] | None = None
    """``status.onDemandBackup``: the last ``stateward.io/backup`` request and its outcome."""
    credentials_checked: dict[tuple[str, str], tuple[int, float]] = dataclasses.field(
        default_factory=dict
    )
    """Shared by one reconciler's scopes: see ``Reconciler.credentials_checked``."""
    credential_keys: dict[tuple[str, str], tuple[frozenset[str], float]] = dataclasses.field(
        default_factory=dict
    )
    """Shared by one reconciler's scopes: see ``Reconciler.credential_keys``."""
    backup_image: str | None = None
    """The operator's own image, which backup Jobs run; None: each cluster's instance image."""
    paused_poolers: dict[tuple[str, str], list[str]] = dataclasses.field(default_factory=dict)
    """Shared by one reconciler's scopes: per cluster, the pooler pods this operator paused
    and has not resumed; no entry yet: unknown (``controllers.postgres.poolers``)."""
    patroni_configs: PatroniConfigs = dataclasses.field(default_factory=PatroniConfigs)
    """Shared by one reconciler's scopes: see :class:`PatroniConfigs`."""
    upgrade: dict[str, Any] | None = None
    """``status.upgrade``: the running or last major upgrade (``controllers.postgres.upgrades``)."""
    version: str | None = None
    """``status.version``: the version the data files are of, as last recorded."""
    children_version: str | None = None
    """While an upgrade runs: the version the children are built for instead of the spec's."""
    children_replicas: int | None = None
    """While an upgrade runs: the instances wanted instead of the spec's (1, then 0)."""
    hold_data_plane: bool = False
    """Set while an upgrade has (or is taking) every instance down: the phases that follow
    Patroni do not run (``controllers.postgres.upgrades.gate``)."""
    halted: bool = False
    """Set by a phase after which none may run (the spec must change first)."""
    _members: list[Member] | None = dataclasses.field(default=None, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.cluster.name

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    @property
    def generation(self) -> int:
        return self.cluster.generation

    @property
    def members(self) -> list[Member]:
        """The instance pods with Patroni's records of them (computed once per reconcile)."""
        if self._members is None:
            self._members = [member(pod) for pod in instance_pods(self)]
        return self._members

    async def restapi_auth(self) -> PatroniAccess | None:
        """How to reach Patroni's REST API: its credentials (``NAME-patroni-api``) and the CA
        its certificate is signed by (``ca.crt`` of ``NAME-tls``, only that key), or None while
        either is missing or incomplete (``ensure_secrets`` and ``ensure_tls`` make them)."""
        data = await self.secrets.read(self, self.cluster.restapi_secret_name)
        if not data or not data.get(secrets.USERNAME_KEY) or not data.get(secrets.PASSWORD_KEY):
            return None
        served = await self.secrets.read(
            self, self.cluster.tls_secret_name, keys=frozenset({tls.CA_CERT_KEY})
        )
        if not served or not served.get(tls.CA_CERT_KEY):
            return None
        return PatroniAccess(
            data[secrets.USERNAME_KEY], data[secrets.PASSWORD_KEY], served[tls.CA_CERT_KEY]
        )

    def forget(self, kind: str, name: str) -> None:
        """A child this reconcile deleted: gone from the store, and from ``members`` too, so
        later phases do not act on a pod that is going away."""
        super().forget(kind, name)
        if kind == "Pod":
            self._members = None

    def observe(self, body: Body) -> None:
        """A child this reconcile changed: the store holds the new body for later phases."""
        super().observe(body)
        if body.get("kind") == "Pod":
            self._members = None


def instance_pods(scope: Scope, *, including_deleting: bool = False) -> list[Body]:
    """The instance pods; those being deleted too with ``including_deleting`` (a terminating
    pod may still run PostgreSQL)."""
    return [
        pod
        for pod in scope.owned("Pod")
        if (including_deleting or not pod["metadata"].get("deletionTimestamp"))
        and (pod["metadata"].get("labels") or {}).get(meta.COMPONENT_LABEL)
        == meta.INSTANCE_COMPONENT
    ]


def data_volumes(scope: Scope) -> list[Body]:
    """The instances' volumes: every claim the cluster owns but the backup repository's."""
    return [
        claim
        for claim in scope.owned("PersistentVolumeClaim")
        if (claim["metadata"].get("labels") or {}).get(meta.BACKUP_REPOSITORY_LABEL) != "true"
    ]


def pod_role(pod: Body) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(meta.ROLE_LABEL)


def job_state(job: Body) -> str:
    """``Complete``, ``Failed`` or ``Running``, by the Job's conditions."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return str(condition["type"])
    return "Running"


def job_pods(scope: Scope, job_name: str, *, including_deleting: bool = False) -> list[Body]:
    """The pods of the cluster's Job ``job_name``."""
    return [
        pod
        for pod in scope.owned("Pod")
        if (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == job_name
        and (including_deleting or not pod["metadata"].get("deletionTimestamp"))
    ]


async def delete_patroni_state(scope: Scope) -> None:
    """Patroni's own ConfigMaps (``NAME-leader``, ``NAME-config``, ...) carry no owner
    reference, so garbage collection would leave them behind; a later cluster of the same
    name (or the same cluster on upgraded data) would then find a stale leader lock, system
    identifier and timeline history. Only those exact names, and only without an owner: a
    user's ConfigMap that merely carries our label stays."""
    found = await scope.kube.list_objects(
        "v1", "ConfigMap", scope.namespace, {meta.CLUSTER_LABEL: scope.cluster.name}
    )
    names = patroni.state_config_maps(scope.cluster.name)
    for config_map in found:
        if config_map["metadata"]["name"] in names and not config_map["metadata"].get(
            "ownerReferences"
        ):
            await scope.kube.delete(Ref.of(config_map))


async def delete_observed(scope: Scope, kinds: Iterable[str], name: str) -> list[str]:
    """Delete the children called ``name`` of each of ``kinds`` that the store holds, and
    forget them; the kinds it deleted."""
    deleted = []
    for kind in kinds:
        observed = scope.observed(kind, name)
        if observed is not None:
            await scope.kube.delete(Ref.of(observed))
            scope.forget(kind, name)
            deleted.append(kind)
    return deleted
