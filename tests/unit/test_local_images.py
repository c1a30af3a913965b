"""The local image builder: deterministic OCI packing, the input-hash cache, ctr import argv."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

import stateward
from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward.specs import pods
from stateward.specs.postgres import statefulset
from stateward_local.errors import LocalClusterError
from stateward_local.images import cache, catalog, locks, oci, piplock, rootfs

pytestmark = pytest.mark.unit

REF = "localhost/stateward/test:1"
CONFIG: dict[str, object] = {"Entrypoint": ["/bin/true"], "Env": ["A=1"], "User": "10:20"}
IS_ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]
REPO_IMAGES = REPO / "images"


def build_tree(root: Path, *, reverse: bool = False) -> Path:
    """Same content either way; creation order (and so inode numbers, mtimes) differs."""
    root.mkdir(parents=True)
    dirs = ["bin", "etc"]
    files = [
        ("etc/os-release", b"NAME=test\n", 0o644),
        ("bin/tool", b"#!/bin/sh\n", 0o4755),
        ("etc-z", b"sorts between etc and etc/fifo", 0o600),
    ]
    for name in reversed(dirs) if reverse else dirs:
        (root / name).mkdir()
        os.chmod(root / name, 0o755)  # noqa: S103 - a directory in a test tree
    for name, content, mode in reversed(files) if reverse else files:
        (root / name).write_bytes(content)
        os.chmod(root / name, mode)
        if reverse:
            os.utime(root / name, (12345, 12345))
    (root / "bin" / "tool-alias").symlink_to("tool")
    os.link(root / "bin" / "tool", root / "bin" / "b-hardlink")
    os.mkfifo(root / "etc" / "fifo")
    return root


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as archive:
        out: dict[str, bytes] = {}
        for member in archive.getmembers():
            if member.isfile():
                extracted = archive.extractfile(member)
                assert extracted is not None
                out[member.name] = extracted.read()
        return out


def layer_members(path: Path) -> list[tarfile.TarInfo]:
    files = read_archive(path)
    index = json.loads(files["index.json"])
    manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"][7:]])
    blob = files["blobs/sha256/" + manifest["layers"][0]["digest"][7:]]
    data = gzip.decompress(blob) if manifest["layers"][0]["mediaType"].endswith("gzip") else blob
    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
        return layer.getmembers()


def test_same_tree_gives_byte_identical_archives(tmp_path: Path) -> None:
    one = build_tree(tmp_path / "one")
    two = build_tree(tmp_path / "two", reverse=True)
    first = oci.pack(one, tmp_path / "1.tar", ref=REF, config=CONFIG)
    again = oci.pack(one, tmp_path / "1b.tar", ref=REF, config=CONFIG)
    other = oci.pack(two, tmp_path / "2.tar", ref=REF, config=CONFIG)
    blob = (tmp_path / "1.tar").read_bytes()
    assert blob == (tmp_path / "1b.tar").read_bytes() == (tmp_path / "2.tar").read_bytes()
    assert first == again == other
    assert not list(tmp_path.glob("*.layer")), "the temporary layer file is removed"
    (one / "etc" / "os-release").write_text("NAME=changed\n")
    changed = oci.pack(one, tmp_path / "3.tar", ref=REF, config=CONFIG)
    assert changed.diff_id != first.diff_id


def test_layer_is_sorted_with_mtime_zero_and_numeric_owners(tmp_path: Path) -> None:
    root = build_tree(tmp_path / "root")
    if IS_ROOT:
        os.chown(root / "etc" / "os-release", 1234, 5678)
        os.mknod(root / "etc" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    listener = socket.socket(socket.AF_UNIX)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        listener.bind("sock")  # relative: tmp paths can exceed the 108-byte socket limit
    finally:
        os.chdir(cwd)
    oci.pack(root, tmp_path / "out.tar", ref=REF, config=CONFIG)
    listener.close()
    members = layer_members(tmp_path / "out.tar")
    names = [m.name for m in members]
    assert names == sorted(names, key=os.fsencode)
    assert "sock" not in names, "sockets are skipped"
    assert names.index("etc") < names.index("etc-z") < names.index("etc/fifo"), "bytewise"
    by_name = {m.name: m for m in members}
    assert all(m.mtime == 0 and m.uname == "" and m.gname == "" for m in members)
    assert by_name["bin/tool"].mode == 0o4755 and by_name["etc-z"].mode == 0o600
    assert by_name["bin/tool-alias"].issym() and by_name["bin/tool-alias"].linkname == "tool"
    assert by_name["bin/b-hardlink"].isfile(), "the first name (bytewise) carries the content"
    assert by_name["bin/tool"].islnk() and by_name["bin/tool"].linkname == "bin/b-hardlink"
    assert by_name["etc/fifo"].isfifo() and by_name["etc"].isdir()
    expected_owner = (1234, 5678) if IS_ROOT else (os.geteuid(), os.getegid())
    assert (by_name["etc/os-release"].uid, by_name["etc/os-release"].gid) == expected_owner
    if IS_ROOT:
        assert (by_name["bin"].uid, by_name["bin"].gid) == (0, 0), "root-owned stays 0"
        device = by_name["etc/null"]
        assert device.ischr() and (device.devmajor, device.devminor) == (1, 3)


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_layout_structure_and_digests_verify(tmp_path: Path, compression: oci.Compression) -> None:
    root = build_tree(tmp_path / "root")
    packed = oci.pack(
        root,
        tmp_path / "out.tar",
        ref=REF,
        config=CONFIG,
        compression=compression,
    )
    with tarfile.open(tmp_path / "out.tar") as archive:
        assert [m.name for m in archive.getmembers()][:4] == [
            "oci-layout",
            "index.json",
            "blobs",
            "blobs/sha256",
        ]
        assert all(m.mtime == 0 and m.uid == 0 and m.uname == "" for m in archive.getmembers())
    files = read_archive(tmp_path / "out.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    blobs = {
        "sha256:" + name.rsplit("/", 1)[1]: data
        for name, data in files.items()
        if name.startswith("blobs/sha256/")
    }
    for digest, data in blobs.items():
        assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    index = json.loads(files["index.json"])
    assert index["schemaVersion"] == 2 and index["mediaType"] == oci.MEDIA_INDEX
    [entry] = index["manifests"]
    assert entry["annotations"] == {
        "io.containerd.image.name": REF,
        "org.opencontainers.image.ref.name": REF,
    }
    assert entry["mediaType"] == oci.MEDIA_MANIFEST
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    assert entry["digest"] == packed.manifest_digest and entry["size"] == len(
        blobs[entry["digest"]]
    )
    manifest = json.loads(blobs[entry["digest"]])
    assert manifest["schemaVersion"] == 2 and manifest["mediaType"] == oci.MEDIA_MANIFEST
    assert manifest["config"]["mediaType"] == oci.MEDIA_CONFIG
    [layer] = manifest["layers"]
    assert layer["mediaType"] == oci.MEDIA_LAYER[compression]
    for descriptor in (manifest["config"], layer):
        assert descriptor["size"] == len(blobs[descriptor["digest"]])
    assert set(blobs) == {entry["digest"], manifest["config"]["digest"], layer["digest"]}
    config = json.loads(blobs[manifest["config"]["digest"]])
    raw = blobs[layer["digest"]]
    uncompressed = gzip.decompress(raw) if compression == "gzip" else raw
    if compression == "gzip":
        assert raw[4:8] == b"\0\0\0\0", "gzip header mtime 0"
    assert config["rootfs"] == {
        "type": "layers",
        "diff_ids": ["sha256:" + hashlib.sha256(uncompressed).hexdigest()],
    }
    assert config["rootfs"]["diff_ids"] == [packed.diff_id]
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    assert config["config"] == CONFIG


def test_specs_refs_and_oci_config() -> None:
    assert catalog.PAUSE_REF == "localhost/stateward/pause:3.10-stateward1"
    assert catalog.BASE.ref == "localhost/stateward/base:bookworm-1"
    assert catalog.PAUSE.oci_config() == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    assert catalog.BASE.oci_config()["Cmd"] == ["/bin/bash"]
    assert [spec.name for spec in catalog.IMAGES] == [
        "pause",
        "base",
        "postgres-instance",
        "base",
        "postgres-instance",
        "mariadb-instance",
        "stateward",
    ]
    assert catalog.MARIADB_1011.ref == "ghcr.io/stateward/mariadb-instance:10.11"
    assert catalog.MARIADB_1011.oci_config()["User"] == "999:999"
    with pytest.raises(ValueError, match="fixed tag"):
        catalog.ImageSpec(name="x", tag="latest")
    with pytest.raises(ValueError, match="not both"):
        catalog.ImageSpec(name="x", tag="1", debootstrap="bookworm", from_image="base")


def test_input_hash_follows_spec_and_sources_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source_dir = tmp_path / "images"
    shutil.copytree(REPO_IMAGES / "pause", source_dir / "pause")
    monkeypatch.setenv("STATEWARD_IMAGES_DIR", str(source_dir))
    pause = catalog.PAUSE
    original = cache.input_hash(pause)
    assert len(original) == 16 and cache.input_hash(pause) == original
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("STATEWARD_DEBIAN_MIRROR", "http://mirror.invalid/debian")
    os.utime(source_dir / "pause" / "pause.c", (1, 1))
    assert cache.input_hash(pause) == original, "location, mirror and mtimes are not inputs"
    for changed in (
        dataclasses.replace(pause, tag="3.10-stateward2"),
        dataclasses.replace(pause, packages=("curl",)),
        dataclasses.replace(pause, env=("A=1",)),
        dataclasses.replace(pause, user="0"),
        dataclasses.replace(pause, hook=None),
    ):
        assert cache.input_hash(changed) != original, changed
    with (source_dir / "pause" / "pause.c").open("a") as source:
        source.write("/* changed */\n")
    assert cache.input_hash(pause) != original
    assert cache.archive_path(pause).name == f"pause-{cache.input_hash(pause)}.tar"


@pytest.mark.parametrize(
    ("major", "spec", "base"),
    [(15, catalog.POSTGRES_15, catalog.BASE), (17, catalog.POSTGRES_17, catalog.BASE_TRIXIE)],
    ids=["15-bookworm", "17-trixie"],
)
def test_the_instance_image_is_the_operators_default_image(
    major: int, spec: catalog.ImageSpec, base: catalog.ImageSpec
) -> None:
    assert spec.ref == f"ghcr.io/stateward/postgres-instance:{major}"
    assert {15: catalog.POSTGRES_15.ref, 17: catalog.POSTGRES_17.ref} == catalog.INSTANCE_REFS
    document = {
        "apiVersion": v1alpha1.API_VERSION,
        "kind": v1alpha1.KIND,
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u"},
        "spec": {"version": str(major), "replicas": 1, "storageSize": "1Gi"},
    }
    cluster = v1alpha1.PostgresCluster.model_validate(document)
    [container] = statefulset.statefulset(cluster, config_hash="x")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["image"] == spec.ref
    assert "imagePullPolicy" not in container, "defaulted to IfNotPresent for a fixed tag"
    config = spec.oci_config()
    assert config["User"] == f"{pods.POSTGRES_UID}:{pods.POSTGRES_UID}"
    [path] = [entry for entry in spec.env if entry.startswith("PATH=")]
    assert path.startswith(f"PATH=/opt/stateward/bin:/usr/lib/postgresql/{major}/bin:")
    assert f"/usr/lib/postgresql/{major}/bin" == patroni.bin_dir(major)
    assert spec.from_image == f"base:{base.tag}" and spec.prepare is not None
    assert cache._lookup(spec.from_image, catalog.IMAGES) is base
    assert set(spec.packages) == {
        f"postgresql-{major}",
        "pgbackrest",
        "python3",
        "python3-venv",
        "ca-certificates",
        "libnss-wrapper",
        "pgbouncer",
    }
    assert spec in catalog.IMAGES and base in catalog.IMAGES
    assert catalog.IMAGES.index(base) < catalog.IMAGES.index(spec)


def test_postgres_17_comes_from_a_trixie_base_like_bookworms() -> None:
    bookworm, trixie = catalog.BASE, catalog.BASE_TRIXIE
    assert trixie.ref == "localhost/stateward/base:trixie-1" and trixie.debootstrap == "trixie"
    assert bookworm.identity() == {
        "name": "base",
        "tag": "bookworm-1",
        "debootstrap": "bookworm",
        "from_image": None,
        "packages": [],
        "sources": [],
        "hook": "stateward_local.images._configure_debian",
        "config": {"Cmd": ["/bin/bash"], "Env": [rootfs.DEFAULT_PATH, "LANG=C.UTF-8"]},
    }, "unchanged: the cached bookworm base archive stays valid"
    same = dataclasses.replace(trixie, tag=bookworm.tag, debootstrap="bookworm", on_nodes=True)
    assert same == bookworm
    assert not trixie.on_nodes and bookworm.on_nodes, (
        "a build stage only: never imported into nodes"
    )
    hashes = {
        cache.input_hash(spec)
        for spec in (bookworm, trixie, catalog.POSTGRES_15, catalog.POSTGRES_17)
    }
    assert len(hashes) == 4
    assert catalog.POSTGRES_17.oci_config()["User"] == catalog.POSTGRES_15.oci_config()["User"]
    assert catalog.POSTGRES_17.hook is catalog.POSTGRES_15.hook


@pytest.mark.parametrize(
    ("spec", "keyring"),
    [
        (catalog.BASE, "debian-archive-keyring.gpg"),
        (catalog.BASE_TRIXIE, "debian-archive-keyring.pgp"),
    ],
    ids=["bookworm", "trixie"],
)
def test_debian_apt_sources_name_the_suite(
    tmp_path: Path, spec: catalog.ImageSpec, keyring: str
) -> None:
    tree = tmp_path / "rootfs"
    (tree / "etc" / "apt").mkdir(parents=True)
    (tree / "etc" / "apt" / "sources.list").write_text("deb http://x/ trixie main\n")
    (tree / "usr" / "share" / "keyrings").mkdir(parents=True)
    (tree / "usr" / "share" / "keyrings" / keyring).write_bytes(b"keys")  # as the suite has
    build = rootfs.Build(
        spec=spec, rootfs=tree, sources=tmp_path, log=tmp_path / "log", progress=lambda _: None
    )
    assert spec.hook is not None
    spec.hook(build)
    assert not (tree / "etc" / "apt" / "sources.list").exists()
    suite = spec.debootstrap
    signed = f"Signed-By: /usr/share/keyrings/{keyring}"
    assert (tree / "etc" / "apt" / "sources.list.d" / "debian.sources").read_text() == (
        f"Types: deb\nURIs: http://deb.debian.org/debian\nSuites: {suite} {suite}-updates\n"
        f"Components: main\n{signed}\n\n"
        f"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: {suite}-security\n"
        f"Components: main\n{signed}\n"
    )


def test_existing_images_keep_their_hashes_and_the_instance_follows_stateward_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert "repository" not in catalog.BASE.identity() and "prepare" not in catalog.BASE.identity()
    source = tmp_path / "checkout"
    (source / "src" / "stateward" / "instance").mkdir(parents=True)
    (source / "pyproject.toml").write_text("[project]\n")
    module = source / "src" / "stateward" / "instance" / "cli.py"
    module.write_text("print(1)\n")
    (source / "src" / "stateward" / "instance" / "__pycache__").mkdir()
    monkeypatch.setenv("STATEWARD_SOURCE_DIR", str(source))
    monkeypatch.setenv("STATEWARD_IMAGES_DIR", str(REPO_IMAGES))  # the locks
    assert catalog._package_files(source) == ["pyproject.toml", "src/stateward/instance/cli.py"]
    before = cache.input_hash(catalog.POSTGRES_15)
    base_before = cache.input_hash(catalog.BASE)
    (source / "src" / "stateward" / "instance" / "__pycache__" / "cli.pyc").write_bytes(b"x")
    (source / "src" / "stateward" / "notes.txt").write_text("not packaged")
    assert cache.input_hash(catalog.POSTGRES_15) == before, "only what the wheel holds counts"
    module.write_text("print(2)\n")
    assert cache.input_hash(catalog.POSTGRES_15) != before
    assert cache.input_hash(catalog.BASE) == base_before
    monkeypatch.setenv("STATEWARD_SOURCE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(LocalClusterError, match="source checkout"):
        cache.input_hash(catalog.POSTGRES_15)


def operator_pod() -> dict[str, Any]:
    """The pod template of config/manager's Deployment."""
    documents = yaml.safe_load_all((REPO / "config" / "manager" / "manager.yaml").read_text())
    [deployment] = [d for d in documents if d and d["kind"] == "Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def test_the_operator_image_is_what_config_manager_deploys() -> None:
    spec = catalog.OPERATOR
    with (REPO / "pyproject.toml").open("rb") as pyproject:
        version = tomllib.load(pyproject)["project"]["version"]
    assert catalog.stateward_version() == version == stateward.__version__
    assert spec.ref == catalog.OPERATOR_REF == f"ghcr.io/stateward/stateward:{version}"
    pod = operator_pod()
    [container] = pod["containers"]
    assert container["image"] == spec.ref
    assert container.get("imagePullPolicy") == "IfNotPresent", "no registry has it"
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert spec.user == f"{security['runAsUser']}:{security['runAsGroup']}" == "65532:65532"
    assert catalog.OPERATOR_UID == 65532
    # The Deployment replaces the entrypoint with `stateward`, found through the image's PATH,
    # and the cmd with its args (`operator ...`).
    [path] = [entry for entry in spec.env if entry.startswith("PATH=")]
    assert path.split("=", 1)[1].split(":")[0] == "/opt/stateward/bin"
    assert path.endswith(rootfs.DEFAULT_PATH.removeprefix("PATH="))
    assert container["command"] == ["stateward"]
    assert spec.entrypoint == ("/opt/stateward/bin/stateward",)
    assert spec.cmd == ("operator",) and container["args"][0] == "operator"
    ports = {f"{port['containerPort']}/{port['protocol'].lower()}" for port in container["ports"]}
    config = spec.oci_config()
    assert config == {
        "Entrypoint": ["/opt/stateward/bin/stateward"],
        "Cmd": ["operator"],
        "Env": [path, "LANG=C.UTF-8"],
        "User": "65532:65532",
        "ExposedPorts": {port: {} for port in sorted(ports)},
    }
    assert spec.from_image == "base" and spec.prepare is not None and spec.hook is not None
    assert set(spec.packages) == {"python3", "python3-venv", "ca-certificates"}
    assert spec in catalog.IMAGES
    assert catalog.IMAGES.index(spec) > catalog.IMAGES.index(catalog.POSTGRES_15)
    assert "ExposedPorts" not in catalog.POSTGRES_15.oci_config()


def test_the_operator_image_follows_stateward_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = tmp_path / "checkout"
    (source / "src" / "stateward" / "runtime").mkdir(parents=True)
    (source / "pyproject.toml").write_text('[project]\nversion = "9.8.7"\n')
    module = source / "src" / "stateward" / "runtime" / "operator.py"
    module.write_text("print(1)\n")
    monkeypatch.setenv("STATEWARD_SOURCE_DIR", str(source))
    monkeypatch.setenv("STATEWARD_IMAGES_DIR", str(REPO_IMAGES))
    assert catalog.stateward_version() == "9.8.7", "the version of the checkout being packed"
    before = cache.input_hash(catalog.OPERATOR)
    base_before = cache.input_hash(catalog.BASE)
    assert cache.input_hash(catalog.OPERATOR) == before
    module.write_text("print(2)\n")
    assert cache.input_hash(catalog.OPERATOR) != before
    assert cache.input_hash(catalog.BASE) == base_before
    (source / "pyproject.toml").unlink()
    assert catalog.stateward_version() == stateward.__version__, "no checkout: the installed one"


def test_the_images_carry_the_operator_and_not_the_local_cluster() -> None:
    """The operator's image is built from ``src/stateward`` alone: the local cluster is the
    stateward-local distribution (``local/``), which no image carries."""
    files = catalog._package_files(rootfs.source_dir())
    assert "src/stateward/runtime/operator.py" in files
    assert not [name for name in files if "local" in name.split("/") or "stateward_local" in name]


def chroot_calls(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    spec: catalog.ImageSpec,
    *,
    sources: Path | None = None,
) -> tuple[list[list[str]], list[list[str]]]:
    """What ``spec``'s prepare step and hook run in the chroot (network faked), with its
    committed lock files (or those in ``sources``); each pip install finds the locks and
    the stateward tree where its argv says."""
    tree = tmp_path / "rootfs"
    (tree / "tmp").mkdir(parents=True)
    (tree / "usr" / "bin").mkdir(parents=True)
    for python in ("python3.11", "python3.13"):
        (tree / "usr" / "bin" / python).write_text("")
    seen: list[list[str]] = []

    def chroot(
        self: rootfs.Build, argv: list[str], *, what: str, env: dict[str, str] | None = None
    ) -> None:
        seen.append(list(argv))
        for arg in argv:
            if arg.startswith(catalog.BUILD_DIR):
                assert (tree / arg.lstrip("/")).exists(), arg
        if "--no-index" in argv:  # the project itself, from its tree
            project = tree / argv[-1].lstrip("/")
            assert (project / "pyproject.toml").is_file()
            assert (project / "src" / "stateward" / "runtime" / "operator.py").is_file()
            assert not (project / "src" / "stateward" / "local").exists()
            assert (project / "README.md").read_text().startswith("# Stateward\n")

    monkeypatch.setattr(catalog, "_pip_network", lambda _root: (["--cert", "/ca"], {}))
    monkeypatch.setattr(catalog, "chroot_session", lambda _build: contextlib.nullcontext())
    monkeypatch.setattr(rootfs.Build, "chroot", chroot)
    build = rootfs.Build(
        spec=spec,
        rootfs=tree,
        sources=sources or REPO_IMAGES / spec.name,
        log=tmp_path / "log",
        progress=lambda _: None,
    )
    assert spec.prepare is not None and spec.hook is not None
    spec.prepare(build)
    prepared = list(seen)
    seen.clear()
    spec.hook(build)
    assert not (tree / "tmp" / "stateward-build").exists(), "sources and locks are removed"
    return prepared, seen


PIP = ["/opt/stateward/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check"]
HASHED = [*PIP, "--require-hashes", "--no-deps", "--only-binary", ":all:"]
COMPILE = [
    "sh",
    "-c",
    "python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/stateward"
    " /usr/lib/python3*/ /usr/lib/python3/dist-packages >/dev/null || true",
]
"""Hash-based .pyc files: the packer zeroes mtimes, which would void timestamp-checked ones."""


def locked_install(suite: str, *, from_source: tuple[str, ...] = ()) -> list[list[str]]:
    """The venv, then pip: the build lock, the lock (hashes), stateward (no index, no
    dependencies), ``pip check``."""
    no_binary = [arg for name in from_source for arg in ("--no-binary", name)]
    isolation = ["--no-build-isolation", "--use-pep517"] if from_source else []
    return [
        ["python3", "-m", "venv", "/opt/stateward"],
        [*HASHED, "--cert", "/ca", "-r", f"/tmp/stateward-build/build-requirements-{suite}.txt"],
        [
            *HASHED, *no_binary, *isolation, "--cert", "/ca",
            "-r", f"/tmp/stateward-build/requirements-{suite}.txt",
        ],
        [*PIP, "--no-index", "--no-deps", "--no-build-isolation", "/tmp/stateward-build/stateward"],
        ["/opt/stateward/bin/pip", "check"],
    ]  # fmt: skip


def test_the_operator_image_has_its_user_and_a_smoke_tested_venv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prepared, installed = chroot_calls(monkeypatch, tmp_path, catalog.OPERATOR)
    assert prepared == [
        ["groupadd", "--system", "--gid", "65532", "nonroot"],
        [
            "useradd", "--system", "--uid", "65532", "--gid", "65532", "--no-create-home",
            "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
            "--comment", "stateward operator", "nonroot",
        ],
    ]  # fmt: skip
    assert installed == [
        *locked_install("bookworm"),
        COMPILE,
        ["/opt/stateward/bin/stateward", "--help"],
        ["/opt/stateward/bin/python", "-c", "import stateward.runtime.operator"],
    ]


@pytest.mark.parametrize(
    ("spec", "suite"),
    [(catalog.POSTGRES_15, "bookworm"), (catalog.POSTGRES_17, "trixie")],
    ids=["15-bookworm", "17-trixie"],
)
def test_the_instance_image_installs_from_its_suites_locks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spec: catalog.ImageSpec, suite: str
) -> None:
    prepared, installed = chroot_calls(monkeypatch, tmp_path, spec)
    assert prepared == [
        ["groupadd", "--system", "--gid", "999", "postgres"],
        [
            "useradd", "--system", "--uid", "999", "--gid", "999", "--no-create-home",
            "--home-dir", "/var/lib/postgresql", "--shell", "/bin/bash",
            "--comment", "PostgreSQL administrator", "postgres",
        ],
    ]  # fmt: skip
    upgrade_source = installed[:3] if spec is catalog.POSTGRES_17 else []  # 15's server
    assert [argv[:2] for argv in upgrade_source] == (
        [["apt-get", "install"], ["sh", "-c"], ["sh", "-c"]] if upgrade_source else []
    )
    assert installed[len(upgrade_source) :] == [
        *locked_install(suite, from_source=("ydiff",)),
        COMPILE,
        ["/opt/stateward/bin/patroni", "--version"],
        ["/opt/stateward/bin/stateward-instance", "version"],
    ]


def test_the_images_with_stateward_lock_what_they_take_from_pypi() -> None:
    locked = {spec.ref: spec.pip_lock for spec in catalog.IMAGES if spec.pip_lock is not None}
    assert locked == {
        catalog.POSTGRES_15.ref: piplock.Target(
            suite="bookworm",
            requirements=catalog.PATRONI_REQUIREMENTS,
            from_source=catalog.PATRONI_FROM_SOURCE,
        ),
        catalog.POSTGRES_17.ref: piplock.Target(
            suite="trixie",
            requirements=catalog.PATRONI_REQUIREMENTS,
            from_source=catalog.PATRONI_FROM_SOURCE,
        ),
        catalog.OPERATOR.ref: piplock.Target(suite="bookworm"),
    }
    for spec in (catalog.POSTGRES_15, catalog.POSTGRES_17, catalog.OPERATOR):
        base = cache._lookup(spec.from_image or "", catalog.IMAGES)
        assert spec.pip_lock is not None and spec.pip_lock.suite == base.debootstrap
        assert spec.source_files == spec.pip_lock.files
        assert spec.identity()["pip_lock"] == dataclasses.asdict(spec.pip_lock)
    assert "pip_lock" not in catalog.MARIADB_1011.identity()
    assert catalog.MARIADB_1011.source_files == () and catalog.PAUSE.source_files == ("pause.c",)


def test_the_committed_locks_are_current_and_complete() -> None:
    """What the build checks before it runs pip, and `stateward local lock --check`."""
    found = locks.lock_files(catalog.IMAGES)
    assert [lock.shown for lock in found] == [
        "images/postgres-instance/build-requirements-bookworm.txt",
        "images/postgres-instance/requirements-bookworm.txt",
        "images/postgres-instance/build-requirements-trixie.txt",
        "images/postgres-instance/requirements-trixie.txt",
        "images/stateward/build-requirements-bookworm.txt",
        "images/stateward/requirements-bookworm.txt",
    ]
    assert [problem for lock in found for problem in lock.problems()] == []
    with (REPO / "pyproject.toml").open("rb") as pyproject:
        project = tomllib.load(pyproject)
    for lock in found:
        pins = piplock.parse(lock.path.read_text()).pins
        wanted = (
            project["build-system"]["requires"]
            if lock.name.startswith("build-")
            else [*project["project"]["dependencies"], *lock.target.requirements]
        )
        for text in wanted:
            requirement = Requirement(text)
            pin = pins[piplock.normalize(requirement.name)]
            assert requirement.specifier.contains(pin.version, prereleases=True), (lock, pin)
        assert all(pin.hashes for pin in pins.values())
    [patroni_pin] = [r for r in catalog.PATRONI_REQUIREMENTS if r.startswith("patroni[")]
    for lock in found[1], found[3]:
        pins = piplock.parse(lock.path.read_text()).pins
        assert pins["patroni"].version == patroni_pin.split("==")[1]
        assert "ydiff" in pins and "psycopg-binary" in pins
    operator = piplock.parse(found[5].path.read_text()).pins
    assert "patroni" not in operator and "lightkube" in operator and "kopf" not in operator


def test_a_lock_that_no_longer_fits_its_inputs_stops_the_build_before_pip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sources = tmp_path / "sources"
    shutil.copytree(REPO_IMAGES / "stateward", sources)
    lock = sources / "requirements-bookworm.txt"
    lock.write_text(lock.read_text().replace("# input: lightkube>=1.0,<1.1\n", ""))
    with pytest.raises(LocalClusterError) as raised:
        chroot_calls(monkeypatch, tmp_path / "a", catalog.OPERATOR, sources=sources)
    message = str(raised.value)
    assert message.startswith(
        "image stateward: images/stateward/requirements-bookworm.txt: made from other inputs"
        " (+lightkube>=1.0,<1.1)"
    )
    assert message.endswith("run `make lock` (and commit the locks)") and "\n" not in message
    assert not (tmp_path / "a" / "rootfs" / "tmp" / "stateward-build").exists()

    lock.unlink()
    with pytest.raises(LocalClusterError, match=r"cannot read its pip lock .*run `make lock`"):
        chroot_calls(monkeypatch, tmp_path / "b", catalog.OPERATOR, sources=sources)

    shutil.copyfile(REPO_IMAGES / "stateward" / "requirements-bookworm.txt", lock)
    with (sources / "build-requirements-bookworm.txt").open("a") as build_lock:
        build_lock.write("six>=1\nseven\n")  # two problems: one named, the count of the rest
    with pytest.raises(LocalClusterError, match=r"is not a package pinned .* \(and 1 more\)"):
        chroot_calls(monkeypatch, tmp_path / "c", catalog.OPERATOR, sources=sources)


def test_locks_for_a_python_the_image_lacks_stop_the_build(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    (tree / "usr" / "bin").mkdir(parents=True)
    (tree / "usr" / "bin" / "python3.13").write_text("")
    build = rootfs.Build(
        spec=catalog.OPERATOR,
        rootfs=tree,
        sources=REPO_IMAGES / "stateward",
        log=tmp_path / "log",
        progress=lambda _: None,
    )
    with pytest.raises(LocalClusterError, match=r"locks are for Python 3\.11 \(Debian bookworm\)"):
        catalog._install_stateward(build, checks=[])
    assert sorted(p.name for p in tree.rglob("*")) == ["bin", "python3.13", "usr"]
    without = dataclasses.replace(catalog.OPERATOR, pip_lock=None)
    with pytest.raises(LocalClusterError, match="image stateward: no pip_lock to install from"):
        catalog._install_stateward(dataclasses.replace(build, spec=without), checks=[])


def test_the_input_hash_follows_the_lock_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "images"
    shutil.copytree(REPO_IMAGES, folder)
    monkeypatch.setenv("STATEWARD_IMAGES_DIR", str(folder))
    specs = (catalog.POSTGRES_15, catalog.POSTGRES_17, catalog.OPERATOR, catalog.MARIADB_1011)
    before = {spec.ref: cache.input_hash(spec) for spec in specs}
    for name, changed in (
        ("postgres-instance/requirements-bookworm.txt", catalog.POSTGRES_15),
        ("postgres-instance/build-requirements-trixie.txt", catalog.POSTGRES_17),
        ("stateward/requirements-bookworm.txt", catalog.OPERATOR),
    ):
        with (folder / name).open("a") as lock:
            lock.write("# relocked\n")
        after = {spec.ref: cache.input_hash(spec) for spec in specs}
        assert {ref for ref in after if after[ref] != before[ref]} == {changed.ref}, name
        before = after
    (folder / "stateward" / "build-requirements-bookworm.txt").unlink()
    with pytest.raises(
        LocalClusterError, match=r"image stateward: cannot read its source .*build-req"
    ):
        cache.input_hash(catalog.OPERATOR)


def test_the_stateward_project_is_a_copy_of_the_hashed_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = tmp_path / "checkout"
    (source / "src" / "stateward" / "sub").mkdir(parents=True)
    (source / "pyproject.toml").write_text("[project]\n")
    (source / "README.md").write_text("# the long one\n")
    (source / "src" / "stateward" / "sub" / "m.py").write_text("x = 1\n")
    (source / "src" / "stateward" / "notes.txt").write_text("not packaged")
    monkeypatch.setenv("STATEWARD_SOURCE_DIR", str(source))
    catalog._stateward_project(tmp_path / "copy")
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == [
        "README.md", "pyproject.toml", "src", "src/stateward", "src/stateward/sub",
        "src/stateward/sub/m.py",
    ]  # fmt: skip
    assert (tmp_path / "copy" / "README.md").read_text().startswith("# Stateward\n\nBuilt from")


FAKE_UV = """\
import json, os, pathlib, re, sys
args = sys.argv[1:]
output = pathlib.Path(args[args.index("--output-file") + 1])
source = pathlib.Path(args[-1])
with open(os.environ["FAKE_UV_LOG"], "a") as log:
    before = output.read_text() if output.exists() else None
    log.write(json.dumps({"args": args, "before": before, "inputs": source.read_text()}) + "\\n")
mode = os.environ.get("FAKE_UV_MODE", "ok")
if mode == "fail":
    print("error: no solution found\\n  because nothing fits", file=sys.stderr)
    sys.exit(2)
names = [re.match(r"[A-Za-z0-9._-]+", line).group(0) for line in source.read_text().split()]
names += [args[i + 1] for i, arg in enumerate(args) if arg == "--no-binary"]
digest = "" if mode == "nohash" else " \\\\\\n    --hash=sha256:" + "a" * 64
output.write_text("".join(f"{name.lower()}==1.0{digest}\\n" for name in names))
"""


@pytest.fixture
def lock_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A checkout with a small pyproject.toml, an images/ folder and a fake uv (its calls
    logged to ``uv.log``)."""
    root = tmp_path / "checkout"
    (root / "src" / "stateward").mkdir(parents=True)
    (root / "images").mkdir()
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=69", "wheel"]\n'
        '[project]\nversion = "1"\ndependencies = ["kopf>=1.45,<1.46", "PyYAML>=6"]\n'
    )
    (tmp_path / "uv.py").write_text(FAKE_UV)
    monkeypatch.setenv("STATEWARD_SOURCE_DIR", str(root))
    monkeypatch.delenv("STATEWARD_IMAGES_DIR", raising=False)
    monkeypatch.setenv("FAKE_UV_LOG", str(tmp_path / "uv.log"))
    return root


LOCKED = catalog.ImageSpec(
    name="db",
    tag="1",
    pip_lock=piplock.Target(
        suite="trixie", requirements=("patroni==4.1.5",), from_source=("ydiff",)
    ),
)


def uv_calls(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "uv.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_write_locks_resolves_each_lock_with_uv_and_writes_it_with_its_header(
    lock_checkout: Path, tmp_path: Path
) -> None:
    uv = [sys.executable, str(tmp_path / "uv.py")]
    messages: list[str] = []
    written = locks.write_locks(catalog=[LOCKED, catalog.PAUSE], uv=uv, progress=messages.append)
    folder = lock_checkout / "images" / "db"
    assert written == [folder / "build-requirements-trixie.txt", folder / "requirements-trixie.txt"]
    [build_call, lock_call] = uv_calls(tmp_path)
    assert build_call["args"] == piplock.compile_command(
        [],
        target=LOCKED.pip_lock or piplock.Target(suite="x"),
        source="requirements.in",
        output="build-requirements-trixie.txt",
    )
    assert build_call["inputs"] == "setuptools>=69\nwheel\n" and build_call["before"] is None
    assert lock_call["inputs"] == "kopf>=1.45,<1.46\nPyYAML>=6\npatroni==4.1.5\n"
    assert lock_call["args"][lock_call["args"].index("--no-binary") + 1] == "ydiff"
    lock = (folder / "requirements-trixie.txt").read_text()
    assert lock.startswith(
        "# What the db image's venv takes from PyPI (Python 3.13 of Debian trixie).\n"
    )
    assert "# from-source: ydiff\n# input: kopf>=1.45,<1.46\n" in lock
    assert lock.endswith("ydiff==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"), "uv's output"
    assert set(piplock.parse(lock).pins) == {"kopf", "pyyaml", "patroni", "ydiff"}
    build_lock = (folder / "build-requirements-trixie.txt").read_text()
    assert build_lock.startswith("# What builds stateward and ydiff in the db image")
    assert [p for lock_file in locks.lock_files([LOCKED]) for p in lock_file.problems()] == []
    assert messages[0].startswith(
        "Locking images/db/build-requirements-trixie.txt: uv pip compile --quiet"
    )
    assert "  images/db/requirements-trixie.txt: written, 4 packages" in messages
    assert not list(folder.glob("*.partial"))


def test_write_locks_keeps_the_locked_versions_unless_upgrading(
    lock_checkout: Path, tmp_path: Path
) -> None:
    uv = [sys.executable, str(tmp_path / "uv.py")]
    locks.write_locks(catalog=[LOCKED], uv=uv, progress=lambda _: None)
    folder = lock_checkout / "images" / "db"
    first = {path.name: path.read_text() for path in folder.iterdir()}
    messages: list[str] = []
    assert locks.write_locks(catalog=[LOCKED], uv=uv, progress=messages.append) == []
    assert "  images/db/requirements-trixie.txt: unchanged, 4 packages" in messages
    calls = uv_calls(tmp_path)[2:]
    assert [call["before"] for call in calls] == [
        first["build-requirements-trixie.txt"],
        first["requirements-trixie.txt"],
    ], "uv gets the locked versions as its preferences"
    assert all("--upgrade" not in call["args"] for call in calls)
    locks.write_locks(catalog=[LOCKED], uv=uv, upgrade=True, progress=lambda _: None)
    assert all("--upgrade" in call["args"] for call in uv_calls(tmp_path)[4:])

    (lock_checkout / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=69", "wheel"]\n'
        '[project]\nversion = "1"\ndependencies = ["kopf>=1.45,<1.46", "httpx"]\n'
    )
    [problem, *_] = locks.lock_files([LOCKED])[1].problems()
    assert problem == (
        "images/db/requirements-trixie.txt: made from other inputs (+httpx, -PyYAML>=6)"
    )
    written = locks.write_locks(catalog=[LOCKED], uv=uv, progress=lambda _: None)
    assert written == [folder / "requirements-trixie.txt"]
    assert "httpx==1.0" in written[0].read_text()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (
            "fail",
            r"uv pip compile for images/db/build-requirements-trixie.txt failed \(exit 2\):"
            r" error: no solution found because nothing fits$",
        ),
        (
            "nohash",
            r"uv pip compile gave images/db/build-requirements-trixie.txt that does not check:"
            r" line 12: setuptools has no --hash; line 13: wheel has no --hash$",
        ),
    ],
)
def test_write_locks_replaces_no_lock_when_uv_fails(
    lock_checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, message: str
) -> None:
    uv = [sys.executable, str(tmp_path / "uv.py")]
    locks.write_locks(catalog=[LOCKED], uv=uv, progress=lambda _: None)
    folder = lock_checkout / "images" / "db"
    before = {path.name: path.read_text() for path in folder.iterdir()}
    monkeypatch.setenv("FAKE_UV_MODE", mode)
    with pytest.raises(LocalClusterError, match=message):
        locks.write_locks(catalog=[LOCKED], uv=uv, upgrade=True, progress=lambda _: None)
    assert {path.name: path.read_text() for path in folder.iterdir()} == before


def test_uv_is_the_installed_module_or_else_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    found: dict[str, object] = {"uv": object()}
    monkeypatch.setattr(locks.importlib.util, "find_spec", lambda name: found.get(name))
    assert locks._uv() == [sys.executable, "-m", "uv"]
    found.clear()
    monkeypatch.setattr(locks.shutil, "which", lambda name: f"/usr/local/bin/{name}")
    assert locks._uv() == ["/usr/local/bin/uv"]
    monkeypatch.setattr(locks.shutil, "which", lambda name: None)
    with pytest.raises(
        LocalClusterError, match=r"locking needs uv: .* pip install 'uv>=0\.13,<0\.14'"
    ):
        locks._uv()
    with (REPO / "pyproject.toml").open("rb") as pyproject:
        assert (
            locks.UV_REQUIREMENT
            in tomllib.load(pyproject)["project"]["optional-dependencies"]["dev"]
        )


def test_the_lock_verb_writes_or_checks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stateward_local.cli import main

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(locks, "write_locks", lambda **kwargs: calls.append(kwargs) or [])
    assert main(["lock"]) == 0 and main(["lock", "--upgrade"]) == 0
    assert calls == [
        {"catalog": catalog.IMAGES, "upgrade": False},
        {"catalog": catalog.IMAGES, "upgrade": True},
    ]
    with pytest.raises(SystemExit):
        main(["lock", "--upgrade", "--check"])

    assert main(["lock", "--check"]) == 0
    assert capsys.readouterr().out == "the images' pip lock files are current\n"
    folder = tmp_path / "images"
    shutil.copytree(REPO_IMAGES, folder)
    monkeypatch.setenv("STATEWARD_IMAGES_DIR", str(folder))
    (folder / "stateward" / "build-requirements-bookworm.txt").unlink()
    lock = folder / "postgres-instance" / "requirements-trixie.txt"
    lock.write_text(lock.read_text().replace("# python: 3.13", "# python: 3.12"))
    assert main(["lock", "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "images/postgres-instance/requirements-trixie.txt: made for python 3.12, not 3.13",
        "images/stateward/build-requirements-bookworm.txt: missing",
        "stateward: run `make lock` (stateward local lock)",
    ]

    def failing(**kwargs: object) -> list[Path]:
        raise LocalClusterError("uv pip compile for x failed (exit 1): boom")

    monkeypatch.setattr(locks, "write_locks", failing)
    assert main(["lock"]) == 1
    assert capsys.readouterr().err == "stateward: uv pip compile for x failed (exit 1): boom\n"


def test_a_build_prunes_archives_of_the_same_image_unused_for_an_hour(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    spec = catalog.ImageSpec(name="fake", tag="1", hook=Recorder())
    folder = tmp_path / "cache" / "images"
    folder.mkdir(parents=True)
    stale, recent = folder / "fake-0123456789abcdef.tar", folder / "fake-fedcba9876543210.tar"
    other_image, other_file = folder / "fake-x-0123456789abcdef.tar", folder / "fake-notes.tar"
    for path in (stale, recent, other_image, other_file, stale.with_suffix(".log")):
        path.write_text("")
        os.utime(path, (1, 1))
    os.utime(recent, (time.time() - 60, time.time() - 60))
    [archive] = cache.ensure(["fake"], progress=lambda _: None, catalog=[spec])
    assert not stale.exists() and not stale.with_suffix(".log").exists()
    assert recent.exists() and other_image.exists() and other_file.exists()
    assert archive.path.is_file()
    os.utime(archive.path, (1, 1))
    cache.ensure(["fake"], progress=lambda _: None, catalog=[spec])
    assert archive.path.stat().st_mtime > time.time() - 60, "a cache hit marks the archive used"


def test_no_main_cluster_rewrites_only_that_setting(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "postgresql-common" / "createcluster.conf"
    catalog._no_main_cluster(conf)
    assert conf.read_text() == "create_main_cluster = false\n"
    conf.write_text("# comment\n#create_main_cluster = true\nssl = on\ncreate_main_cluster=true\n")
    catalog._no_main_cluster(conf)
    assert conf.read_text() == "# comment\nssl = on\ncreate_main_cluster = false\n"


def test_input_hash_covers_the_packer_version_and_the_base_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = catalog.ImageSpec(name="b", tag="1", debootstrap="bookworm")
    child = catalog.ImageSpec(name="c", tag="1", from_image="b", packages=("postgresql-15",))
    before = cache.input_hash(child, [base, child])
    base_changed = dataclasses.replace(base, packages=("curl",))
    assert cache.input_hash(child, [base_changed, child]) != before
    monkeypatch.setattr(cache, "PACKER_VERSION", "next")
    assert cache.input_hash(child, [base, child]) != before
    with pytest.raises(LocalClusterError, match="unknown image 'b'"):
        cache.input_hash(child, [child])


class Recorder:
    """A hook that writes one file and counts its calls."""

    def __init__(self, content: bytes = b"hello\n") -> None:
        self.calls = 0
        self.content = content

    def __call__(self, build: rootfs.Build) -> None:
        self.calls += 1
        (build.rootfs / "hello").write_bytes(self.content)
        (build.rootfs / "var" / "log").mkdir(parents=True)
        (build.rootfs / "var" / "log" / "build.log").write_text("tidied away")


def test_ensure_builds_once_then_hits_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    hook = Recorder()
    spec = catalog.ImageSpec(name="fake", tag="1", hook=hook, cmd=("/hello",))
    messages: list[str] = []
    [archive] = cache.ensure(["fake"], progress=messages.append, catalog=[spec])
    assert hook.calls == 1 and archive.ref == "localhost/stateward/fake:1"
    assert archive.path == tmp_path / "cache" / "images" / f"fake-{cache.input_hash(spec)}.tar"
    assert any("Building image localhost/stateward/fake:1" in m for m in messages)
    assert any(m.startswith("Built localhost/stateward/fake:1 in ") for m in messages)
    leftovers = [p.name for p in archive.path.parent.iterdir()]
    assert not [name for name in leftovers if name.endswith((".partial", ".work", ".layer"))]
    names = [m.name for m in layer_members(archive.path)]
    assert names == ["hello", "var", "var/log"], "the hook's log file was tidied away"

    messages.clear()
    started = time.monotonic()
    [again] = cache.ensure(None, progress=messages.append, catalog=[spec])
    assert time.monotonic() - started < 0.5
    assert again == archive and hook.calls == 1 and messages == []


def test_a_failed_build_leaves_no_archive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))

    def broken(build: rootfs.Build) -> None:
        (build.rootfs / "half").write_text("x")
        build.run(["sh", "-c", "echo first; echo the reason >&2; exit 3"], what="a step")

    spec = catalog.ImageSpec(name="broken", tag="1", hook=broken)
    with pytest.raises(LocalClusterError) as raised:
        cache.ensure(progress=lambda _: None, catalog=[spec])
    message = str(raised.value)
    assert "\n" not in message
    assert "broken: a step failed (exit 3): the reason (log: " in message
    assert [p.name for p in (tmp_path / "cache" / "images").iterdir()] != []
    assert not list((tmp_path / "cache" / "images").glob("*.tar*"))
    log = next((tmp_path / "cache" / "images").glob("broken-*.log")).read_text()
    assert "first" in log and "the reason" in log


def test_an_image_can_start_from_another(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    parent = catalog.ImageSpec(name="parent", tag="1", hook=Recorder())

    def add(build: rootfs.Build) -> None:
        assert (build.rootfs / "hello").read_bytes() == b"hello\n"
        (build.rootfs / "child").write_text("mine")

    child = catalog.ImageSpec(name="child", tag="1", from_image="parent", hook=add)
    [archive] = cache.ensure(["child"], progress=lambda _: None, catalog=[parent, child])
    assert [m.name for m in layer_members(archive.path)] == ["child", "hello", "var", "var/log"]
    assert cache.archive_path(parent, [parent, child]).is_file(), "the parent was built first"


def test_images_sharing_a_name_are_told_apart_by_tag_or_ref(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    old, new = (catalog.ImageSpec(name="os", tag=t, hook=Recorder(t.encode())) for t in "12")

    def add(build: rootfs.Build) -> None:
        (build.rootfs / "child").write_bytes((build.rootfs / "hello").read_bytes())

    on_old, on_new = (
        catalog.ImageSpec(name="app", tag=f"a{t}", from_image=f"os:{t}", hook=add) for t in "12"
    )
    known = [old, on_old, new, on_new]
    assert cache._lookup("os", known) is old, "a bare name: the first of that name"
    assert cache._lookup("os:2", known) is new
    assert cache._lookup("localhost/stateward/os:2", known) is new
    assert cache._select("app", known) == [on_old, on_new]
    with pytest.raises(LocalClusterError, match=r"unknown image 'os:3' \(known: os:1, app:a1"):
        cache._lookup("os:3", known)
    assert cache.input_hash(on_old, known) != cache.input_hash(on_new, known)

    built = cache.ensure(
        ["app:a2", "localhost/stateward/app:a2"], progress=lambda _: None, catalog=known
    )
    assert [archive.ref for archive in built] == ["localhost/stateward/app:a2"]
    assert [m.name for m in layer_members(built[0].path)] == ["child", "hello", "var", "var/log"]
    folder = tmp_path / "cache" / "images"
    assert sorted(p.name for p in folder.glob("*.tar")) == sorted(
        [cache.archive_path(new, known).name, built[0].path.name]
    ), "only os:2 was needed"
    refs = [
        archive.ref for archive in cache.ensure(["app"], progress=lambda _: None, catalog=known)
    ]
    assert refs == ["localhost/stateward/app:a1", "localhost/stateward/app:a2"]
    assert [a.ref for a in cache.ensure(None, progress=lambda _: None, catalog=known)] == [
        spec.ref for spec in known
    ]


def test_pruning_keeps_the_archives_of_other_tags_of_the_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    one, two = (catalog.ImageSpec(name="os", tag=t, hook=Recorder(t.encode())) for t in "12")
    [first] = cache.ensure(["os:1"], progress=lambda _: None, catalog=[one, two])
    gone = catalog.ImageSpec(name="os", tag="0", hook=Recorder(b"0"))
    [dropped] = cache.ensure(["os"], progress=lambda _: None, catalog=[gone])
    superseded = first.path.with_name("os-0123456789abcdef.tar")
    shutil.copyfile(first.path, superseded)  # os:1 of other inputs
    for path in (first.path, dropped.path, superseded):
        os.utime(path, (1, 1))
    assert oci._archive_ref(first.path) == one.ref
    assert oci._archive_ref(tmp_path) is None
    [second] = cache.ensure(["os:2"], progress=lambda _: None, catalog=[one, two])
    assert second.path.is_file() and first.path.is_file(), "os:1 is another image"
    assert first.path.with_suffix(".log").is_file()
    assert not dropped.path.exists(), "os:0 is in the catalog no more"
    assert superseded.exists(), "os:1's to prune when os:1 is built, not os:2"


def test_package_step_writes_policy_rc_d_and_restores(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tree = tmp_path / "rootfs"
    (tree / "usr" / "sbin").mkdir(parents=True)
    (tree / "etc").mkdir()
    (tree / "etc" / "resolv.conf").write_text("")
    seen: list[tuple[list[str], bool]] = []

    def chroot(self: rootfs.Build, argv: list[str], *, what: str) -> None:
        policy = tree / "usr" / "sbin" / "policy-rc.d"
        exits_101 = policy.read_text().strip().endswith("exit 101")
        seen.append((argv, exits_101 and os.access(policy, os.X_OK)))
        assert (tree / "etc" / "resolv.conf").read_bytes() == Path("/etc/resolv.conf").read_bytes()

    monkeypatch.setattr(rootfs.Build, "chroot", chroot)
    monkeypatch.setattr(rootfs, "chroot_mounts", lambda _root: contextlib.nullcontext())
    spec = catalog.ImageSpec(name="pg", tag="1", packages=("postgresql-15", "patroni"))
    build = rootfs.Build(
        spec=spec, rootfs=tree, sources=tmp_path, log=tmp_path / "log", progress=lambda _: None
    )
    rootfs._install_packages(build, spec.packages)
    assert [argv for argv, _ in seen] == [
        ["apt-get", "update"],
        ["apt-get", "install", "--yes", "--no-install-recommends", "postgresql-15", "patroni"],
        ["apt-get", "clean"],
    ]
    assert all(ok for _, ok in seen)
    assert not (tree / "usr" / "sbin" / "policy-rc.d").exists()
    assert (tree / "etc" / "resolv.conf").read_text() == ""


@pytest.mark.host
@pytest.mark.skipif(not IS_ROOT, reason="mounting needs root")
def test_chroot_mounts_are_always_unmounted(tmp_path: Path) -> None:
    tree = tmp_path / "rootfs"
    tree.mkdir()
    seen: list[bool] = []

    def failing_step() -> None:
        with rootfs.chroot_mounts(tree):
            seen.append((tree / "proc" / "self").exists() and (tree / "dev" / "null").exists())
            seen.append(len(rootfs._mounts_below(tree)) == 2)
            raise RuntimeError("a failing step")

    with pytest.raises(RuntimeError):
        failing_step()
    assert seen == [True, True]
    assert rootfs._mounts_below(tree) == []
    assert list((tree / "dev").iterdir()) == [] and list((tree / "proc").iterdir()) == []


def test_tidy_keeps_directories_and_drops_caches(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    for folder in (
        "var/log/apt",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives",
        "dev/pts",
        "tmp",
        "etc",
    ):
        (root / folder).mkdir(parents=True)
    for name in (
        "var/log/apt/history.log",
        "var/log/dpkg.log",
        "var/lib/apt/lists/x_Packages",
        "var/cache/apt/pkgcache.bin",
        "var/cache/apt/archives/a.deb",
        "tmp/junk",
    ):
        (root / name).write_text("x")
    (root / "dev" / "fd").symlink_to("/proc/self/fd")
    (root / "etc" / "resolv.conf").write_text("nameserver 10.0.0.1\n")
    (root / "etc" / "resolv.conf").chmod(0o755)  # as copied from this host
    rootfs._tidy(root)
    remaining = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert remaining == [
        "dev",
        "etc",
        "etc/resolv.conf",
        "tmp",
        "var",
        "var/cache",
        "var/cache/apt",
        "var/cache/apt/archives",
        "var/lib",
        "var/lib/apt",
        "var/lib/apt/lists",
        "var/lib/apt/lists/partial",
        "var/log",
        "var/log/apt",
    ]
    assert (root / "etc" / "resolv.conf").read_text() == ""
    assert stat.S_IMODE((root / "etc" / "resolv.conf").stat().st_mode) == 0o644
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777


DIGEST = "sha256:" + "ab" * 32
BY_DIGEST = f"localhost/stateward/test@{DIGEST}"


def write_archive(path: Path) -> Path:
    """An archive with just its index.json, naming one manifest by ``DIGEST``."""
    index = json.dumps({"manifests": [{"digest": DIGEST}]}).encode()
    with tarfile.open(path, "w") as archive:
        member = tarfile.TarInfo("index.json")
        member.size = len(index)
        archive.addfile(member, io.BytesIO(index))
    return path


def write_ctr(
    path: Path, *, import_code: int = 0, listed: str = f"{REF} {BY_DIGEST}", stderr: str = ""
) -> Path:
    path.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{path}.calls"\n'
        'case "$*" in\n'
        f'  *"images import"*) echo "{stderr}" >&2; exit {import_code};;\n'
        f'  *"images list"*) echo "{listed}";;\n'
        "esac\n"
    )
    path.chmod(0o755)
    return path


def test_import_into_runs_ctr_with_unpack_and_checks_the_name(tmp_path: Path) -> None:
    spec = catalog.ImageSpec(name="test", tag="1")
    archive = catalog.Archive(spec=spec, path=write_archive(tmp_path / "test.tar"), ref=REF)
    ctr = write_ctr(tmp_path / "ctr")
    oci.import_into(archive, ctr=ctr, address="/run/node-1/containerd.sock")
    calls = Path(f"{ctr}.calls").read_text().splitlines()
    assert calls[0] == (
        "--address /run/node-1/containerd.sock --namespace k8s.io images import"
        " --platform linux/amd64 --snapshotter overlayfs"
        f" --label io.cri-containerd.pinned=pinned {tmp_path / 'test.tar'}"
    )
    assert "--no-unpack" not in calls[0] and "--base-name" not in calls[0]
    # Named by its manifest's digest too, as a pull from a registry names it: a pod pinned
    # to REPOSITORY:TAG@DIGEST finds it.
    assert calls[1] == (
        "--address /run/node-1/containerd.sock --namespace k8s.io images tag --local --force"
        f" {REF} {BY_DIGEST}"
    )

    unnamed = write_ctr(tmp_path / "ctr2", listed="other:1")
    with pytest.raises(LocalClusterError, match="containerd has no image named"):
        oci.import_into(archive, ctr=unnamed, address="a.sock")
    untagged = write_ctr(tmp_path / "ctr5", listed=REF)
    with pytest.raises(LocalClusterError, match="does not list that name"):
        oci.import_into(archive, ctr=untagged, address="a.sock")
    refused = write_ctr(
        tmp_path / "ctr3", import_code=1, stderr="ctr: failed to dial: connection refused"
    )
    with pytest.raises(LocalClusterError, match=r"cannot reach containerd at a\.sock") as raised:
        oci.import_into(archive, ctr=refused, address="a.sock")
    assert "\n" not in str(raised.value)
    broken = write_ctr(tmp_path / "ctr4", import_code=1, stderr="ctr: unexpected media type")
    with pytest.raises(LocalClusterError, match=r"import of .* failed: ctr: unexpected media"):
        oci.import_into(archive, ctr=broken, address="a.sock")
    with pytest.raises(LocalClusterError, match="ctr not found"):
        oci.import_into(archive, ctr=tmp_path / "missing", address="a.sock")


def has_static_gcc() -> bool:
    gcc = shutil.which("gcc")
    if gcc is None:
        return False
    found = subprocess.run([gcc, "-print-file-name=libc.a"], capture_output=True, text=True)
    return Path(found.stdout.strip()).is_absolute()


@pytest.mark.skipif(not has_static_gcc(), reason="needs gcc and libc6-dev")
def test_the_pause_image_holds_a_static_pause_that_exits_0_on_sigterm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    [archive] = cache.ensure(["pause"], progress=lambda _: None)
    [member] = layer_members(archive.path)
    assert member.name == "pause" and member.mode == 0o755 and member.size > 100_000
    files = read_archive(archive.path)
    index = json.loads(files["index.json"])
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == catalog.PAUSE_REF
    extracted = tmp_path / "extracted"
    extracted.mkdir()
    subprocess.run(["tar", "-xf", str(archive.path), "-C", str(extracted)], check=True)
    manifest = json.loads(files["blobs/sha256/" + index["manifests"][0]["digest"][7:]])
    layer = extracted / "blobs" / "sha256" / manifest["layers"][0]["digest"][7:]
    subprocess.run(["tar", "-xzf", str(layer), "-C", str(extracted)], check=True)
    pause = extracted / "pause"
    version = subprocess.run([str(pause), "-v"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == "pause 3.10-stateward1"
    process = subprocess.Popen([str(pause)], stderr=subprocess.DEVNULL)
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=5) == 0


def test_the_17_image_carries_15s_server_from_15s_own_suite() -> None:
    """pg_upgrade needs the old server beside the new one: every image that upgrades names
    a major with an image of its own, from the suite that image is built from."""
    assert set(catalog.UPGRADE_SOURCES) == {17}
    for major, source in catalog.UPGRADE_SOURCES.items():
        assert source.major < major and source.major in catalog.INSTANCE_REFS
        old_image = {15: catalog.POSTGRES_15, 17: catalog.POSTGRES_17}[source.major]
        base = cache._lookup(old_image.from_image or "", catalog.IMAGES)
        assert base.debootstrap == source.suite


@pytest.mark.parametrize(
    "script", [catalog._UPGRADE_SOURCE_SCRIPT, catalog._UPGRADE_CHECK_SCRIPT], ids=["add", "check"]
)
def test_the_upgrade_scripts_are_valid_shell(script: str) -> None:
    result = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_adding_the_upgrade_source_installs_unpacks_then_checks_the_pair(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tree = tmp_path / "rootfs"
    (tree / "usr/share/keyrings").mkdir(parents=True)
    (tree / "usr/share/keyrings/debian-archive-keyring.pgp").write_bytes(b"keys")  # trixie's
    calls: list[list[str]] = []
    monkeypatch.setattr(catalog, "chroot_session", lambda _build: contextlib.nullcontext())
    monkeypatch.setattr(
        rootfs.Build, "chroot", lambda _self, argv, *, what, env=None: calls.append(list(argv))
    )
    build = rootfs.Build(
        spec=catalog.POSTGRES_17, rootfs=tree, sources=tmp_path, log=tmp_path / "log",
        progress=lambda _: None,
    )  # fmt: skip
    catalog._add_upgrade_source(build, catalog.UPGRADE_SOURCES[17])
    install, add, check = calls
    assert install == ["apt-get", "install", "--yes", "--no-install-recommends", "libgnutls30t64"]
    assert add[:3] == ["sh", "-c", catalog._UPGRADE_SOURCE_SCRIPT]
    assert add[3:] == [
        "sh", "15", "bookworm", "/usr/share/keyrings/debian-archive-keyring.pgp",
        "http://deb.debian.org/debian", "http://deb.debian.org/debian-security",
        "libicu72", "libldap-2.5-0",
    ]  # fmt: skip
    assert check == ["sh", "-c", catalog._UPGRADE_CHECK_SCRIPT, "sh", "15", "17"]
    assert "--check" in catalog._UPGRADE_CHECK_SCRIPT and "jit=off" in catalog._UPGRADE_CHECK_SCRIPT
