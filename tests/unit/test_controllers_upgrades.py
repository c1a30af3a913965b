"""The major upgrade's checklist (``controllers.postgres.upgrades``) step by step over observed
state: what each step asks of the StatefulSet (version, instances), what it creates and deletes,
and how it ends — refused with the old data running again, failed and left stopped, or
succeeded with ``status.version`` moved. Pods come from the fake Patroni's pod bodies."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api import v1alpha1
from stateward.controllers.kube import Ref
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.postgres import scope as pgscope
from stateward.controllers.postgres import upgrades
from stateward.controllers.store import ObjectStore
from stateward.instance import patroni
from stateward.specs import meta
from tests.support.clusters import make_cluster
from tests.support.fake_patroni import NAME, NAMESPACE, FakePatroni, Member

pytestmark = pytest.mark.unit

LABELS = {meta.CLUSTER_LABEL: NAME, meta.MANAGED_BY_LABEL: meta.MANAGER}


class Kube:
    """What the upgrade asks of the API: creates, deletes, lists of Patroni's ConfigMaps."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.config_maps = [
            {"metadata": {"name": f"{NAME}-{suffix}", "namespace": NAMESPACE}, "kind": "ConfigMap",
             "apiVersion": "v1"}
            for suffix in ("leader", "config", "sync", "patroni")
        ]  # fmt: skip

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append(body)
        return {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}}

    async def delete(self, ref: Ref, **_: Any) -> None:
        self.deleted.append((ref.kind, ref.name))

    async def list_objects(self, *_: Any) -> list[dict[str, Any]]:
        return self.config_maps

    async def event(self, _body: Any, *, reason: str, message: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def three(ready: bool = True) -> list[Member]:
    return [
        Member("demo-0", role=meta.PRIMARY_ROLE, replication_state=None, ready=ready),
        Member("demo-1", ready=ready),
        Member("demo-2", ready=ready),
    ]


def job(state: str | None, message: str = "") -> list[dict[str, Any]]:
    """The upgrade Job in ``state`` (None: running) and its pod's termination message."""
    conditions = [{"type": state, "status": "True"}] if state else []
    return [
        {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": f"{NAME}-upgrade", "namespace": NAMESPACE, "labels": LABELS},
         "status": {"conditions": conditions}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": f"{NAME}-upgrade-x", "namespace": NAMESPACE,
                      "labels": {**LABELS, pgscope.JOB_NAME_LABEL: f"{NAME}-upgrade"}},
         "status": {"containerStatuses": [{"state": {"terminated": {"message": message}}}]}},
    ]  # fmt: skip


def claims(*ordinals: int) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": f"pgdata-{NAME}-{i}", "namespace": NAMESPACE, "labels": LABELS}}
        for i in ordinals
    ]  # fmt: skip


def scope(
    *,
    version: str = "17",
    members: list[Member] | None = None,
    record: dict[str, Any] | None = None,
    status_version: str | None = "15",
    objects: list[dict[str, Any]] | None = None,
    image_pins: dict[str, str] | None = None,
    **spec: Any,
) -> postgrescluster.Scope:
    fake = FakePatroni(*(three() if members is None else members))
    store = ObjectStore()
    for member in fake.members.values():
        store.observe(fake.pod(member))
    for body in objects or []:
        store.observe(body)
    cluster = make_cluster(replicas=3, version=version, **spec)
    return postgrescluster.Scope(
        cluster=cluster,
        body=fake.body(),
        kube=Kube(),  # type: ignore[arg-type]
        store=store,
        now="2026-12-05T03:00:00Z",
        conditions=[],
        upgrade=record,
        version=status_version,
        image_pins=image_pins or {},
    )


def running(phase: str) -> dict[str, Any]:
    return {"phase": phase, "from": "15", "to": "17", "startedAt": "2026-12-05T02:59:00Z",
            "message": ""}  # fmt: skip


def kube(s: postgrescluster.Scope) -> Kube:
    assert isinstance(s.kube, Kube)
    return s.kube


# --- what may be upgraded -------------------------------------------------------------------


def test_the_data_version_follows_the_upgrade_and_then_the_status() -> None:
    assert upgrades.data_version(scope(record=None)) == "15"
    assert upgrades.data_version(scope(record=running("Upgrading"))) == "15"
    for phase in ("Starting", "Cloning"):
        assert upgrades.data_version(scope(record=running(phase))) == "17"
    assert upgrades.data_version(scope(status_version=None, version="16.2")) == "16.2"
    assert upgrades.status_version(scope(version="15.4", record=None)) == "15.4"  # a minor
    assert upgrades.status_version(scope(record=running("Stopping"))) == "15"
    assert upgrades.status_version(scope(record={**running("Refused")})) == "15"


def test_a_cluster_an_older_operator_made_is_read_from_its_statefulsets_image() -> None:
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {"template": {"spec": {"containers": [
            {"image": f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:15"}]}}},
    }  # fmt: skip
    s = scope(status_version=None, objects=[statefulset])
    assert upgrades.data_version(s) == "15"
    # Pinned by digest (--pin-image), the tag beside the digest still says the version.
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    container["image"] += "@sha256:" + "ab" * 32
    assert upgrades.data_version(scope(status_version=None, objects=[statefulset])) == "15"


@pytest.mark.parametrize(
    ("running_version", "spec", "problem"),
    [
        ("15", {"version": "17"}, None),
        (
            "16",
            {"version": "17"},
            "PostgreSQL 16 cannot be upgraded to 17 in place: the 17 image upgrades from 15",
        ),
        ("16", {"version": "17", "image": "registry/pg:17-with-16"}, None),
        ("17", {"version": "15"}, "a downgrade is not possible in place"),
    ],
    ids=["15 to 17", "16 to 17", "own image", "downgrade"],
)
def test_only_what_the_image_can_do_is_attempted(
    running_version: str, spec: dict[str, Any], problem: str | None
) -> None:
    found = upgrades.refusal(make_cluster(**spec), running_version)
    assert (found is None) if problem is None else (problem in (found or "")), found


async def test_a_version_the_image_cannot_reach_is_refused_and_changes_nothing() -> None:
    s = scope(status_version="16")
    assert await upgrades.run_upgrade(s) is None
    assert s.upgrade is None and s.children_version == "16" and s.children_replicas is None
    assert s.degraded[0][0] == upgrades.REFUSED and kube(s).created == []


# --- the steps -------------------------------------------------------------------------------


async def test_it_waits_for_every_instance_before_it_starts() -> None:
    s = scope(members=three(ready=False))
    assert await upgrades.run_upgrade(s) == "the upgrade waits for a healthy cluster"
    assert s.upgrade is None and s.children_version == "15"


async def test_it_starts_by_scaling_to_the_first_instance_on_the_old_version() -> None:
    s = scope()
    assert await upgrades.run_upgrade(s) == "upgrade: stopping the replicas"
    assert s.upgrade is not None and s.upgrade["phase"] == "Stopping"
    assert (s.upgrade["from"], s.upgrade["to"]) == ("15", "17")
    assert (s.children_version, s.children_replicas) == ("15", 1)
    assert not s.hold_data_plane  # the scale-down's switchover moves the primary to demo-0
    assert [reason for reason, _ in kube(s).events] == ["UpgradeStarted"]


async def test_the_primary_stops_last_with_the_data_plane_held() -> None:
    s = scope(members=three()[:1], record=running("Stopping"))
    assert await upgrades.run_upgrade(s) == "upgrade: stopping the primary"
    assert (s.children_version, s.children_replicas) == ("15", 0) and s.hold_data_plane


async def test_with_every_instance_gone_the_job_runs_pg_upgrade_on_the_first_volume() -> None:
    s = scope(members=[], record=running("Stopping"))
    assert await upgrades.run_upgrade(s) == "upgrade: started pg_upgrade"
    assert s.upgrade is not None and s.upgrade["phase"] == "Upgrading"
    (body,) = kube(s).created
    container = body["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:17"
    # With the images pinned (--pin-image), the Job runs 17 by its digest.
    digest = "sha256:" + "cd" * 32
    pinned = scope(
        members=[],
        record=running("Stopping"),
        image_pins={f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:17": digest},
    )
    await upgrades.run_upgrade(pinned)
    (body,) = kube(pinned).created
    image = body["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:17@{digest}"
    assert container["command"] == [
        "stateward-instance", "upgrade", "--from=15", "--to=17", f"--data-dir={patroni.DATA_DIR}",
    ]  # fmt: skip
    volume = body["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == f"pgdata-{NAME}-0"
    assert (s.children_version, s.children_replicas) == ("15", 0) and s.hold_data_plane


async def test_upgraded_data_forgets_the_old_cluster_then_starts_the_first_instance() -> None:
    objects = [*job("Complete", "upgraded the data directory from PostgreSQL 15 to 17"),
               *claims(0, 1, 2)]  # fmt: skip
    s = scope(members=[], record=running("Upgrading"), objects=objects)
    assert await upgrades.run_upgrade(s) == "upgrade: data upgraded"
    assert s.upgrade is not None and s.upgrade["phase"] == "Starting"
    assert "from PostgreSQL 15 to 17" in s.upgrade["message"]
    # Nothing starts before the status says Starting: at the next reconcile.
    assert (s.children_version, s.children_replicas) == ("15", 0)
    deleted = kube(s).deleted
    # Patroni's state of the old cluster (not our own NAME-patroni), the others' volumes
    assert ("ConfigMap", f"{NAME}-leader") in deleted and ("ConfigMap", f"{NAME}-config") in deleted
    assert ("ConfigMap", f"{NAME}-patroni") not in deleted
    claims_deleted = sorted(name for kind, name in deleted if kind == "PersistentVolumeClaim")
    assert claims_deleted == [f"pgdata-{NAME}-1", f"pgdata-{NAME}-2"]

    s = scope(members=[], record=s.upgrade)
    await upgrades.run_upgrade(s)
    assert (s.children_version, s.children_replicas) == ("17", 1)


async def test_a_refused_pg_upgrade_brings_the_old_version_back_and_says_why() -> None:
    outcome = "refused: pg_upgrade --check found a problem: aclitem in public.grants.acl"
    s = scope(members=[], record=running("Upgrading"), objects=job("Failed", outcome))
    assert await upgrades.run_upgrade(s) == "upgrade refused"
    assert s.upgrade is not None and s.upgrade["phase"] == "Refused" and s.upgrade["finishedAt"]
    assert (s.children_version, s.children_replicas) == ("15", None) and not s.hold_data_plane
    reason, message = s.degraded[0]
    assert reason == upgrades.REFUSED and "aclitem in public.grants.acl" in message
    assert 'set spec.version back to "15"' in message
    assert ("Job", f"{NAME}-upgrade") in kube(s).deleted
    assert upgrades.status_version(s) == "15"

    # Still refused while the spec asks for 17; answered once it is 15 again.
    again = scope(record=s.upgrade)
    await upgrades.run_upgrade(again)
    assert again.upgrade == s.upgrade and again.children_version == "15"
    back = scope(version="15", record=s.upgrade)
    await upgrades.run_upgrade(back)
    assert back.upgrade is None and back.children_version is None


async def test_a_failure_after_linking_leaves_the_cluster_stopped_for_a_human() -> None:
    outcome = "failed: pg_upgrade failed after linking: could not link file"
    s = scope(members=[], record=running("Upgrading"), objects=job("Failed", outcome))
    assert await upgrades.run_upgrade(s) == "upgrade failed"
    assert s.upgrade is not None and s.upgrade["phase"] == "Failed"
    assert s.children_replicas == 0 and s.degraded[0][0] == upgrades.FAILED


async def test_the_first_instance_leading_lets_the_others_clone_it() -> None:
    s = scope(members=three()[:1], record=running("Starting"))
    assert await upgrades.run_upgrade(s) == "upgrade: the first instance leads; cloning the others"
    assert s.upgrade is not None and s.upgrade["phase"] == "Cloning"
    assert (s.children_version, s.children_replicas) == ("17", None)


async def test_every_instance_ready_on_the_new_version_ends_it() -> None:
    s = scope(record=running("Cloning"))
    assert await upgrades.run_upgrade(s) == "upgraded to PostgreSQL 17"
    assert s.upgrade is not None and s.upgrade["phase"] == "Succeeded"
    assert s.version == "17" and upgrades.status_version(s) == "17"
    assert ("Upgraded", "Upgraded PostgreSQL 15 to 17") in kube(s).events
    done = scope(record=s.upgrade, status_version="17")
    assert await upgrades.run_upgrade(done) is None and done.children_version is None


async def test_going_back_before_anything_changed_cancels_it() -> None:
    s = scope(version="15", record=running("Stopping"))
    assert await upgrades.run_upgrade(s) == "upgrade cancelled"
    assert s.upgrade is None and s.children_replicas is None


async def test_the_gate_halts_the_data_plane_only_while_held() -> None:
    s = scope()
    await upgrades.gate(s)
    assert not s.halted
    s.hold_data_plane = True
    await upgrades.gate(s)
    assert s.halted


def test_the_children_are_built_for_the_upgrades_version_and_instances() -> None:
    s = scope()
    assert postgrescluster._children_cluster(s) is s.cluster
    s.children_version, s.children_replicas = "15", 0
    built = postgrescluster._children_cluster(s)
    assert (built.spec.version, built.spec.replicas) == ("15", 0)
    assert built.image == f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:15"
    assert s.cluster.spec.version == "17"  # the spec itself is untouched
