"""Patroni's configuration is rendered once per distinct cluster object
(stateward.controllers.postgres.scope.PatroniConfigs): the reconciles that follow every
starting pod do not render it again, and any change of the cluster does."""

from __future__ import annotations

import pytest

from stateward.controllers.postgres import scope as scope_module
from stateward.controllers.postgres.scope import PatroniConfigs
from stateward.specs.postgres import config as config_spec
from tests.support.clusters import make_cluster

pytestmark = pytest.mark.unit


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    rendered: list[str] = []
    render = config_spec.patroni_config

    def counting(cluster):  # type: ignore[no-untyped-def]
        rendered.append(cluster.name)
        return render(cluster)

    monkeypatch.setattr(scope_module.config_spec, "patroni_config", counting)
    return rendered


def test_the_same_cluster_is_rendered_once_and_gets_what_rendering_gives(
    renders: list[str],
) -> None:
    configs, cluster = PatroniConfigs(), make_cluster()
    first = configs.of(cluster)
    assert configs.of(make_cluster()) is first, "an equal cluster object, as each reconcile builds"
    assert renders == [cluster.name]
    assert first == config_spec.patroni_config(cluster)


def test_any_change_of_the_cluster_renders_anew(renders: list[str]) -> None:
    configs = PatroniConfigs()
    before = configs.of(make_cluster())
    after = configs.of(make_cluster(version="15"))
    assert len(renders) == 2
    assert "/15/" in after.text and after.hash != before.hash
    relabelled = make_cluster(metadata={"labels": {"team": "a"}})
    configs.of(relabelled)
    assert len(renders) == 3, "the metadata is part of the object rendered from"


def test_clusters_are_kept_apart_and_a_forgotten_one_is_freed(renders: list[str]) -> None:
    configs = PatroniConfigs()
    one = make_cluster(metadata={"name": "one"})
    two = make_cluster(metadata={"name": "two"})
    configs.of(one), configs.of(two), configs.of(one)
    assert renders == ["one", "two"] and len(configs) == 2
    configs.forget(one.namespace, "one")
    assert len(configs) == 1
    configs.of(one)
    assert renders == ["one", "two", "one"]
