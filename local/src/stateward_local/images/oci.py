"""The deterministic OCI packer (one layer, fixed metadata: the same rootfs always gives the
same archive), the digests that name an archive, and its import into a node's containerd.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from stateward_local import errors

if TYPE_CHECKING:
    from stateward_local.images.catalog import Archive

# Bump when the packer or the generic build steps change what an archive holds.
PACKER_VERSION = "1"
Compression = Literal["gzip", "none"]

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = {
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "none": "application/vnd.oci.image.layer.v1.tar",
}
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"


def manifest_digest(archive: Path) -> str:
    """The digest of an archive's image manifest: what a pod naming the image by digest
    (``REPOSITORY:TAG@sha256:...``) asks the runtime for."""
    with tarfile.open(archive) as outer:
        return _index_manifest_digest(outer)


def digest_ref(ref: str, digest: str) -> str:
    """``REPOSITORY@DIGEST`` of ``REPOSITORY:TAG``: the name the CRI plugin looks an image
    up by when a pod names it by digest (it drops the tag of ``REPOSITORY:TAG@DIGEST``)."""
    return f"{ref.rpartition(':')[0]}@{digest}"


def _index_manifest_digest(outer: tarfile.TarFile) -> str:
    member = outer.extractfile("index.json")
    assert member is not None
    digest: str = json.load(member)["manifests"][0]["digest"]
    return digest


def _archive_ref(archive: Path) -> str | None:
    """The ref one of our archives is named by (index.json, its second member); None when
    it is no such archive."""
    try:
        with tarfile.open(archive, "r|") as outer:
            for member in outer:
                if member.name == "index.json":
                    index = outer.extractfile(member)
                    assert index is not None
                    ref = json.load(index)["manifests"][0]["annotations"][ANNOTATION_REF_NAME]
                    return ref if isinstance(ref, str) else None
    except (OSError, tarfile.TarError, ValueError, LookupError, TypeError):
        return None
    return None


@dataclasses.dataclass(frozen=True)
class Packed:
    """Digests and sizes of what :func:`pack` wrote."""

    manifest_digest: str
    layer_digest: str
    diff_id: str
    diff_size: int


class _Digest:
    """A write-only stream that hashes and counts what passes through to ``sink``."""

    def __init__(self, sink: BinaryIO | _Digest | gzip.GzipFile | None) -> None:
        self.sink = sink
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hash.update(data)
        self.size += len(data)
        if self.sink is not None:
            self.sink.write(data)
        return len(data)

    def flush(self) -> None:
        pass

    @property
    def digest(self) -> str:
        return f"sha256:{self.hash.hexdigest()}"


def _entries(rootfs: Path) -> list[str]:
    """Every path below ``rootfs``, relative, sorted bytewise (a directory before its content)."""
    found: list[str] = []

    def walk(folder: str, prefix: str) -> None:
        with os.scandir(folder) as scan:
            for entry in scan:
                found.append(prefix + entry.name)
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, f"{prefix}{entry.name}/")

    walk(str(rootfs), "")
    return sorted(found, key=os.fsencode)


def write_layer(rootfs: Path, sink: BinaryIO, *, compression: Compression = "gzip") -> Packed:
    """A GNU tar of ``rootfs``: sorted, mtime 0, numeric owners, no names; gzip -1 by default."""
    blob = _Digest(sink)
    zipped = (
        gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=blob, mtime=0)
        if compression == "gzip"
        else None
    )
    diff = _Digest(zipped if zipped is not None else blob)
    first_of_inode: dict[tuple[int, int], str] = {}
    with tarfile.open(fileobj=diff, mode="w|", format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
        for name in _entries(rootfs):
            path = os.path.join(rootfs, name)
            st = os.lstat(path)
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, st.st_uid, st.st_gid, "", ""
            info.mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISREG(st.st_mode):
                inode = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and inode in first_of_inode:
                    info.type, info.linkname = tarfile.LNKTYPE, first_of_inode[inode]
                    tar.addfile(info)
                    continue
                first_of_inode[inode] = name
                info.size = st.st_size
                with open(path, "rb") as content:
                    tar.addfile(info, content)
                continue
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(st.st_mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                info.type = tarfile.CHRTYPE if stat.S_ISCHR(st.st_mode) else tarfile.BLKTYPE
                info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            elif stat.S_ISFIFO(st.st_mode):
                info.type = tarfile.FIFOTYPE
            else:
                continue  # sockets belong to running processes, not images
            tar.addfile(info)
    if zipped is not None:
        zipped.close()
    return Packed(
        manifest_digest="", layer_digest=blob.digest, diff_id=diff.digest, diff_size=diff.size
    )


def _json(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, content: bytes) -> dict[str, object]:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(content).hexdigest()}",
        "size": len(content),
    }


def pack(
    rootfs: Path,
    dest: Path,
    *,
    ref: str,
    config: Mapping[str, object],
    compression: Compression = "gzip",
) -> Packed:
    """Write ``rootfs`` as a one-layer OCI image-layout tar archive named ``ref``.

    The same rootfs (content, modes, owners, links) and arguments give the same bytes.
    """
    layer_path = dest.with_name(dest.name + ".layer")
    try:
        with open(layer_path, "wb") as layer_file:
            layer = write_layer(rootfs, layer_file, compression=compression)
        layer_size = layer_path.stat().st_size
        image_config = _json(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": dict(config),
                "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
                "history": [{"created_by": f"stateward local image packer {PACKER_VERSION}"}],
            }
        )
        layer_descriptor = {
            "mediaType": MEDIA_LAYER[compression],
            "digest": layer.layer_digest,
            "size": layer_size,
        }
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_MANIFEST,
                "config": _descriptor(MEDIA_CONFIG, image_config),
                "layers": [layer_descriptor],
            }
        )
        manifest_descriptor = {
            **_descriptor(MEDIA_MANIFEST, manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {ANNOTATION_CONTAINERD_NAME: ref, ANNOTATION_REF_NAME: ref},
        }
        index = _json(
            {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [manifest_descriptor]}
        )
        blobs: dict[str, bytes | Path] = {
            str(_descriptor("", image_config)["digest"]): image_config,
            str(manifest_descriptor["digest"]): manifest,
            layer.layer_digest: layer_path,
        }
        with tarfile.open(dest, "w", format=tarfile.GNU_FORMAT) as out:
            _add(out, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
            _add(out, "index.json", index)
            _add(out, "blobs", None)
            _add(out, "blobs/sha256", None)
            for digest in sorted(blobs):
                _add(out, f"blobs/sha256/{digest.removeprefix('sha256:')}", blobs[digest])
    finally:
        layer_path.unlink(missing_ok=True)
    return dataclasses.replace(layer, manifest_digest=str(manifest_descriptor["digest"]))


def _add(out: tarfile.TarFile, name: str, content: bytes | Path | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if content is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        out.addfile(info)
        return
    info.mode = 0o644
    if isinstance(content, Path):
        info.size = content.stat().st_size
        with open(content, "rb") as source:
            out.addfile(info, source)
    else:
        info.size = len(content)
        out.addfile(info, io.BytesIO(content))


def import_into(
    archive: Archive,
    *,
    ctr: Path,
    address: str,
    namespace: str = "k8s.io",
    snapshotter: str = "overlayfs",
) -> None:
    """Import an archive into a containerd, unpacked for ``snapshotter``, named ``archive.ref``
    and by its digest (``REPOSITORY@sha256:...``), as a registry pull names an image too.

    No ``--base-name``: ctr then keeps the full name from ``io.containerd.image.name``. No
    ``--no-unpack``: the CRI plugin runs only unpacked images. Pinned, so kubelet's image
    garbage collection never removes an image no registry could give back. The digest name
    lets pods run it pinned (``--pin-image``), as they would from a registry.
    """
    if not Path(ctr).is_file():
        raise errors.LocalClusterError(f"ctr not found at {ctr}: build containerd first")
    base = [str(ctr), "--address", address, "--namespace", namespace]
    argv = [
        *base,
        "images",
        "import",
        "--platform",
        "linux/amd64",
        "--snapshotter",
        snapshotter,
        "--label",
        "io.cri-containerd.pinned=pinned",
        str(archive.path),
    ]
    by_digest = digest_ref(archive.ref, manifest_digest(archive.path))
    tag = [*base, "images", "tag", "--local", "--force", archive.ref, by_digest]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            done = subprocess.run(tag, capture_output=True, text=True, timeout=60)
        listed = (
            subprocess.run(
                [*base, "images", "list", "--quiet"], capture_output=True, text=True, timeout=60
            )
            if done.returncode == 0
            else done
        )
    except subprocess.TimeoutExpired as error:
        raise errors.LocalClusterError(
            f"importing {archive.ref} into containerd at {address} timed out"
        ) from error
    if done.returncode != 0 or listed.returncode != 0:
        failed = done if done.returncode != 0 else listed
        reason = (failed.stderr.strip().splitlines() or ["no output"])[-1]
        if "connection refused" in reason or "no such file" in reason.lower():
            raise errors.LocalClusterError(
                f"cannot reach containerd at {address} to import {archive.ref}: is it running?"
                f" (ctr said: {reason})"
            )
        raise errors.LocalClusterError(f"ctr images import of {archive.path} failed: {reason}")
    if archive.ref not in listed.stdout.split():
        raise errors.LocalClusterError(
            f"ctr imported {archive.path} but containerd has no image named {archive.ref}:"
            " the archive's index.json lacks the io.containerd.image.name annotation?"
        )
    if by_digest not in listed.stdout.split():
        raise errors.LocalClusterError(
            f"ctr tagged {archive.ref} as {by_digest}, but containerd does not list that name"
        )
