"""The images every real node holds, imported once per set of images and then linked in.

Importing an archive into containerd costs its gunzip, two checksums and the write of every
file of the unpacked snapshot: for the node images (PostgreSQL 15 and 17, MariaDB, the
operator) about 25 s of CPU per node, paid by every node of every ``up``. Instead one
containerd, started only for this, imports them into a root of its own in the cache
(``<cache>/images/nodes/containerd-<key>/root``, the key naming the archives and
containerd's version), and each node's containerd root starts as a copy of it: hard links
where the filesystem allows, so the copy takes seconds and no disk. kind preloads its node
image's containerd the same way.

The links are safe to share: content blobs are immutable, and an unpacked snapshot is only
ever an overlay's lower directory, which the kernel never writes (writes go to each
container's own upper directory). The two bolt databases (containerd's metadata and the
overlayfs snapshotter's) are written, so every node gets its own copy of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from stateward_local import binaries
from stateward_local.errors import LocalClusterError
from stateward_local.images import cache, catalog, oci

STORE_VERSION = "1"
"""Bump when what a store holds changes for the same archives and containerd."""
UNUSED_AFTER_SECONDS = 600.0
"""Other stores go once unused this long: a node's copy does not need its store (the links
keep the files), so only a store another ``up`` is copying from right now must stay."""
START_TIMEOUT = 60.0

Progress = Callable[[str], None]


def stores_dir() -> Path:
    return cache.archive_dir() / "nodes"


def key(archives: Sequence[catalog.Archive], containerd_version: str) -> str:
    """Names the store: the archives (their file names carry their inputs' hash), the
    containerd that wrote it and :data:`STORE_VERSION`."""
    digest = hashlib.sha256(f"{STORE_VERSION}\n{containerd_version}\n".encode())
    for name in sorted(archive.path.name for archive in archives):
        digest.update(f"{name}\n".encode())
    return digest.hexdigest()[:16]


def store_root(archives: Sequence[catalog.Archive]) -> Path:
    """Where the containerd root holding ``archives`` is (or will be) in the cache."""
    return stores_dir() / f"containerd-{key(archives, binaries.CONTAINERD_VERSION)}" / "root"


def config(root: Path, state: Path, address: Path) -> str:
    """containerd (config version 3) that only stores: no CRI, no NRI, nothing that runs."""
    return f"""\
version = 3
root = '{root}'
state = '{state}'
disabled_plugins = [
  'io.containerd.grpc.v1.cri',
  'io.containerd.cri.v1.runtime',
  'io.containerd.cri.v1.images',
  'io.containerd.nri.v1.nri',
]

[grpc]
  address = '{address}'
"""


def ensure(
    archives: Sequence[catalog.Archive], paths: binaries.Binaries, *, progress: Progress
) -> Path:
    """The containerd root holding ``archives``, imported now if no store has them yet."""
    root = store_root(archives)
    final = root.parent
    if root.is_dir():
        with contextlib.suppress(OSError):
            os.utime(final)  # the time of last use, for _prune
        return root
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another `up` may be importing the same set
        if not root.is_dir():
            started = time.monotonic()
            progress(f"Importing {len(archives)} images once for every real node into {final}")
            partial = final.with_name(final.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            _import(archives, partial, containerd=paths.containerd, ctr=paths.ctr)
            partial.rename(final)
            progress(f"Imported the node images in {time.monotonic() - started:.0f}s.")
        _prune(keep=final)
    return root


def _import(
    archives: Sequence[catalog.Archive], target: Path, *, containerd: Path, ctr: Path
) -> None:
    # The socket path must fit a sockaddr_un (108 bytes): a short temporary directory.
    with tempfile.TemporaryDirectory(prefix="stateward-store-") as scratch:
        address = Path(scratch) / "c.sock"
        conf = Path(scratch) / "config.toml"
        conf.write_text(config(target / "root", Path(scratch) / "state", address))
        log_path = target / "containerd.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [str(containerd), f"--config={conf}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not address.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise LocalClusterError(
                        f"containerd for the node images did not start; see {log_path}"
                    )
                time.sleep(0.1)
            for archive in archives:
                oci.import_into(archive, ctr=ctr, address=str(address))
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def seed(root: Path, target: Path) -> None:
    """Make ``target`` (a node's containerd root) a copy of ``root``: hard links, or a full
    copy where ``target`` is on another filesystem or mount (links cannot cross either, so
    seed a node before its directory becomes the private mount of ``nodes.prepare_host``);
    the databases are always copies of their own."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        target.rmdir()  # cp copies into a directory that exists; an empty one may go
    linked = subprocess.run(
        ["cp", "-a", "--link", str(root), str(target)], capture_output=True, text=True
    )
    if linked.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        copied = subprocess.run(
            ["cp", "-a", str(root), str(target)], capture_output=True, text=True
        )
        if copied.returncode != 0:
            raise LocalClusterError(
                f"could not copy the node images {root} to {target}: {copied.stderr.strip()}"
            )
        return
    for database in root.glob("*/*.db"):  # containerd's metadata, the snapshotter's
        own = target / database.relative_to(root)
        temporary = own.with_name(own.name + ".copy")
        shutil.copy2(database, temporary)
        temporary.replace(own)  # a new inode: the store's database stays untouched


def _prune(*, keep: Path) -> None:
    cutoff = time.time() - UNUSED_AFTER_SECONDS
    for old in keep.parent.glob("containerd-*"):
        if old == keep:
            continue
        with contextlib.suppress(OSError):
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
