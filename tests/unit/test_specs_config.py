"""The Patroni ConfigMap and its hash."""

from __future__ import annotations

import pytest
import yaml

from stateward.specs import meta
from stateward.specs.postgres import config
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


def test_config_map() -> None:
    cluster = make_cluster()
    config_map = config.config_map(cluster, patroni_yaml=config.render(cluster))
    assert config_map["apiVersion"] == "v1"
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"] == {
        "name": "demo-patroni",
        "namespace": "db",
        "labels": meta.labels(cluster),
        "ownerReferences": [meta.owner_reference(cluster)],
    }
    assert config_map["data"] == {"patroni.yaml": config.render(cluster)}


def test_config_map_name_avoids_patronis_own_config_map() -> None:
    cluster = make_cluster()
    assert cluster.patroni_config_map_name != f"{cluster.name}-config"
    assert cluster.patroni_config_map_name != cluster.leader_config_map_name


def test_config_map_is_invisible_to_patronis_label_selector() -> None:
    cluster = make_cluster()
    labels = config.config_map(cluster, patroni_yaml=config.render(cluster))["metadata"]["labels"]
    assert not meta.selector_labels(cluster).items() <= labels.items()


def test_rendered_configuration_uses_the_instance_selector_labels() -> None:
    cluster = make_cluster()
    document = yaml.safe_load(config.render(cluster))
    assert document["kubernetes"]["labels"] == meta.selector_labels(cluster)
    assert document["kubernetes"]["role_label"] == meta.ROLE_LABEL
    assert document["kubernetes"]["scope_label"] == meta.CLUSTER_LABEL


def test_config_hash_is_short_hex_and_deterministic() -> None:
    first = config.config_hash(make_cluster())
    assert len(first) == 16
    int(first, 16)
    assert config.config_hash(make_cluster()) == first


def test_config_hash_follows_the_configuration() -> None:
    base = config.config_hash(make_cluster())
    assert config.config_hash(make_cluster(version="17")) != base


def test_parameters_do_not_roll_pods_but_reach_the_bootstrap_configuration() -> None:
    """Parameters live in bootstrap.dcs, which Patroni reads only once; changing them must
    not restart every pod (the operator applies them through PATCH /config instead)."""
    tuned = make_cluster(postgresql={"parameters": {"work_mem": "8MB"}})
    assert config.config_hash(tuned) == config.config_hash(make_cluster())
    rendered = yaml.safe_load(config.render(tuned))
    assert rendered["bootstrap"]["dcs"]["postgresql"]["parameters"]["work_mem"] == "8MB"


def test_config_hash_ignores_what_the_configuration_does_not_contain() -> None:
    base = config.config_hash(make_cluster())
    assert config.config_hash(make_cluster(replicas=5)) == base
    assert config.config_hash(make_cluster(storageSize="5Gi")) == base
    assert config.config_hash(make_cluster(backupSchedule="0 3 * * *")) == base
