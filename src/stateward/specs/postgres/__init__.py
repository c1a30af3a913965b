"""The PostgreSQL engine's builders: a PostgresCluster model in, its desired children out.

``children`` is every child the reconciler applies, in order; the modules build one kind
each: ``statefulset`` (the instance pods), ``config`` (Patroni's configuration and its
ConfigMap), ``services``, ``pdb``, ``rbac`` (the pods' identities), ``secrets`` (the
credentials), ``backup`` (pgBackRest's options and the backup Jobs), ``pooler`` (PgBouncer)
and ``upgrade`` (the major upgrade's Job).
"""

from __future__ import annotations

from stateward.api import v1alpha1, validation
from stateward.instance import metrics, patroni
from stateward.specs import meta, network
from stateward.specs.postgres import backup, config, pdb, pooler, rbac, services, statefulset


def children(
    cluster: v1alpha1.PostgresCluster,
    *,
    patroni_config: config.PatroniConfig,
    operator_namespace: str = meta.OPERATOR_NAMESPACE,
    backup_image: str | None = None,
) -> list[meta.Object]:
    """Every owned child desired for ``cluster``, in apply order.

    ``patroni_config`` is ``config.patroni_config(cluster)``, built once per reconcile: its
    text goes into the ConfigMap, its hash into the pod template. ``backup_image``: what the
    backup Jobs run (the operator's own image; :func:`backup.backup_cronjob`).

    Not included: the Secrets (created once, with generated passwords), the final backup Job
    (created by the finalizer). Nor the fencing
    ConfigMap while the fencing annotation is invalid: the one applied last stays, so a typo
    never unfences an instance (admission refuses such a value; this covers older objects).
    """
    objects = [
        rbac.service_account(cluster),
        rbac.role(cluster),
        rbac.role_binding(cluster),
        config.config_map(cluster, patroni_yaml=patroni_config.text),
        *_fencing(cluster),
        services.headless_service(cluster),
        services.primary_service(cluster),
        services.replicas_service(cluster),
        pdb.pod_disruption_budget(cluster),
        *_network_policy(cluster, operator_namespace),
        statefulset.statefulset(cluster, config_hash=patroni_config.hash),
    ]
    objects += pooler.children(cluster, operator_namespace)
    if cluster.spec.backup is not None:
        objects += rbac.backup_identity(cluster)
    if cluster.spec.backup_schedule is not None and cluster.spec.backup is not None:
        objects.append(backup.backup_cronjob(cluster, image=backup_image))
    return objects


def _network_policy(
    cluster: v1alpha1.PostgresCluster, operator_namespace: str
) -> list[meta.Object]:
    """PostgreSQL to the clients, the members and the operator's namespace (which calls
    Patroni's REST API, never PostgreSQL), and to the pooler's pods when there is one
    (whoever the clients are); the REST API to the members and the operator."""
    if not cluster.spec.network_policy.enabled:
        return []
    poolers = (
        []
        if cluster.spec.pooler is None
        else [
            {
                "from": [{"podSelector": {"matchLabels": pooler.selector_labels(cluster)}}],
                "ports": network.ports([patroni.POSTGRES_PORT]),
            }
        ]
    )
    return [
        network.network_policy(
            cluster.spec.network_policy,
            metadata=meta.object_meta(cluster, cluster.name, component=meta.INSTANCE_COMPONENT),
            selector=meta.selector_labels(cluster),
            client_ports=[patroni.POSTGRES_PORT],
            member_ports=[patroni.POSTGRES_PORT, patroni.RESTAPI_PORT],
            operator_ports=[patroni.RESTAPI_PORT],
            operator_namespace=operator_namespace,
            metrics_ports=[metrics.PORT],
            also=poolers,
        )
    ]


def _fencing(cluster: v1alpha1.PostgresCluster) -> list[meta.Object]:
    try:
        instances = validation.fenced_instances(cluster.metadata.get("annotations"))
    except ValueError:
        return []
    return [config.fencing_config_map(cluster, instances)]
