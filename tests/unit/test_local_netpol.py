"""The local cluster's NetworkPolicy enforcement, as the nftables it writes per node: what a
guarded pod admits, from whom, on which ports; pods no policy selects are left alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import config
from stateward_local.nodes import layout
from stateward_local.services import netpol
from tests.support import clusters

pytestmark = pytest.mark.unit


def pod(name: str, ns: str, ip: str, node: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node},
        "status": {"podIP": ip},
    }


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name, **labels}}}


NAMESPACES = [namespace("shop"), namespace("other", team="web"), namespace("stateward-system")]


def shipped(**spec: Any) -> dict[str, Any]:
    """The policy the operator ships for a PostgresCluster ``demo`` in ``shop``."""
    cluster = clusters.make_cluster(**spec)
    children = postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster))
    (policy,) = [o for o in children if o["kind"] == "NetworkPolicy"]
    return {**policy, "metadata": {**policy["metadata"], "namespace": "shop"}}


def instance(name: str, ip: str, node: str) -> dict[str, Any]:
    labels = shipped()["spec"]["podSelector"]["matchLabels"]
    return pod(name, "shop", ip, node, **labels)


PODS = [
    instance("demo-0", "10.244.1.2", "node-1"),
    instance("demo-1", "10.244.2.2", "node-2"),
    pod("app", "shop", "10.244.1.3", "node-1", app="web"),
    pod("intruder", "other", "10.244.2.9", "node-2"),
    pod("operator", "stateward-system", "10.244.3.4", "node-3"),
]


def lines(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines()]


def test_the_shipped_policy_guards_the_instance_with_a_drop_after_its_rules() -> None:
    script = netpol.scripts(["node-1"], PODS, NAMESPACES, [shipped()])["node-1"]
    rules = lines(script)
    guarded = [r for r in rules if r.startswith("ip daddr 10.244.1.2")]
    assert guarded == [
        # The namespace to PostgreSQL; the members to PostgreSQL and Patroni; the operator's
        # namespace to Patroni; every pod to the metrics; nothing else.
        "ip daddr 10.244.1.2 ip saddr { 10.244.1.2, 10.244.1.3, 10.244.2.2 } tcp dport 5432 accept",
        "ip daddr 10.244.1.2 ip saddr { 10.244.1.2, 10.244.2.2 } tcp dport 5432 accept",
        "ip daddr 10.244.1.2 ip saddr { 10.244.1.2, 10.244.2.2 } tcp dport 8008 accept",
        "ip daddr 10.244.1.2 ip saddr { 10.244.3.4 } tcp dport 8008 accept",
        "ip daddr 10.244.1.2 ip saddr { 10.244.1.2, 10.244.1.3, 10.244.2.2, 10.244.2.9,"
        " 10.244.3.4 } tcp dport 9187 accept",
        "ip daddr 10.244.1.2 drop",
    ]
    # Replies, the host (operator and tests run there) and the nodes (kube-proxy masquerades
    # what comes from outside the cluster as them) pass first; the app is not guarded.
    assert rules.index("ct state established,related accept") < rules.index(guarded[0])
    assert rules.index("ip saddr { 10.250.0.0/24 } accept") < rules.index(guarded[0])
    assert not [r for r in rules if "10.244.1.3 drop" in r]
    # The script replaces the table as a whole, and works when there is none yet.
    assert rules[:3] == [
        "table inet stateward-policy",
        "delete table inet stateward-policy",
        "table inet stateward-policy {",
    ]


def test_each_node_guards_only_the_pods_it_forwards_to() -> None:
    found = netpol.scripts(["node-1", "node-2", "node-3"], PODS, NAMESPACES, [shipped()])
    assert (
        "ip daddr 10.244.1.2 drop" in found["node-1"] and "10.244.2.2 drop" not in found["node-1"]
    )
    assert "ip daddr 10.244.2.2 drop" in found["node-2"]
    assert " drop" not in found["node-3"]
    only = netpol.scripts(["node-1"], PODS, NAMESPACES, [shipped()], only=["other"])
    assert " drop" not in only["node-1"], "--namespace other: shop's pods are left alone"


def test_peers_by_namespace_labels_expressions_and_ip_blocks() -> None:
    clients = [
        {"namespaceSelector": {"matchLabels": {"team": "web"}}},
        {"podSelector": {"matchExpressions": [{"key": "app", "operator": "In",
                                               "values": ["web", "api"]}]}},
        {"ipBlock": {"cidr": "10.8.0.0/16", "except": ["10.8.9.0/24"]}},
    ]  # fmt: skip
    script = netpol.scripts(["node-1"], PODS, NAMESPACES, [shipped(networkPolicy={
        "clients": clients})])["node-1"]  # fmt: skip
    rules = lines(script)
    assert "ip daddr 10.244.1.2 ip saddr { 10.244.2.9 } tcp dport 5432 accept" in rules
    assert "ip daddr 10.244.1.2 ip saddr { 10.244.1.3 } tcp dport 5432 accept" in rules
    assert (
        "ip daddr 10.244.1.2 ip saddr 10.8.0.0/16 ip saddr != { 10.8.9.0/24 } tcp dport 5432"
        " accept" in rules
    )


def test_selector_semantics() -> None:
    labels = {"app": "web", "tier": "front"}
    assert netpol._matches({}, labels) and netpol._matches(None, labels)
    assert netpol._matches({"matchLabels": {"app": "web"}}, labels)
    assert not netpol._matches({"matchLabels": {"app": "db"}}, labels)
    for operator, values, expected in (
        ("In", ["web"], True), ("In", ["db"], False), ("NotIn", ["web"], False),
        ("NotIn", ["db"], True), ("Exists", [], True), ("DoesNotExist", [], False),
    ):  # fmt: skip
        expression = {"key": "app", "operator": operator, "values": values}
        assert netpol._matches({"matchExpressions": [expression]}, labels) is expected


def test_a_rule_without_from_or_ports_admits_everyone_or_every_port() -> None:
    policy = {
        "metadata": {"name": "open", "namespace": "shop"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{}]},
    }
    rules = lines(netpol.scripts(["node-1"], PODS, NAMESPACES, [policy])["node-1"])
    assert "ip daddr 10.244.1.3 accept" in rules and "ip daddr 10.244.1.3 drop" in rules
    egress_only = {**policy, "spec": {**policy["spec"], "policyTypes": ["Egress"]}}
    assert " drop" not in netpol.scripts(["node-1"], PODS, NAMESPACES, [egress_only])["node-1"]


class Listing:
    """What the enforcer lists, as lightkube returns it."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        self.objects = objects

    def list(self, resource: Any, namespace: str | None = None) -> list[Any]:
        return [
            type("Item", (), {"to_dict": lambda self, o=o: o})()
            for o in self.objects[resource.__name__]
        ]


def test_a_table_is_written_once_and_again_into_a_node_started_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple[str, str]] = []
    monkeypatch.setattr(netpol, "_nft", lambda node, script: written.append((node.name, script)))
    slot = layout.Slot(2)
    (node,) = layout.nodes_in(tmp_path, 1, slot)
    node.net_ns.parent.mkdir(parents=True)
    listing = Listing(
        {
            "Pod": [instance("demo-0", "10.244.1.2", node.name)],
            "Namespace": NAMESPACES,
            "NetworkPolicy": [shipped()],
        }
    )
    applied: dict[str, tuple[int, str]] = {}
    real = {node.name: node}
    # A stopped node (no namespace) gets nothing, and nothing is remembered for it.
    netpol._round(listing, real, applied, (), slot)  # type: ignore[arg-type]
    assert written == [] and applied == {}
    node.net_ns.write_text("")
    netpol._round(listing, real, applied, (), slot)  # type: ignore[arg-type]
    netpol._round(listing, real, applied, (), slot)  # type: ignore[arg-type]
    assert len(written) == 1 and "ip daddr 10.244.1.2 drop" in written[0][1]
    # The round's own slot's node network (kubelet probes) passes, not slot 0's.
    assert "10.250.2.0/24" in written[0][1] and "10.250.0.0/24" not in written[0][1]
    # Started again, the node has a new namespace without the table: it is written again.
    anew = node.net_ns.with_name("new")
    anew.write_text("")
    anew.replace(node.net_ns)
    netpol._round(listing, real, applied, (), slot)  # type: ignore[arg-type]
    assert len(written) == 2 and written[1] == written[0]
