"""The NetworkPolicy of a cluster's database pods (a PostgresCluster's instances, a MariaDB or
MySQL Database's servers): who may reach which port.

Four groups of ports, four rules, and nothing else in (ingress only; what the pods reach
out to — the object store, the API server — is not restricted):

* the database port, to the ``clients`` of ``spec.networkPolicy`` (by default every pod in
  the cluster's namespace);
* every port the members use among themselves (replication, Patroni's REST API, MariaDB's
  clone port), to the cluster's own pods only;
* what the operator calls (Patroni's REST API; MariaDB's SQL port), to the operator's
  namespace;
* the metrics port (a PostgreSQL instance's 9187, a MariaDB server's 9104), to
  ``spec.networkPolicy.metrics`` (by default every namespace: Prometheus runs in its own).

Kubelet probes come from the node, which NetworkPolicy implementations let through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stateward.api import v1alpha1
from stateward.specs import meta

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""Every namespace carries its own name under this label (set by the API server)."""


def network_policy(
    spec: v1alpha1.NetworkPolicySpec,
    *,
    metadata: meta.Object,
    selector: Mapping[str, str],
    client_ports: Sequence[int],
    member_ports: Sequence[int],
    operator_ports: Sequence[int],
    operator_namespace: str,
    metrics_ports: Sequence[int] = (),
    also: Sequence[meta.Object] = (),
) -> meta.Object:
    """The policy named in ``metadata`` for the pods ``selector`` picks; ``also`` adds
    whole rules (a pooler's pods to the database port)."""
    clients = client_peers(spec)
    members = [{"podSelector": {"matchLabels": dict(selector)}}]
    operator = [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}}}]
    rules = [
        {"from": members, "ports": _ports(member_ports)},
        {"from": operator, "ports": _ports(operator_ports)},
    ]
    if clients:  # [] : no client rule at all (an empty "from" would admit everyone)
        rules.insert(0, {"from": clients, "ports": _ports(client_ports)})
    scrapers: list[meta.Object] = (
        [{"namespaceSelector": {}}]  # every pod of every namespace
        if spec.metrics is None
        else [peer.model_dump(by_alias=True, exclude_none=True) for peer in spec.metrics]
    )
    if metrics_ports and scrapers:
        rules.append({"from": scrapers, "ports": _ports(metrics_ports)})
    rules += also
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def client_peers(spec: v1alpha1.NetworkPolicySpec) -> list[meta.Object]:
    """Who ``spec.networkPolicy.clients`` lets reach a database (or pooler) port; ``[]``
    admits nobody (a rule must then be left out: an empty ``from`` admits everyone)."""
    if spec.clients is None:
        return [{"podSelector": {}}]  # every pod of the owner's namespace
    return [peer.model_dump(by_alias=True, exclude_none=True) for peer in spec.clients]


def ports(numbers: Sequence[int]) -> list[meta.Object]:
    """TCP ports as a rule lists them; never empty (no ports in a rule means every port)."""
    if not numbers:
        raise ValueError("a rule with no ports would admit every port")
    return _ports(numbers)


def _ports(ports: Sequence[int]) -> list[meta.Object]:
    return [{"protocol": "TCP", "port": port} for port in sorted(set(ports))]
