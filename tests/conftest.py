"""Fixtures shared by every test layer.

Real-cluster fixtures never read $KUBECONFIG: each starts its own control plane in a temporary
directory on free ports, so a test run cannot touch a cluster it did not make.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from lab.kwok import simulate
from lab.slots import worker_slot
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from stateward_local import binaries
from stateward_local.cluster import Config, LocalCluster
from stateward_local.controlplane.components import Ports
from stateward_local.controlplane.processes import free_port_base

os.environ.pop("KUBECONFIG", None)

REAL_NODE_FILES = frozenset({"test_make_run.py", "test_real_nodes_cli.py"})
"""e2e stories that start a cluster with real nodes of their own (in ``lab.slots.STORY_SLOT``)."""
GROUPS = {
    "test_faults.py": "real-nodes-2",
    "test_database_servers.py": "real-nodes-2",
    "test_plugin.py": "real-nodes-2",
    "test_data_plane.py": "real-nodes-3",
    "test_real_nodes.py": "real-nodes-3",
    "test_database_faults.py": "real-nodes-3",
    "test_deploy.py": "real-nodes-3",
}
"""The xdist group of each real-node module not in the first ("real-nodes": the stories,
the tests marked ``host``, test_backups and test_chart). The split is by the durations of a
clean-clone run (2026-12-06, seconds of setup + call + teardown): the first about 805 s
(stories 168, backups 596, chart 41), the second about 820 (faults 673, database servers
107, plugin 42), the third about 830 (data plane 502, real nodes 149, database faults 130,
deploy 46)."""

MODULE_GROUPS = {"test_wheel.py": "wheel"}
"""Modules whose module-scoped fixtures are slow and must run once, not once per worker that
takes one of their tests: the wheel tests build both wheels and install them in a fresh
virtualenv (about 70 s); spread over three workers that was 185 s of setup."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-node tests, the longest of the suite, make three xdist groups of about equal
    time. ``--dist loadgroup`` hands the groups out first (they hold the most tests), one to
    each of ``make test``'s three workers; each worker runs its shared cluster with real
    nodes in a host slot of its own (``lab.slots``), and the stories theirs in one more, so
    a worker may take any group in any order. The rest of the suite is spread over the
    workers as they finish. Tests marked ``host`` (they mount or change host-wide state) go
    with the stories, one after another. A module of :data:`MODULE_GROUPS` stays in one
    worker."""
    for item in items:
        if item.path.name in MODULE_GROUPS:
            item.add_marker(pytest.mark.xdist_group(MODULE_GROUPS[item.path.name]))
        elif (
            "real_cluster" in getattr(item, "fixturenames", ())
            or item.path.name in REAL_NODE_FILES
            or item.get_closest_marker("host") is not None
        ):
            group = GROUPS.get(item.path.name, "real-nodes")
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """(The controller.) Under ``--dist loadgroup`` xdist keeps a group in one worker only
    through the ``@group`` suffix it puts into node ids; some pytest versions silently undo
    that (9.2: pytest-xdist issue 1386), and two real-node clusters on one host then fail in
    confusing ways. Stop at once instead, naming the cause."""
    if node.config.getoption("dist") != "loadgroup":
        return
    lost = [
        i for i in ids if i.split("::")[0].rsplit("/", 1)[-1] in REAL_NODE_FILES and "@" not in i
    ]
    if lost:
        pytest.exit(
            f"pytest {pytest.__version__} dropped xdist's group from the node ids (first:"
            f" {lost[0]}): the real-node tests would run in two workers at once. Install the"
            " pytest pyproject.toml allows (make venv), or run with TEST_WORKERS=1.",
            returncode=4,
        )


def _start(tmp: Path, *, controllers: bool) -> Iterator[LocalCluster]:
    config = Config(
        state_dir=tmp / "local",
        ports=Ports.from_base(free_port_base()),
        controllers=controllers,
        kwok_stages=simulate,
    )
    cluster = LocalCluster(config)
    binaries.ensure()
    cluster.up(progress=lambda message: print(message))
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok nodes, for the session."""
    yield from _start(tmp_path_factory.mktemp("cluster"), controllers=True)


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd + kube-apiserver only: for tests of API-server behaviour that need no controllers."""
    yield from _start(tmp_path_factory.mktemp("apiserver"), controllers=False)


@pytest.fixture(scope="session")
def real_cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    """Three real nodes (and one tainted kwok node), shared by every real-node test the
    worker runs, in the worker's own host slot (the stories use another)."""
    config = Config(
        state_dir=tmp_path_factory.mktemp("real") / "local",
        ports=Ports.from_base(free_port_base()),
        kwok_nodes=1,
        real_nodes=3,
        slot=worker_slot(),
    )
    cluster = LocalCluster(config)
    cluster.up(progress=lambda message: print(message))
    try:
        yield cluster
    finally:
        # STATEWARD_KEEP_LOGS=1 keeps the whole state directory; a failed test keeps its
        # logs/ (every component's log, the fault tests' diagnoses) for the next reader.
        cluster.down(
            keep=bool(os.environ.get("STATEWARD_KEEP_LOGS")),
            keep_logs=request.session.testsfailed > 0,
        )


def client_for(cluster: LocalCluster, *, kubeconfig: Path | None = None) -> Client:
    config = KubeConfig.from_file(kubeconfig or cluster.kubeconfig)
    return Client(config=config, field_manager="stateward-tests")


@pytest.fixture(scope="session")
def kube(control_plane: LocalCluster) -> Client:
    return client_for(control_plane)


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name, labels={"stateward.io/test": "true"})))
    yield name
    kube.delete(Namespace, name)
