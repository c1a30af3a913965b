"""Images pinned by digest (``--pin-image``): what a pin must look like, which containers it
reaches in everything the operator makes, and that it leaves the rest alone."""

from __future__ import annotations

from typing import Any

import pytest

from stateward.api import v1alpha1
from stateward.cli.main import build_parser
from stateward.controllers import core
from stateward.controllers.postgres import reconcile as postgrescluster
from stateward.controllers.store import ObjectStore
from stateward.runtime import operator
from stateward.specs import pinning
from stateward.specs import postgres as postgres_specs
from stateward.specs.postgres import backup, config
from tests.support.clusters import REPOSITORY, make_cluster

pytestmark = pytest.mark.unit

DIGEST = "sha256:" + "0123456789abcdef" * 4
INSTANCE_15 = f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:15"
PINS = {INSTANCE_15: DIGEST}


def test_a_pin_is_a_tag_and_a_sha256_digest() -> None:
    assert pinning.parse_pin(f"{INSTANCE_15}@{DIGEST}") == (INSTANCE_15, DIGEST)
    assert pinning.parse_pin(f"localhost:5000/pg:15.4-1@{DIGEST}") == (
        "localhost:5000/pg:15.4-1",
        DIGEST,
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (INSTANCE_15, "give REPOSITORY:TAG@sha256:DIGEST"),
        (f"{INSTANCE_15}@sha256:abc", "64 lowercase hex digits"),
        (f"{INSTANCE_15}@{DIGEST.upper()}", "64 lowercase hex digits"),
        (f"{INSTANCE_15}@sha512:{'0' * 64}", "give REPOSITORY:TAG@sha256:DIGEST"),
        (f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}@{DIGEST}", "is not REPOSITORY:TAG"),
        (f"Registry/PG:15@{DIGEST}", "is not REPOSITORY:TAG"),
    ],
    ids=["no digest", "short", "uppercase", "sha512", "no tag", "uppercase name"],
)
def test_a_malformed_pin_is_refused_naming_the_flag_and_the_form(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="--pin-image") as refused:
        pinning.parse_pin(text)
    assert says in str(refused.value)


def test_one_tag_pinned_twice_must_agree() -> None:
    same = pinning.parse_pins([f"{INSTANCE_15}@{DIGEST}", f"{INSTANCE_15}@{DIGEST}"])
    assert same == PINS
    other = "sha256:" + "f" * 64
    with pytest.raises(ValueError, match="pinned to two digests"):
        pinning.parse_pins([f"{INSTANCE_15}@{DIGEST}", f"{INSTANCE_15}@{other}"])


def test_every_container_of_the_instances_runs_by_digest_and_the_tag_stays_readable() -> None:
    cluster = make_cluster(version="15")
    children = postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster))
    (statefulset,) = [c for c in children if c["kind"] == "StatefulSet"]
    pinned = pinning.pin_images(statefulset, PINS)
    pod = pinned["spec"]["template"]["spec"]
    images = [c["image"] for key in ("initContainers", "containers") for c in pod.get(key) or []]
    assert images and all(image == f"{INSTANCE_15}@{DIGEST}" for image in images)
    # The built object is not changed in place (the next reconcile builds it afresh anyway).
    assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"] == INSTANCE_15
    # Pinned twice is pinned once: a digest reference names no pin.
    assert pinning.pin_images(pinned, PINS) == pinned
    assert pinning.without_digest(images[0]) == INSTANCE_15


def test_jobs_and_cronjobs_are_pinned_and_what_no_pin_names_is_left_as_it_is() -> None:
    cluster = make_cluster(version="15", backup={"repository": REPOSITORY})
    job = backup.final_backup_job(cluster)
    pinned_job = pinning.pin_images(job, PINS)
    assert {c["image"] for c in pinned_job["spec"]["template"]["spec"]["containers"]} == {
        f"{INSTANCE_15}@{DIGEST}"
    }
    cronjob = {
        "kind": "CronJob",
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": INSTANCE_15}, {"name": "b", "image": "busybox:1.37"}]}}}}},
    }  # fmt: skip
    containers = pinning.pin_images(cronjob, PINS)["spec"]["jobTemplate"]["spec"]["template"][
        "spec"
    ]["containers"]
    assert [c["image"] for c in containers] == [f"{INSTANCE_15}@{DIGEST}", "busybox:1.37"]
    # Nothing to pin: the very same object, no copy.
    own = make_cluster(version="15", image="registry.example/pg:15")
    children = postgres_specs.children(own, patroni_config=config.patroni_config(own))
    for child in children:
        assert pinning.pin_images(child, PINS) is child
    assert pinning.pin_images(job, {}) is job


class Applies:
    """The API as converge writes to it: server-side applies, echoed back."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []

    async def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(body)
        return {**body, "metadata": {**body["metadata"], "namespace": "db"}}

    async def event(self, *_: Any, **__: Any) -> None:
        return None


async def test_converge_pins_before_it_compares_so_a_second_pass_writes_nothing() -> None:
    cluster = make_cluster(version="15")
    children = postgres_specs.children(cluster, patroni_config=config.patroni_config(cluster))
    kube, store = Applies(), ObjectStore()

    def scope() -> postgrescluster.Scope:
        return postgrescluster.Scope(
            cluster=cluster,
            body=cluster.model_dump(by_alias=True, mode="json"),
            kube=kube,  # type: ignore[arg-type]
            store=store,
            now="2026-12-05T03:00:00Z",
            conditions=[],
            image_pins=PINS,
        )

    await core.converge(scope(), children)
    (statefulset,) = [b for b in kube.applied if b["kind"] == "StatefulSet"]
    assert statefulset["spec"]["template"]["spec"]["containers"][0]["image"].endswith(DIGEST)
    written = len(kube.applied)
    assert await core.converge(scope(), children) is None
    assert len(kube.applied) == written


def test_the_operator_reads_its_pins_and_stops_on_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    other = f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:17@sha256:{'f' * 64}"
    args = build_parser().parse_args(
        ["operator", f"--pin-image={INSTANCE_15}@{DIGEST}", "--pin-image", other]
    )
    assert args.pin_image == {
        INSTANCE_15: DIGEST,
        f"{v1alpha1.DEFAULT_IMAGE_REPOSITORY}:17": f"sha256:{'f' * 64}",
    }
    assert build_parser().parse_args(["operator"]).pin_image == {}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", f"--pin-image={INSTANCE_15}"])
    assert "--pin-image" in capsys.readouterr().err


def test_the_operator_knows_its_image_by_the_digest_its_pod_runs() -> None:
    spec = {"containers": [{"name": "operator", "image": "ghcr.io/stateward/stateward:0.1.0"}]}
    resolved = f"ghcr.io/stateward/stateward@{DIGEST}"
    running = {
        "spec": spec,
        "status": {"containerStatuses": [{"name": "operator", "imageID": resolved}]},
    }
    assert operator.own_image(running) == resolved
    # Docker's form of the same, and a runtime that reports only an image id (no digest of
    # a repository): the pod spec's image then.
    docker = {
        "containerStatuses": [{"name": "operator", "imageID": f"docker-pullable://{resolved}"}]
    }
    assert operator.own_image({"spec": spec, "status": docker}) == resolved
    local = {"containerStatuses": [{"name": "operator", "imageID": DIGEST}]}
    assert operator.own_image({"spec": spec, "status": local}) == spec["containers"][0]["image"]
    assert operator.own_image({"spec": spec}) == spec["containers"][0]["image"]
    assert operator.own_image({"spec": {"containers": [{"name": "other", "image": "x:1"}]}}) is None
