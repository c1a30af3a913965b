"""The NetworkPolicy on the database pods: by default the database port is open to the
namespace, the ports the members use among themselves to the members only, what the operator
calls to the operator's namespace — and nothing else comes in."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api import v1alpha1
from stateward.specs import postgres as postgres_specs
from stateward.specs.mariadb import servers as mysql_spec
from stateward.specs.postgres import config
from tests.support import clusters
from tests.unit.test_specs_database import make_database

pytestmark = pytest.mark.unit


def policy_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return found


def postgres(**spec: Any) -> dict[str, Any]:
    cluster = clusters.make_cluster(**spec)
    return policy_of(
        postgres_specs.children(
            cluster, patroni_config=config.patroni_config(cluster), operator_namespace="ops"
        )
    )


def rules(policy: dict[str, Any]) -> list[tuple[list[dict[str, Any]], list[int]]]:
    return [(r["from"], [p["port"] for p in r["ports"]]) for r in policy["spec"]["ingress"]]


def test_a_postgres_cluster_admits_its_namespace_to_postgres_and_only_itself_to_patroni() -> None:
    policy = postgres()
    assert policy["metadata"]["name"] == "demo"
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        >= {"stateward.io/cluster": "demo"}.items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"], "what the pods reach out to is free"
    found = rules(policy)
    assert found[0] == ([{"podSelector": {}}], [5432]), "every pod of the namespace"
    assert found[1][1] == [5432, 8008] and found[1][0] == [
        {"podSelector": {"matchLabels": policy["spec"]["podSelector"]["matchLabels"]}}
    ]
    assert found[2] == (
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}}],
        [8008],
    ), "the operator calls Patroni's REST API, never PostgreSQL"
    assert found[3] == ([{"namespaceSelector": {}}], [9187]), "Prometheus, in any namespace"
    assert len(found) == 4


def test_clients_narrow_the_database_port_and_an_empty_list_closes_it() -> None:
    web = {"podSelector": {"matchLabels": {"app": "web"}}}
    office = {"ipBlock": {"cidr": "10.8.0.0/16", "except": ["10.8.9.0/24"]}}
    found = rules(postgres(networkPolicy={"clients": [web, office]}))
    assert found[0] == ([web, office], [5432])
    closed = rules(postgres(networkPolicy={"clients": []}))
    # No client rule at all: an ingress rule with an empty "from" would admit everyone.
    assert [ports for _, ports in closed] == [[5432, 8008], [8008], [9187]]


def test_metrics_scrapers_can_be_narrowed_and_an_empty_list_closes_the_port() -> None:
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
    found = rules(postgres(networkPolicy={"metrics": [prometheus]}))
    assert found[-1] == ([prometheus], [9187])
    closed = rules(postgres(networkPolicy={"metrics": []}))
    assert [ports for _, ports in closed] == [[5432], [5432, 8008], [8008]]


def test_the_policy_can_be_turned_off_for_clusters_governed_by_another() -> None:
    cluster = clusters.make_cluster(networkPolicy={"enabled": False})
    kinds = [
        o["kind"]
        for o in postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster))
    ]
    assert "NetworkPolicy" not in kinds


def test_mariadb_s_clone_port_is_open_to_its_servers_only() -> None:
    database = make_database("mariadb")
    policy = policy_of(mysql_spec.children(database, operator_namespace="ops"))
    found = rules(policy)
    assert found[0] == ([{"podSelector": {}}], [3306])
    assert found[1][1] == [3306, 3307]
    assert found[1][0] == [{"podSelector": {"matchLabels": mysql_spec.selector_labels(database)}}]
    assert found[2][1] == [3306], "the operator speaks SQL to the servers"
    mysql = rules(policy_of(mysql_spec.children(make_database("mysql"))))
    assert mysql[1][1] == [3306] and mysql[2][0][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "stateward-system"
    }


def test_a_peer_is_refused_unless_it_is_a_known_shape() -> None:
    with pytest.raises(ValueError, match="podSelectr"):
        v1alpha1.NetworkPolicySpec.model_validate({"clients": [{"podSelectr": {}}]})
