"""Archives in the cache, by input hash: a hit costs one small file read and a stat; a miss
builds the rootfs (``rootfs``), packs it (``oci``) and renames it into place, so an archive
that exists is complete; superseded archives are pruned.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stateward_local import binaries, errors
from stateward_local.images.catalog import IMAGES, Archive
from stateward_local.images.oci import PACKER_VERSION, _archive_ref, pack
from stateward_local.images.rootfs import (
    Build,
    _debootstrap,
    _install_packages,
    _mounts_below,
    _remove_tree,
    _stderr,
    _tidy,
    _unpack_layer,
    images_dir,
)

if TYPE_CHECKING:
    from stateward_local.images.catalog import ImageSpec
    from stateward_local.images.rootfs import Progress

PRUNE_AFTER_SECONDS = 3600.0
"""Archives of an image that other inputs produced go when a build of it finds them unused
for this long (an image built from the stateward sources gets a new archive per change)."""


def archive_dir() -> Path:
    return binaries.cache_dir() / "images"


def _matches(key: str, spec: ImageSpec) -> bool:
    return key in (spec.ref, f"{spec.name}:{spec.tag}", spec.name)


def _select(key: str, catalog: Sequence[ImageSpec]) -> list[ImageSpec]:
    """The images ``key`` names: a ref, ``name:tag``, or a name (every image of that name,
    such as each ``postgres-instance`` major), in catalog order."""
    found = [spec for spec in catalog if _matches(key, spec)]
    if not found:
        known = ", ".join(f"{spec.name}:{spec.tag}" for spec in catalog)
        raise errors.LocalClusterError(f"unknown image {key!r} (known: {known})")
    return found


def _lookup(key: str, catalog: Sequence[ImageSpec]) -> ImageSpec:
    """The one image ``key`` names (a ``from_image``): a bare name shared by several images
    means the first of them in the catalog (``base`` is bookworm's)."""
    return _select(key, catalog)[0]


def input_hash(spec: ImageSpec, catalog: Sequence[ImageSpec] = IMAGES) -> str:
    """16 hex digits over the spec, its source and lock files and ``inputs``, its base image
    and the packer version."""
    sources: dict[str, str] = {}
    for relative in spec.source_files:
        path = images_dir() / spec.name / relative
        try:
            sources[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as error:
            raise errors.LocalClusterError(
                f"image {spec.name}: cannot read its source {path} ({error.strerror})"
            ) from error
    base = _lookup(spec.from_image, catalog) if spec.from_image else None
    document = {
        "packer": PACKER_VERSION,
        "spec": spec.identity(),
        "sources": sources,
        "from": None if base is None else input_hash(base, catalog),
    }
    if spec.inputs is not None:
        document["inputs"] = dict(spec.inputs())
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def archive_path(spec: ImageSpec, catalog: Sequence[ImageSpec] = IMAGES) -> Path:
    return archive_dir() / f"{spec.name}-{input_hash(spec, catalog)}.tar"


def ensure(
    names: Sequence[str] | None = None,
    *,
    progress: Progress = _stderr,
    catalog: Sequence[ImageSpec] = IMAGES,
) -> list[Archive]:
    """The archives of the named images (all by default), building those not cached yet.
    A name is a ref, ``name:tag`` or a bare name, which means every image of that name."""
    wanted = (
        list(dict.fromkeys(spec for name in names for spec in _select(name, catalog)))
        if names is not None
        else list(catalog)
    )
    return [_ensure_one(spec, catalog, progress) for spec in wanted]


def _ensure_one(spec: ImageSpec, catalog: Sequence[ImageSpec], progress: Progress) -> Archive:
    path = archive_path(spec, catalog)
    if not path.is_file():
        base = (
            _ensure_one(_lookup(spec.from_image, catalog), catalog, progress)
            if spec.from_image
            else None
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
            if not path.is_file():
                _build(spec, path, base, progress)
                _prune(spec, path, catalog)
    else:
        with contextlib.suppress(OSError):
            os.utime(path)  # the time of last use, for _prune
    return Archive(spec=spec, path=path, ref=spec.ref)


def _prune(spec: ImageSpec, keep: Path, catalog: Sequence[ImageSpec] = IMAGES) -> None:
    """Remove this image's other archives (and logs) unused for :data:`PRUNE_AFTER_SECONDS`:
    superseded inputs, each about the image's size. A recently used one may still be on its
    way into containerd in another process, so it stays. Archives share a file name prefix
    with the other tags of the name (``base`` bookworm and trixie): those, told by the ref
    inside, stay; an unreadable one or one of a tag no longer in the catalog goes."""
    pattern = re.compile(rf"{re.escape(spec.name)}-[0-9a-f]{{16}}\.tar")
    others = {other.ref for other in catalog if other.name == spec.name} - {spec.ref}
    cutoff = time.time() - PRUNE_AFTER_SECONDS
    for old in keep.parent.glob(f"{spec.name}-*.tar"):
        if old == keep or not pattern.fullmatch(old.name):
            continue
        with contextlib.suppress(OSError):
            if old.stat().st_mtime < cutoff and _archive_ref(old) not in others:
                old.unlink()
                old.with_suffix(".log").unlink(missing_ok=True)


def _build(spec: ImageSpec, path: Path, base: Archive | None, progress: Progress) -> None:
    started = time.monotonic()
    work = path.with_name(path.name + ".work")
    log = path.with_name(path.name.removesuffix(".tar") + ".log")
    partial = path.with_name(path.name + ".partial")
    how = (
        f"debootstrap {spec.debootstrap} minbase, about 2 minutes"
        if spec.debootstrap
        else f"from {base.ref}"
        if base
        else "from scratch"
    )
    progress(
        f"Building image {spec.ref} ({how}) into {path.parent}; log {log}."
        " This happens once; later runs reuse the archive."
    )
    _remove_tree(work)
    rootfs = work / "rootfs"
    rootfs.mkdir(parents=True)
    log.write_text("")
    build = Build(
        spec=spec, rootfs=rootfs, sources=images_dir() / spec.name, log=log, progress=progress
    )
    try:
        if spec.debootstrap:
            _debootstrap(build, spec.debootstrap)
            progress(f"  {spec.name}: debootstrap done, {time.monotonic() - started:.0f}s elapsed")
        elif base is not None:
            _unpack_layer(base.path, rootfs)
        if spec.prepare is not None:
            spec.prepare(build)
        if spec.packages:
            _install_packages(build, spec.packages)
        if spec.hook is not None:
            spec.hook(build)
        if _mounts_below(rootfs):
            raise errors.LocalClusterError(f"{spec.name}: {rootfs} still has mounts; not packing")
        _tidy(rootfs)
        progress(f"  {spec.name}: packing the rootfs, {time.monotonic() - started:.0f}s elapsed")
        packed = pack(rootfs, partial, ref=spec.ref, config=spec.oci_config())
        partial.rename(path)
    finally:
        partial.unlink(missing_ok=True)
        _remove_tree(work)
    progress(
        f"Built {spec.ref} in {time.monotonic() - started:.0f}s:"
        f" {path.stat().st_size / 1e6:.1f} MB archive, layer {packed.diff_size / 1e6:.1f} MB"
        f" unpacked, {path.name}"
    )
