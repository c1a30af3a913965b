"""The node image store: which archives name a store, and how a node's copy is made."""

from __future__ import annotations

import os
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from stateward_local.images import catalog, nodestore

pytestmark = pytest.mark.unit


def archive(tmp_path: Path, name: str) -> catalog.Archive:
    return catalog.Archive(spec=catalog.PAUSE, path=tmp_path / name, ref=catalog.PAUSE_REF)


def test_a_store_is_named_by_its_archives_and_containerd_in_any_order(tmp_path: Path) -> None:
    a, b = archive(tmp_path, "base-1.tar"), archive(tmp_path, "postgres-2.tar")
    key = nodestore.key([a, b], "v2.4.2")
    assert key == nodestore.key([b, a], "v2.4.2")
    assert len(key) == 16
    assert key != nodestore.key([a, archive(tmp_path, "postgres-3.tar")], "v2.4.2")
    assert key != nodestore.key([a], "v2.4.2")
    assert key != nodestore.key([a, b], "v2.5.0")


def test_the_importing_containerd_runs_nothing_and_keeps_to_its_own_paths() -> None:
    text = nodestore.config(Path("/c/root"), Path("/s/state"), Path("/s/c.sock"))
    config = tomllib.loads(text)
    assert config["version"] == 3
    assert config["root"] == "/c/root" and config["state"] == "/s/state"
    assert config["grpc"]["address"] == "/s/c.sock"
    assert {
        "io.containerd.grpc.v1.cri",
        "io.containerd.cri.v1.runtime",
        "io.containerd.cri.v1.images",
        "io.containerd.nri.v1.nri",
    } <= set(config["disabled_plugins"])


def store(tmp_path: Path) -> Path:
    root = tmp_path / "store" / "root"
    blobs = root / "io.containerd.content.v1.content" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / "abc").write_bytes(b"layer")
    snapshot = root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots" / "1" / "fs"
    (snapshot / "usr" / "bin").mkdir(parents=True)
    (snapshot / "usr" / "bin" / "postgres").write_bytes(b"binary")
    (snapshot / "etc").mkdir()
    (snapshot / "etc" / "alternatives.db").write_bytes(b"an image's file, not a database")
    (snapshot / "lib").symlink_to("usr/lib")
    (root / "io.containerd.metadata.v1.bolt").mkdir()
    (root / "io.containerd.metadata.v1.bolt" / "meta.db").write_bytes(b"images")
    (root / "io.containerd.snapshotter.v1.overlayfs" / "metadata.db").write_bytes(b"snapshots")
    return root


def test_a_node_links_the_files_and_owns_copies_of_the_databases(tmp_path: Path) -> None:
    root = store(tmp_path)
    target = tmp_path / "nodes" / "node-1" / "containerd"
    target.mkdir(parents=True)  # create_node makes it; cp would copy into it
    nodestore.seed(root, target)
    for relative in (
        "io.containerd.content.v1.content/blobs/sha256/abc",
        "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/postgres",
        "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/etc/alternatives.db",
    ):
        assert os.path.samefile(root / relative, target / relative), relative
    assert (target / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/lib").is_symlink()
    for relative in (
        "io.containerd.metadata.v1.bolt/meta.db",
        "io.containerd.snapshotter.v1.overlayfs/metadata.db",
    ):
        assert not os.path.samefile(root / relative, target / relative), relative
        assert (target / relative).read_bytes() == (root / relative).read_bytes()
    (target / "io.containerd.metadata.v1.bolt" / "meta.db").write_bytes(b"the node's own")
    assert (root / "io.containerd.metadata.v1.bolt" / "meta.db").read_bytes() == b"images"


def test_across_filesystems_a_node_gets_a_full_copy(tmp_path: Path) -> None:
    """/dev/shm is a tmpfs of its own on Linux: links from the store cannot reach it."""
    root = store(tmp_path)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        target = Path(other) / "containerd"
        nodestore.seed(root, target)
        copied = target / "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs/usr/bin/postgres"
        assert copied.read_bytes() == b"binary"
        assert os.stat(copied).st_dev != os.stat(root).st_dev


def test_other_stores_go_once_unused_and_the_current_one_stays(tmp_path: Path) -> None:
    current, recent, stale = (tmp_path / f"containerd-{n}" for n in ("a", "b", "c"))
    for folder in (current, recent, stale):
        (folder / "root").mkdir(parents=True)
    old = time.time() - nodestore.UNUSED_AFTER_SECONDS - 60
    os.utime(stale, (old, old))
    os.utime(current, (old, old))
    nodestore._prune(keep=current)
    assert current.is_dir() and recent.is_dir() and not stale.exists()
