"""The observation store: newest body wins, children are found by their cluster label."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.controllers.store import ObjectStore

pytestmark = pytest.mark.unit


def body(
    kind: str, name: str, rv: str, *, cluster: str | None = "pg", uid: str = "u1"
) -> dict[str, Any]:
    labels = {"stateward.io/cluster": cluster} if cluster else {}
    return {
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": rv,
            "uid": uid,
            "labels": labels,
        },
    }


def test_children_are_indexed_by_cluster_and_kind() -> None:
    store = ObjectStore()
    store.observe(body("Service", "pg-primary", "1"))
    store.observe(body("Service", "pg-replicas", "2"))
    store.observe(body("Service", "other", "3", cluster="other"))
    store.observe(body("StatefulSet", "pg", "4"))
    assert [b["metadata"]["name"] for b in store.owned_by("ns", "pg", "Service")] == [
        "pg-primary",
        "pg-replicas",
    ]
    assert store.owned_by("ns", "pg", "Pod") == []
    assert store.owned_by("other-ns", "pg", "Service") == []


def test_an_older_version_never_replaces_a_newer_one() -> None:
    store = ObjectStore()
    store.observe(body("Service", "pg-primary", "10"))
    store.observe(body("Service", "pg-primary", "9"))
    assert store.get("Service", "ns", "pg-primary")["metadata"]["resourceVersion"] == "10"  # type: ignore[index]


@pytest.mark.parametrize(
    ("first", "second", "kept"),
    [
        ("10", "9", "10"),  # longer is newer: not a string comparison
        ("9", "10", "10"),
        ("123", "124", "124"),
        ("99999999999999999999", "100000000000000000000", "100000000000000000000"),
        ("abc", "7", "7"),  # not comparable (KEP-5504): the later arrival wins
        ("7", "abc", "abc"),
        ("007", "8", "8"),  # a leading zero is not a well-formed version
        ("8", "007", "007"),
        ("\u0661\u0662", "5", "5"),  # non-ASCII digits are not digits here
    ],
)
def test_resource_versions_compare_by_the_kubernetes_rules(
    first: str, second: str, kept: str
) -> None:
    store = ObjectStore()
    store.observe(body("Service", "pg-primary", first))
    store.observe(body("Service", "pg-primary", second))
    assert store.get("Service", "ns", "pg-primary")["metadata"]["resourceVersion"] == kept  # type: ignore[index]


def test_a_recreated_object_replaces_the_old_one_whatever_its_version() -> None:
    store = ObjectStore()
    store.observe(body("Service", "pg-primary", "10", uid="old"))
    store.observe(body("Service", "pg-primary", "3", uid="new"))
    assert store.get("Service", "ns", "pg-primary")["metadata"]["uid"] == "new"  # type: ignore[index]


def test_relabelling_moves_an_object_between_clusters_and_forget_removes_it() -> None:
    store = ObjectStore()
    store.observe(body("Pod", "p", "1", cluster="a"))
    store.observe(body("Pod", "p", "2", cluster="b"))
    assert store.owned_by("ns", "a", "Pod") == []
    assert len(store.owned_by("ns", "b", "Pod")) == 1
    store.forget("Pod", "ns", "p")
    assert store.owned_by("ns", "b", "Pod") == []
    assert store.get("Pod", "ns", "p") is None
    assert len(store) == 0


def test_stored_bodies_are_copies() -> None:
    store = ObjectStore()
    original = body("Service", "s", "1")
    store.observe(original)
    original["metadata"]["name"] = "changed"
    assert store.get("Service", "ns", "s") is not None
    assert store.names("Service") == [("ns", "s")]


def test_managed_fields_are_not_kept() -> None:
    store = ObjectStore()
    observed = body("Service", "s", "1")
    observed["metadata"]["managedFields"] = [{"manager": "stateward", "fieldsV1": {"f:spec": {}}}]
    store.observe(observed)
    assert "managedFields" not in store.get("Service", "ns", "s")["metadata"]  # type: ignore[index]
    assert "managedFields" in observed["metadata"], "the caller's body is untouched"


def test_pods_keep_metadata_node_phase_ip_conditions_and_container_states() -> None:
    store = ObjectStore()
    pod = body("Pod", "pg-0", "1")
    pod["spec"] = {"nodeName": "node-1", "containers": [{"name": "postgres", "image": "x"}]}
    died = {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-12-02T10:00:05Z"}
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.244.1.7",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "postgres",
                "state": {"running": {"startedAt": "2026-12-02T10:00:06Z"}},
                "lastState": {"terminated": {**died, "containerID": "containerd://x"}},
                "restartCount": 1,
                "imageID": "sha256:x",
            },
            {"name": "sidecar", "state": {"waiting": {"reason": "ImagePullBackOff"}}},
            {"name": "job", "state": {"terminated": {**died, "startedAt": "x", "message": "m"}}},
        ],
    }
    store.observe(pod)
    kept = store.get("Pod", "ns", "pg-0")
    assert kept is not None
    assert kept["spec"] == {"nodeName": "node-1"}  # no containers, images, volumes
    assert kept["status"] == {
        "phase": "Running",
        "podIP": "10.244.1.7",  # where the operator reaches Patroni's REST API
        "conditions": [{"type": "Ready", "status": "True"}],
        # whether each container runs, why it waits, how it last ended: nothing more
        "containerStatuses": [
            {
                "name": "postgres",
                "restartCount": 1,
                "state": {"running": {}},
                "lastState": {"terminated": died},
            },
            {
                "name": "sidecar",
                "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff"}},
            },
            # a backup pod's report: its termination message
            {"name": "job", "restartCount": 0, "state": {"terminated": {**died, "message": "m"}}},
        ],
    }
    assert kept["metadata"]["labels"] == {"stateward.io/cluster": "pg"}


def test_secret_values_are_never_kept() -> None:
    store = ObjectStore()
    secret = body("Secret", "pg-superuser", "1")
    secret["data"] = {"password": "c2VjcmV0"}
    store.observe(secret)
    kept = store.get("Secret", "ns", "pg-superuser")
    assert kept is not None
    assert "data" not in kept
    assert "c2VjcmV0" not in str(kept)


def test_a_late_event_never_brings_back_a_deleted_object() -> None:
    clock = [0.0]
    store = ObjectStore(clock=lambda: clock[0])
    pod = {"kind": "Pod", "metadata": {"name": "pg-0", "namespace": "db", "uid": "u1",
                                       "resourceVersion": "10"}}  # fmt: skip
    store.observe(pod)
    store.deleted({**pod, "metadata": {**pod["metadata"], "resourceVersion": "12"}})
    assert store.get("Pod", "db", "pg-0") is None
    # A MODIFIED event from before the deletion, replayed by a restarted watch.
    store.observe({**pod, "metadata": {**pod["metadata"], "resourceVersion": "11"}})
    assert store.get("Pod", "db", "pg-0") is None
    # The StatefulSet makes the pod again: a new object, another uid.
    store.observe({**pod, "metadata": {**pod["metadata"], "uid": "u2", "resourceVersion": "13"}})
    assert store.get("Pod", "db", "pg-0")["metadata"]["uid"] == "u2"  # type: ignore[index]


def test_a_late_deletion_of_an_older_object_keeps_its_successor() -> None:
    store = ObjectStore()
    old = {"kind": "Pod", "metadata": {"name": "pg-0", "namespace": "db", "uid": "u1"}}
    new = {"kind": "Pod", "metadata": {"name": "pg-0", "namespace": "db", "uid": "u2"}}
    store.observe(new)
    store.deleted(old)
    assert store.get("Pod", "db", "pg-0")["metadata"]["uid"] == "u2"  # type: ignore[index]


def test_an_object_this_operator_deleted_is_seen_again_while_it_terminates() -> None:
    # forget() is what a reconcile calls after its own delete: the pod still terminates,
    # and its updates (deletionTimestamp, container states) must reach later reconciles.
    store = ObjectStore()
    pod = {"kind": "Pod", "metadata": {"name": "pg-0", "namespace": "db", "uid": "u1"}}
    store.observe(pod)
    store.forget("Pod", "db", "pg-0")
    store.observe({**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "t"}})
    assert store.get("Pod", "db", "pg-0") is not None


def test_tombstones_are_dropped_after_a_while() -> None:
    clock = [0.0]
    store = ObjectStore(clock=lambda: clock[0])
    for n in range(3):
        store.deleted({"kind": "Pod", "metadata": {"name": f"p{n}", "namespace": "db",
                                                   "uid": f"u{n}"}})  # fmt: skip
        clock[0] += 400
    assert list(store._tombstones) == ["u1", "u2"]


def test_every_read_is_a_copy_of_its_own() -> None:
    """Bodies are kept packed and decoded per read: a caller that changes what it read (or
    what it handed in) changes nothing stored, and nothing another reader sees."""
    store = ObjectStore()
    original = {**body("StatefulSet", "pg", "4"), "spec": {"replicas": 3}}
    store.observe(original)
    original["spec"]["replicas"] = 9
    assert store.has("StatefulSet", "ns", "pg") and not store.has("StatefulSet", "ns", "other")
    first = store.get("StatefulSet", "ns", "pg")
    assert first is not None and first["spec"] == {"replicas": 3}
    first["spec"]["replicas"] = 1
    (owned,) = store.owned_by("ns", "pg", "StatefulSet")
    assert owned["spec"] == {"replicas": 3} and owned is not first
    # A label change moves the object between clusters' indexes.
    moved = body("StatefulSet", "pg", "5", cluster="other")
    store.observe(moved)
    assert store.owned_by("ns", "pg", "StatefulSet") == []
    assert [
        b["metadata"]["resourceVersion"] for b in store.owned_by("ns", "other", "StatefulSet")
    ] == ["5"]


def test_the_echo_of_a_stored_version_is_recognised_without_decoding() -> None:
    store = ObjectStore()
    written = body("Service", "pg-primary", "10")
    store.observe(written)  # a write's response
    assert store.holds(body("Service", "pg-primary", "10"))  # its watch event
    assert not store.holds(body("Service", "pg-primary", "11"))  # a newer change
    assert not store.holds(body("Service", "pg-primary", "10", uid="u2"))  # recreated
    assert not store.holds(body("Service", "pg-replicas", "10"))  # another object
    unversioned = body("Service", "pg-x", "1")
    del unversioned["metadata"]["resourceVersion"]
    store.observe(unversioned)
    assert not store.holds(unversioned)  # no version: never taken for the same


def test_observing_the_same_version_again_keeps_what_is_stored() -> None:
    store = ObjectStore()
    store.observe(body("Service", "pg-primary", "10"))
    again = body("Service", "pg-primary", "10", cluster="other")  # cannot happen: same version
    store.observe(again)
    assert [b["metadata"]["name"] for b in store.owned_by("ns", "pg", "Service")] == ["pg-primary"]


def test_a_version_found_to_contain_a_desired_body_is_remembered_until_either_changes() -> None:
    store = ObjectStore()
    seen = body("Service", "pg-primary", "10")
    store.observe(seen)
    assert not store.contained("Service", "ns", "pg-primary", "d1")
    store.remember_contained(seen, "d1")
    assert store.contained("Service", "ns", "pg-primary", "d1")
    assert not store.contained("Service", "ns", "pg-primary", "d2")  # another desired body
    store.observe(body("Service", "pg-primary", "11"))  # changed by someone: compare again
    assert not store.contained("Service", "ns", "pg-primary", "d1")
    store.remember_contained(body("Service", "pg-primary", "10"), "d1")  # an older version
    assert not store.contained("Service", "ns", "pg-primary", "d1")
    store.remember_contained(body("Service", "pg-primary", "11"), "d1")
    store.forget("Service", "ns", "pg-primary")
    assert not store.contained("Service", "ns", "pg-primary", "d1")
    store.observe(body("Service", "pg-primary", "11", uid="u2"))  # recreated, same version
    assert not store.contained("Service", "ns", "pg-primary", "d1")
