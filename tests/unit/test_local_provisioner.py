"""Pure parts of the local-volume provisioner: the class, the PV, the decisions, quantities."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from lightkube import Client, ConfigError, KubeConfig

from stateward_local.services import provisioner as prov
from stateward_local.services.provisioner import Delete, Expand, Provision, Skip, plan

pytestmark = pytest.mark.unit

ROOT = Path("/srv/volumes")
UID = "0b8c-uid"
PV = f"pvc-{UID}"


def claim(
    *,
    phase: str = "Pending",
    node: str | None = "stateward-node-1",
    size: str = "1Gi",
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    notes = dict(annotations or {})
    if node is not None:
        notes[prov.ANN_SELECTED_NODE] = node
    return {
        "metadata": {
            "name": "data",
            "namespace": "db",
            "uid": UID,
            "resourceVersion": "42",
            "annotations": notes,
        },
        "spec": {
            "storageClassName": "stateward-local",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
            **spec,
        },
        "status": {"phase": phase, **(status or {})},
    }


def bound(size: str = "1Gi", *, capacity: str = "1Gi", **status: Any) -> dict[str, Any]:
    return claim(
        phase="Bound",
        size=size,
        volumeName=PV,
        status={"capacity": {"storage": capacity}, **status},
    )


def volume(
    *,
    phase: str = "Bound",
    capacity: str = "1Gi",
    path: str | None = None,
    policy: str = "Delete",
    ours: bool = True,
    name: str = PV,
) -> dict[str, Any]:
    pv = prov.desired_pv(claim(), "stateward-node-1", ROOT)
    pv["metadata"]["name"] = name
    if not ours:
        pv["metadata"]["annotations"] = {prov.ANN_PROVISIONED_BY: "someone.else/x"}
    pv["spec"]["capacity"]["storage"] = capacity
    pv["spec"]["persistentVolumeReclaimPolicy"] = policy
    pv["spec"]["local"]["path"] = path or str(ROOT / "stateward-node-1" / name)
    pv["status"] = {"phase": phase}
    return pv


# --- the storage class ----------------------------------------------------------------------


def test_storage_class_waits_for_the_first_consumer_and_expands() -> None:
    sc = prov.storage_class(default=False)
    assert sc["metadata"] == {"name": "stateward-local"}
    assert sc["provisioner"] == "stateward.io/local"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    assert sc["reclaimPolicy"] == "Delete"
    assert sc["allowVolumeExpansion"] is True


def test_default_storage_class_is_annotated() -> None:
    sc = prov.storage_class(default=True)
    assert sc["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}


# --- quantities -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", Decimal(1024**3)),
        ("500M", Decimal(500 * 10**6)),
        ("1.5Gi", Decimal(3 * 1024**3 // 2)),
        ("1e3", Decimal(1000)),
        ("100m", Decimal("0.1")),
        ("2048", Decimal(2048)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert prov.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1GiB", "abc", None, 5])
def test_parse_quantity_rejects_what_is_not_a_quantity(text: object) -> None:
    assert prov.parse_quantity(text) is None


def test_quantity_comparison_across_units() -> None:
    assert prov.quantity_greater("2Gi", "2G")  # 2Gi = 2147483648 > 2000000000
    assert not prov.quantity_greater("1024Mi", "1Gi")
    assert prov.quantity_greater("1Gi", None)  # absent counts as zero
    assert not prov.quantity_greater("junk", "1Gi")


# --- the desired PV -------------------------------------------------------------------------


def test_desired_pv_is_a_local_volume_on_the_selected_node() -> None:
    pv = prov.desired_pv(claim(size="5Gi", accessModes=["ReadWriteOncePod"]), "n1", ROOT)
    assert pv["metadata"] == {
        "name": PV,
        "annotations": {"pv.kubernetes.io/provisioned-by": "stateward.io/local"},
    }
    spec = pv["spec"]
    assert spec["local"] == {"path": f"/srv/volumes/n1/{PV}"}
    assert spec["capacity"] == {"storage": "5Gi"}
    assert spec["accessModes"] == ["ReadWriteOncePod"]
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["storageClassName"] == "stateward-local"
    assert spec["volumeMode"] == "Filesystem"
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "db",
        "name": "data",
        "uid": UID,
    }
    assert spec["nodeAffinity"]["required"]["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}
            ]
        }
    ]


# --- provisioning decisions -----------------------------------------------------------------


def test_a_pending_claim_on_a_selected_node_is_provisioned() -> None:
    [action] = plan([claim()], {}, ROOT)
    assert isinstance(action, Provision)
    assert action.claim == "db/data"
    assert action.node == "stateward-node-1"
    assert action.path == ROOT / "stateward-node-1" / PV
    assert action.pv == prov.desired_pv(claim(), "stateward-node-1", ROOT)


def test_nothing_is_provisioned_before_the_scheduler_picks_a_node() -> None:
    assert plan([claim(node=None)], {}, ROOT) == []
    assert plan([claim(node="")], {}, ROOT) == []


@pytest.mark.parametrize(
    "annotation", [prov.ANN_STORAGE_PROVISIONER, prov.ANN_BETA_STORAGE_PROVISIONER]
)
def test_claims_annotated_for_us_are_ours_whatever_their_class(annotation: str) -> None:
    pvc = claim(annotations={annotation: "stateward.io/local"}, storageClassName="other")
    assert [type(a) for a in plan([pvc], {}, ROOT)] == [Provision]


def test_claims_annotated_for_another_provisioner_are_left_alone() -> None:
    pvc = claim(annotations={prov.ANN_STORAGE_PROVISIONER: "kwok.x-k8s.io/volume"})
    assert plan([pvc], {}, ROOT) == []


def test_claims_of_another_class_are_left_alone() -> None:
    assert plan([claim(storageClassName="kwok-volume")], {}, ROOT) == []
    assert [type(a) for a in plan([claim()], {}, ROOT, class_name="custom")] == []
    pvc = claim(storageClassName="custom")
    assert [type(a) for a in plan([pvc], {}, ROOT, class_name="custom")] == [Provision]


def test_provisioning_is_idempotent_once_the_volume_exists() -> None:
    assert plan([claim()], {PV: volume(phase="Available")}, ROOT) == []


def test_bound_deleting_or_named_claims_are_not_provisioned() -> None:
    deleting = claim()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert plan([deleting], {}, ROOT) == []
    assert plan([claim(volumeName="pv-static")], {}, ROOT) == []
    assert plan([claim(phase="Lost")], {}, ROOT) == []


@pytest.mark.parametrize(
    ("spec", "node", "reason"),
    [
        ({"volumeMode": "Block"}, "n1", "Block"),
        ({"selector": {"matchLabels": {"a": "b"}}}, "n1", "selector"),
        ({"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}}, "n1", "data source"),
        ({}, "../../etc", "not a valid node name"),
        ({"resources": {"requests": {}}}, "n1", "no valid storage size"),
    ],
)
def test_claims_that_cannot_be_served_are_skipped_with_a_reason(
    spec: dict[str, Any], node: str, reason: str
) -> None:
    [action] = plan([claim(node=node, **spec)], {}, ROOT)
    assert isinstance(action, Skip)
    assert action.key == "db/data"
    assert reason in action.reason


# --- deletion decisions ---------------------------------------------------------------------


def test_a_released_volume_of_ours_is_deleted_with_its_directory() -> None:
    assert plan([], {PV: volume(phase="Released")}, ROOT) == [
        Delete(PV, ROOT / "stateward-node-1" / PV)
    ]


@pytest.mark.parametrize(
    "pv",
    [
        volume(phase="Bound"),
        volume(phase="Available"),
        volume(phase="Released", policy="Retain"),
        volume(phase="Released", ours=False),
    ],
)
def test_other_volumes_are_not_deleted(pv: dict[str, Any]) -> None:
    assert plan([], {PV: pv}, ROOT) == []


@pytest.mark.parametrize(
    "path",
    [
        "/etc",
        "/srv/volumes",
        "/srv/volumes/stateward-node-1",
        f"/srv/volumes/../volumes/stateward-node-1/{PV}",
        f"/srv/volumes/stateward-node-1/../{PV}",
        f"/srv/volumes-other/stateward-node-1/{PV}",
        f"/srv/volumes/stateward-node-1/{PV}/deeper",
        "/srv/volumes/stateward-node-1/pvc-someone-else",
        f"srv/volumes/stateward-node-1/{PV}",
    ],
)
def test_a_path_outside_the_root_is_never_removed(path: str) -> None:
    [action] = plan([], {PV: volume(phase="Released", path=path)}, ROOT)
    assert isinstance(action, Skip)
    assert action.key == f"pv/{PV}"


def test_a_volume_without_a_local_path_is_not_removed() -> None:
    pv = volume(phase="Released")
    del pv["spec"]["local"]
    assert isinstance(plan([], {PV: pv}, ROOT)[0], Skip)


# --- expansion decisions --------------------------------------------------------------------


def test_a_bound_claim_asking_for_more_grows_the_volume_then_its_status() -> None:
    pvc = bound("3Gi")
    [action] = plan([pvc], {PV: volume()}, ROOT)
    assert action == Expand("db/data", PV, "3Gi", True, {})
    assert isinstance(action, Expand)
    assert action.status_patch == {
        "metadata": {"resourceVersion": "42"},
        "status": {"capacity": {"storage": "3Gi"}, "allocatedResources": {"storage": "3Gi"}},
    }


def test_an_expansion_interrupted_after_the_volume_grew_finishes_the_status() -> None:
    [action] = plan([bound("3Gi")], {PV: volume(capacity="3Gi")}, ROOT)
    assert action == Expand("db/data", PV, "3Gi", False, {})


def test_a_finished_expansion_needs_nothing() -> None:
    assert plan([bound("3Gi", capacity="3Gi")], {PV: volume(capacity="3Gi")}, ROOT) == []
    # Units differ, sizes do not.
    assert plan([bound("1024Mi", capacity="1Gi")], {PV: volume(capacity="1Gi")}, ROOT) == []


def test_a_request_lowered_to_recover_from_a_failure_shrinks_nothing() -> None:
    assert plan([bound("2Gi", capacity="3Gi")], {PV: volume(capacity="3Gi")}, ROOT) == []


def test_only_our_volume_bound_to_this_very_claim_is_expanded() -> None:
    assert plan([bound("3Gi")], {PV: volume(ours=False)}, ROOT) == []
    stale = volume()
    stale["spec"]["claimRef"]["uid"] = "another-uid"
    assert plan([bound("3Gi")], {PV: stale}, ROOT) == []
    assert plan([bound("3Gi")], {}, ROOT) == []


def test_finishing_an_expansion_clears_its_progress_and_conditions() -> None:
    pvc = bound(
        "3Gi",
        allocatedResourceStatuses={"storage": "ControllerResizeInProgress"},
        allocatedResources={"storage": "3Gi"},
        conditions=[
            {"type": "Resizing", "status": "True"},
            {"type": "FileSystemResizePending", "status": "True"},
            {"type": "ModifyingVolume", "status": "True"},
        ],
    )
    patch = prov.expansion_status_patch(pvc, "3Gi")
    assert patch["status"] == {
        "capacity": {"storage": "3Gi"},
        "allocatedResources": {"storage": "3Gi"},
        "allocatedResourceStatuses": None,
        "conditions": [{"type": "ModifyingVolume", "status": "True"}],
    }


def test_finishing_an_expansion_keeps_other_resource_statuses() -> None:
    pvc = bound(
        "3Gi",
        allocatedResourceStatuses={"storage": "NodeResizePending", "example.com/x": "y"},
        conditions=[{"type": "Resizing", "status": "True"}],
    )
    status = prov.expansion_status_patch(pvc, "3Gi")["status"]
    assert status["allocatedResourceStatuses"] == {"storage": None}
    assert status["conditions"] is None


# --- the kubeconfig -------------------------------------------------------------------------


def test_a_kubeconfig_without_its_current_context_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({"current-context": "missing", "contexts": [], "clusters": []}))
    with pytest.raises(ConfigError, match="missing"):
        prov.connect(path)


def test_main_reports_an_unusable_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text(yaml.safe_dump({"current-context": "x"}))
    code = prov.main(["--kubeconfig", str(bad), "--root", str(tmp_path / "root")])
    assert code == 2
    assert "cannot use kubeconfig" in capsys.readouterr().err
    assert (tmp_path / "root").is_dir()


# --- carrying actions out (against a fake API server) ---------------------------------------


class FakeApi:
    """Records requests; answers like the API server would for the ones the provisioner makes."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        body: dict[str, Any] = json.loads(request.content) if request.content else {}
        self.requests.append((request.method, request.url.path, body or None))
        if request.method == "DELETE":
            return httpx2.Response(200, json={"kind": "Status", "apiVersion": "v1"})
        if request.method == "POST":
            return httpx2.Response(201, json=body)
        # PATCH: the patched object, as far as the test cares (its identity).
        parts = request.url.path.strip("/").split("/")
        name = parts[-2] if parts[-1] == "status" else parts[-1]
        meta = {"name": name, **(body.get("metadata") or {})}
        if "namespaces" in parts:
            meta["namespace"] = parts[parts.index("namespaces") + 1]
        return httpx2.Response(200, json={**body, "metadata": meta})

    def client(self) -> Client:
        config = KubeConfig.from_dict(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://api"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
        return Client(config, transport=httpx2.MockTransport(self.handle))


def make_provisioner(root: Path, api: FakeApi) -> prov.Provisioner:
    return prov.Provisioner(api.client, root, prov.STORAGE_CLASS)


def test_provision_makes_a_world_writable_directory_then_the_volume(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    api = FakeApi()
    runner = make_provisioner(root, api)
    [action] = plan([claim()], {}, root)
    runner.execute(action)
    runner.execute(action)  # again, as after a stale cache: still fine
    directory = root / "stateward-node-1" / PV
    assert directory.is_dir()
    assert directory.stat().st_mode & 0o777 == 0o777
    assert [(m, p) for m, p, _ in api.requests] == [("POST", "/api/v1/persistentvolumes")] * 2
    assert api.requests[0][2]["spec"]["local"]["path"] == str(directory)
    assert PV in runner.volumes.snapshot()


def test_delete_removes_the_directory_then_the_volume(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    directory = root / "stateward-node-1" / PV
    (directory / "pgdata").mkdir(parents=True)
    (directory / "pgdata" / "file").write_text("x")
    pv = volume(phase="Released", path=str(directory))
    [action] = plan([], {PV: pv}, root)
    api = FakeApi()
    runner = make_provisioner(root, api)
    runner.execute(action)
    assert not directory.exists()
    assert (root / "stateward-node-1").is_dir()
    assert [(m, p) for m, p, _ in api.requests] == [("DELETE", f"/api/v1/persistentvolumes/{PV}")]


def test_a_volume_already_being_deleted_only_loses_its_directory(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    directory = root / "stateward-node-1" / PV
    directory.mkdir(parents=True)
    pv = volume(phase="Released", path=str(directory))
    pv["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    [action] = plan([], {PV: pv}, root)
    assert action == Delete(PV, directory, deleting=True)
    api = FakeApi()
    runner = make_provisioner(root, api)
    runner.execute(action)
    runner.execute(action)
    assert not directory.exists()
    assert api.requests == []


def test_delete_never_follows_a_symlink_out_of_the_root(tmp_path: Path) -> None:
    root, outside = (tmp_path / "root").resolve(), (tmp_path / "precious").resolve()
    (outside / PV).mkdir(parents=True)
    (outside / PV / "keep").write_text("x")
    root.mkdir()
    (root / "stateward-node-1").symlink_to(outside)
    pv = volume(phase="Released", path=str(root / "stateward-node-1" / PV))
    [action] = plan([], {PV: pv}, root)
    api = FakeApi()
    runner = make_provisioner(root, api)
    with pytest.raises(OSError, match="refusing"):
        runner.execute(action)
    assert (outside / PV / "keep").exists()
    assert api.requests == []


def test_expand_grows_the_volume_then_finishes_the_claim_status(tmp_path: Path) -> None:
    api = FakeApi()
    runner = make_provisioner(tmp_path, api)
    [action] = plan([bound("3Gi")], {PV: volume()}, tmp_path)
    runner.execute(action)
    assert api.requests == [
        ("PATCH", f"/api/v1/persistentvolumes/{PV}", {"spec": {"capacity": {"storage": "3Gi"}}}),
        (
            "PATCH",
            "/api/v1/namespaces/db/persistentvolumeclaims/data/status",
            {
                "metadata": {"resourceVersion": "42"},
                "status": {
                    "capacity": {"storage": "3Gi"},
                    "allocatedResources": {"storage": "3Gi"},
                },
            },
        ),
    ]
