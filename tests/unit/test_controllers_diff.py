"""Containment: API-server defaults are not drift, our own fields are; and the applied hash:
a field we stopped setting is drift too."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stateward.api.v1alpha1 import PostgresCluster
from stateward.controllers.core import IMMUTABLE_STATEFULSET_FIELDS
from stateward.controllers.diff import (
    FIELDS_DROPPED,
    NOT_YET_STAMPED,
    applied_hash,
    differences,
    drift,
    stamped,
)
from stateward.specs import meta
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import config
from tests.support import clusters

pytestmark = pytest.mark.unit


def test_defaults_added_by_the_server_are_not_drift() -> None:
    desired = {"spec": {"ports": [{"port": 5432}], "selector": {"a": "b"}}}
    observed = {
        "spec": {
            "ports": [{"port": 5432, "protocol": "TCP", "targetPort": 5432}],
            "selector": {"a": "b"},
            "clusterIP": "10.96.0.7",
        },
        "status": {},
    }
    assert differences(observed, desired) == []


@pytest.mark.parametrize(
    ("observed", "path"),
    [
        ({"spec": {"selector": {"a": "c"}}}, ".spec.selector.a"),
        ({"spec": {}}, ".spec.selector"),
        ({"spec": {"selector": "text"}}, ".spec.selector"),
        ({}, ".spec"),
    ],
)
def test_changed_or_missing_fields_are_drift(observed: dict[str, object], path: str) -> None:
    assert differences(observed, {"spec": {"selector": {"a": "b"}}}) == [path]


def test_lists_must_match_in_length_and_order() -> None:
    desired = {"args": ["a", "b"]}
    assert differences({"args": ["a", "b"]}, desired) == []
    assert differences({"args": ["b", "a"]}, desired) == [".args[0]", ".args[1]"]
    assert differences({"args": ["a"]}, desired) == [".args"]
    assert differences({"args": ["a", "b", "c"]}, desired) == [".args"]


def test_every_difference_is_named() -> None:
    desired = {"a": 1, "b": {"c": 2, "d": [{"e": 3}]}}
    observed = {"a": 2, "b": {"c": 2, "d": [{"e": 4, "f": 5}]}}
    assert differences(observed, desired) == [".a", ".b.d[0].e"]


def test_scalars_compare_by_value_and_type() -> None:
    assert differences(1, 1) == []
    assert differences("1", 1) == ["."]


@pytest.mark.parametrize(
    ("observed", "desired"),
    [("1Gi", "1024Mi"), ("1", "1000m"), ("500m", "0.5"), ("2G", "2000M")],
)
def test_quantities_compare_by_value(observed: str, desired: str) -> None:
    # The API server canonicalizes quantities; that is not drift.
    have = {"resources": {"requests": {"memory": observed}}}
    want = {"resources": {"requests": {"memory": desired}}}
    assert differences(have, want) == []


def test_a_changed_quantity_is_drift_and_other_strings_compare_exactly() -> None:
    assert differences({"r": {"limits": {"cpu": "1"}}}, {"r": {"limits": {"cpu": "2"}}}) == [
        ".r.limits.cpu"
    ]
    assert differences({"image": "pg:1"}, {"image": "pg:1.0"}) == [".image"]


# --- pruning: a field we stopped setting must still cause an apply ------------------------


def stored(applied: dict[str, Any]) -> dict[str, Any]:
    """What the API server keeps after an apply: our fields plus its own and its defaults."""
    body = copy.deepcopy(applied)
    body["metadata"].update(
        {"uid": "u-1", "resourceVersion": "17", "generation": 1, "managedFields": [{"x": 1}]}
    )
    body["metadata"].setdefault("annotations", {})["other.io/by-someone-else"] = "yes"
    body["status"] = {"observedGeneration": 1}
    for container in body.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        container["terminationMessagePath"] = "/dev/termination-log"
        for port in container.get("ports", []):
            port["protocol"] = "TCP"
    return body


def stamp_all(cluster: PostgresCluster) -> dict[str, dict[str, Any]]:
    """Every child as the reconciler applies it, by kind and name."""
    result = {}
    for child in postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster)):
        exclude = IMMUTABLE_STATEFULSET_FIELDS if child["kind"] == "StatefulSet" else ()
        result[f"{child['kind']} {child['metadata']['name']}"] = stamped(child, exclude=exclude)
    return result


HASH_PATH = f".metadata.annotations.{meta.APPLIED_HASH_ANNOTATION}"
LIMITS = {"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi", "cpu": "2"}}


def test_a_converged_child_needs_no_apply() -> None:
    for key, child in stamp_all(clusters.make_cluster(resources=LIMITS)).items():
        assert drift(stored(child), child) == [], key


def test_cleared_limits_are_drift_though_the_old_object_contains_the_new_one() -> None:
    before = stamp_all(clusters.make_cluster(resources=LIMITS))
    after = stamp_all(clusters.make_cluster(resources={"requests": {"cpu": "250m"}}))
    observed = stored(before["StatefulSet demo"])
    # The bug: containment holds, so without the hash nothing would ever prune the limits.
    assert differences(observed, after["StatefulSet demo"]) == [
        f".metadata.annotations.{meta.APPLIED_HASH_ANNOTATION}"
    ]
    assert drift(observed, after["StatefulSet demo"]) == [FIELDS_DROPPED]
    # Only the StatefulSet carries resources: nothing else is applied.
    others = {k: drift(stored(before[k]), after[k]) for k in after if k != "StatefulSet demo"}
    assert len(others) >= 8 and not any(others.values()), others


def test_clearing_every_resource_removes_the_resources_map_and_is_drift() -> None:
    before = stamp_all(clusters.make_cluster(resources=LIMITS))["StatefulSet demo"]
    after = stamp_all(clusters.make_cluster())["StatefulSet demo"]
    assert "resources" not in after["spec"]["template"]["spec"]["containers"][0]
    assert drift(stored(before), after) == [FIELDS_DROPPED]


BASE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "x", "labels": {"a": "1", "b": "2"}, "annotations": {"n": "1"}},
    "data": {"k": "v", "gone": "soon"},
    "spec": {"items": [{"name": "one", "env": [{"name": "E", "value": "1"}], "opt": True}]},
}


def _removed(path: list[str | int]) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    node: Any = body
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return body


@pytest.mark.parametrize(
    "path",
    [
        ["data", "gone"],
        ["metadata", "labels", "b"],
        ["metadata", "annotations", "n"],
        ["spec", "items", 0, "opt"],
        ["spec", "items", 0, "env", 0, "value"],
        ["spec", "items", 0, "env"],
        ["spec"],
    ],
)
def test_any_removed_field_is_drift(path: list[str | int]) -> None:
    observed = stored(stamped(BASE))
    desired = stamped(_removed(path))
    assert differences(observed, desired) in ([], [HASH_PATH])
    assert drift(observed, desired) == [FIELDS_DROPPED]
    # After the apply (SSA pruned the field) the child is converged again.
    assert drift(stored(desired), desired) == []


def test_a_changed_value_is_named_by_its_path_not_hidden_behind_the_hash() -> None:
    observed = stored(stamped(BASE))
    changed = copy.deepcopy(BASE)
    changed["data"]["k"] = "w"
    del changed["data"]["gone"]
    assert drift(observed, stamped(changed)) == [".data.k"]


def test_hand_edits_are_still_drift_when_the_hash_matches() -> None:
    desired = stamped(BASE)
    observed = stored(desired)
    observed["metadata"]["labels"]["a"] = "edited"
    del observed["data"]["k"]
    assert drift(observed, desired) == [".data.k", ".metadata.labels.a"]


def test_an_object_applied_before_the_hash_existed_is_applied_once() -> None:
    desired = stamped(BASE)
    old = stored(BASE)  # an old child: our fields, no hash annotation at all
    assert meta.APPLIED_HASH_ANNOTATION not in old["metadata"]["annotations"]
    assert drift(old, desired) == [NOT_YET_STAMPED]
    assert drift(stored(desired), desired) == []
    bare = copy.deepcopy(old)
    del bare["metadata"]["annotations"]
    assert drift(bare, stamped({**BASE, "metadata": {"name": "x"}})) == [NOT_YET_STAMPED]


def test_an_old_object_with_real_drift_names_the_drift() -> None:
    old = stored(BASE)
    changed = copy.deepcopy(BASE)
    changed["data"]["k"] = "w"
    assert drift(old, stamped(changed)) == [".data.k"]


def test_an_unstamped_desired_object_is_plain_containment() -> None:
    assert drift(stored(stamped(BASE)), BASE) == []
    assert drift(stored(BASE), _removed(["data", "gone"])) == []


def test_a_respelled_quantity_applies_once() -> None:
    # "1Gi" and "1024Mi" are equal, so no path differs, but what we send changed: one apply,
    # after which the hash matches again.
    before = stamped({"metadata": {"name": "x"}, "r": {"limits": {"memory": "1Gi"}}})
    after = stamped({"metadata": {"name": "x"}, "r": {"limits": {"memory": "1024Mi"}}})
    assert drift(stored(before), after) == [FIELDS_DROPPED]
    assert drift(stored(after), after) == []


def test_the_hash_ignores_key_order_and_its_own_annotation() -> None:
    reordered = json.loads(json.dumps(BASE, sort_keys=True))
    reordered["data"] = {"gone": "soon", "k": "v"}
    assert applied_hash(reordered) == applied_hash(BASE)
    assert applied_hash(stamped(BASE)) == applied_hash(BASE)
    assert stamped(stamped(BASE)) == stamped(BASE)
    only = {"metadata": {"name": "x"}}
    assert applied_hash(stamped(only)) == applied_hash(only)


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b["data"].update(k="w"),
        lambda b: b["data"].update(new="x"),
        lambda b: b["data"].pop("gone"),
        lambda b: b["spec"]["items"].append({"name": "two"}),
        lambda b: b["spec"]["items"][0]["env"].insert(0, {"name": "F"}),
        lambda b: b["metadata"]["labels"].pop("a"),
        lambda b: b["metadata"]["annotations"].update(n="2"),
        lambda b: b.update(kind="Secret"),
        lambda b: b["data"].update(k=1),
    ],
)
def test_the_hash_changes_with_any_change(change: Callable[[dict[str, Any]], object]) -> None:
    body = copy.deepcopy(BASE)
    change(body)
    assert applied_hash(body) != applied_hash(BASE)


def test_excluded_paths_do_not_count() -> None:
    exclude = [".spec.items", ".data.gone", ".no.such.path", ".metadata.name.deeper"]
    changed = copy.deepcopy(BASE)
    changed["spec"]["items"] = []
    del changed["data"]["gone"]
    assert applied_hash(changed, exclude=exclude) == applied_hash(BASE, exclude=exclude)
    assert applied_hash(changed, exclude=exclude) != applied_hash(changed)
    changed["data"]["k"] = "w"
    assert applied_hash(changed, exclude=exclude) != applied_hash(BASE, exclude=exclude)


def test_removed_immutable_statefulset_fields_are_not_applied() -> None:
    # The API server would refuse the apply; such a change waits for a recreation.
    before = stamp_all(clusters.make_cluster())["StatefulSet demo"]
    after = copy.deepcopy(before)
    after["metadata"]["annotations"] = {}
    del after["spec"]["volumeClaimTemplates"][0]["spec"]["accessModes"]
    after = stamped(after, exclude=IMMUTABLE_STATEFULSET_FIELDS)
    assert drift(stored(before), after) == []


def test_stamping_copies_and_keeps_other_annotations() -> None:
    original = copy.deepcopy(BASE)
    result = stamped(BASE)
    assert original == BASE
    assert result["metadata"]["annotations"] == {
        "n": "1",
        meta.APPLIED_HASH_ANNOTATION: applied_hash(BASE),
    }
    assert {k: v for k, v in result.items() if k != "metadata"} == {
        k: v for k, v in BASE.items() if k != "metadata"
    }
    assert stamped({"kind": "X"})["metadata"] == {
        "annotations": {meta.APPLIED_HASH_ANNOTATION: applied_hash({"kind": "X"})}
    }
    assert len(applied_hash(BASE)) == 16


def test_the_hash_is_the_same_in_every_process() -> None:
    # A restarted operator (another str hash seed) must find its children converged.
    script = (
        "from stateward.controllers.diff import stamped;"
        "from stateward.specs import postgres as postgres_specs;"
        "from stateward.specs.postgres import config;"
        "from tests.support import clusters;"
        "c = clusters.make_cluster(backupSchedule='0 3 * * *', resources={'limits': {'cpu': '1'}},"
        " postgresql={'parameters': {'a': '1', 'b': '2', 'c': '3'}});"
        "p = config.patroni_config(c);"
        "print([stamped(x)['metadata']['annotations']"
        " for x in postgres_specs.children(c, patroni_config=p)])"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=Path(__file__).parents[2],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1, outputs


def test_items_another_manager_added_to_a_keyed_list_are_not_drift() -> None:
    # A sidecar injector, a mutating webhook, a policy engine: server-side apply keeps their
    # containers, variables and volumes beside ours, and so does containment. Before, any
    # such item changed the list's length: an apply and an Event on every reconcile.
    for key, child in stamp_all(clusters.make_cluster()).items():
        if child["kind"] != "StatefulSet":
            continue
        observed = stored(child)
        pod = observed["spec"]["template"]["spec"]
        pod["containers"].insert(0, {"name": "istio-proxy", "image": "proxy:1"})
        pod["containers"][1]["env"].append({"name": "INJECTED", "value": "1"})
        pod["containers"][1]["volumeMounts"].append({"name": "x", "mountPath": "/x"})
        pod["volumes"].append({"name": "x", "emptyDir": {}})
        assert drift(observed, child) == [], key
        # Ours still counts: a changed image of our container is named by its key.
        pod["containers"][1]["image"] = "elsewhere:1"
        assert drift(observed, child) == [".spec.template.spec.containers[name=postgres].image"], (
            key
        )


def test_a_missing_item_of_ours_in_a_keyed_list_is_drift() -> None:
    desired = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    assert (
        differences({"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]}, desired)
        == []
    )
    assert differences({"env": [{"name": "A", "value": "1"}]}, desired) == [".env[name=B]"]
    assert differences({"env": [{"name": "A", "value": "9"}, {"name": "B", "value": "2"}]},
                       desired) == [".env[name=A].value"]  # fmt: skip


def test_volume_mounts_are_keyed_by_their_path_and_ports_by_their_number() -> None:
    desired = {
        "volumeMounts": [{"name": "tls", "mountPath": "/a"}, {"name": "tls", "mountPath": "/b"}]
    }
    assert differences({"volumeMounts": list(reversed(desired["volumeMounts"]))}, desired) == []
    ports = {"ports": [{"name": "pg", "containerPort": 5432}]}
    assert differences({"ports": [{"name": "pg", "containerPort": 5433}]}, ports) == [
        ".ports[containerPort=5432]"
    ]


def test_lists_without_merge_keys_stay_atomic() -> None:
    rules = {"rules": [{"verbs": ["get"]}, {"verbs": ["list"]}]}
    assert differences({"rules": [{"verbs": ["get"]}]}, rules) == [".rules"]
    assert differences({"rules": [*rules["rules"], {"verbs": ["watch"]}]}, rules) == [".rules"]
