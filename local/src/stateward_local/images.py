"""Container images for real nodes, built on this machine without a registry or Docker.

Each image is an :class:`ImageSpec`: how its root filesystem is made (debootstrap a Debian
suite, or start from another image's layer; then Debian packages installed in a chroot; then
a build hook) and the OCI config (entrypoint, cmd, env, user, workdir). The rootfs is packed
into an OCI image-layout tar archive with one deterministic layer (:func:`pack`), which
``ctr images import`` names by its ``io.containerd.image.name`` annotation.

Archives are cached as ``$STATEWARD_CACHE_DIR/images/<name>-<inputhash>.tar``, where the input
hash covers the spec, the files it reads from ``images/<name>/`` (its sources and pip lock
files) and :data:`PACKER_VERSION`: a cache hit costs one small file read and a stat. Builds
write a ``.partial`` file and rename it into place, so an archive that exists is complete.
``images/*/Containerfile`` describe the same images for docker or buildah.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal

import stateward
from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward_local import binaries, errors, piplock

# Bump when the packer or the generic build steps change what an archive holds.
PACKER_VERSION = "1"
REPOSITORY = "localhost/stateward"
# The archive this machine's apt uses (/etc/apt/sources.list.d/debian.sources); the
# environment variable points debootstrap elsewhere without changing any image's identity.
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HEARTBEAT_SECONDS = 30.0
PRUNE_AFTER_SECONDS = 3600.0
"""Archives of an image that other inputs produced go when a build of it finds them unused
for this long (an image built from the stateward sources gets a new archive per change)."""

Progress = Callable[[str], None]
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


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Image definitions


@dataclasses.dataclass(frozen=True)
class Build:
    """What a build hook works with: the rootfs being made and the image's source folder."""

    spec: ImageSpec
    rootfs: Path
    sources: Path
    log: Path
    progress: Progress

    def run(self, argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None) -> None:
        """Run a command, its output appended to the build log; raise one line on failure."""
        _run_logged(
            argv, log=self.log, label=f"{self.spec.name}: {what}", progress=self.progress, env=env
        )

    def chroot(
        self, argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None
    ) -> None:
        """Run a command inside the rootfs (call within :func:`chroot_mounts`); ``env`` adds
        to a fixed, minimal environment."""
        environment = {
            "PATH": DEFAULT_PATH.removeprefix("PATH="),
            "HOME": "/root",
            "LC_ALL": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive",
            **(env or {}),
        }
        self.run(["chroot", str(self.rootfs), *argv], what=what, env=environment)


Hook = Callable[[Build], None]
Inputs = Callable[[], Mapping[str, str]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageSpec:
    """One image: how its rootfs is made, in order, and its OCI runtime config.

    Rootfs steps: ``debootstrap`` a Debian suite (minbase) *or* start from ``from_image``'s
    layer (``name:tag`` when several images share the name, as ``base`` does; a bare name
    means the first of them) or from nothing; run ``prepare`` (what must exist before the
    packages install, such as users with fixed ids); install ``packages`` with apt in a
    chroot; run ``hook``; tidy (apt caches and lists, /var/log files, /dev entries).
    ``sources`` are files under ``images/<name>/`` the hook reads; their content is part of
    the input hash, and so are the digests ``inputs`` returns (files elsewhere the hook
    reads, path -> sha256). A hook is identified by its qualified name: change the tag when
    its behaviour changes, or let ``inputs`` cover the hook's own source. The ref is
    ``repository/name:tag``. ``pip_lock`` is what a hook that fills a Python venv installs
    from PyPI: its lock files under ``images/<name>/`` count as sources.
    """

    name: str
    tag: str
    repository: str = REPOSITORY
    debootstrap: str | None = None
    from_image: str | None = None
    prepare: Hook | None = None
    packages: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    inputs: Inputs | None = None
    hook: Hook | None = None
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = (DEFAULT_PATH,)
    user: str = ""
    workdir: str = ""
    ports: tuple[str, ...] = ()
    """Exposed ports, ``PORT/PROTO``: documentation in the OCI config, as EXPOSE is."""
    pip_lock: piplock.Target | None = None
    on_nodes: bool = True
    """Imported into every real node; False for build stages only other images start from.
    (Not part of the identity: where an image goes does not change what it contains.)"""

    def __post_init__(self) -> None:
        if self.tag == "latest" or not self.tag:
            raise ValueError(f"image {self.name}: use a fixed tag, not {self.tag!r}")
        if self.debootstrap and self.from_image:
            raise ValueError(f"image {self.name}: debootstrap or from_image, not both")

    @property
    def ref(self) -> str:
        return f"{self.repository}/{self.name}:{self.tag}"

    @property
    def source_files(self) -> tuple[str, ...]:
        """Every file under ``images/<name>/`` the build reads: ``sources``, then the lock files."""
        return (*self.sources, *(self.pip_lock.files if self.pip_lock is not None else ()))

    def oci_config(self) -> dict[str, object]:
        """The ``config`` object of the OCI image config (empty fields left out)."""
        fields: dict[str, object] = {
            "Entrypoint": list(self.entrypoint),
            "Cmd": list(self.cmd),
            "Env": list(self.env),
            "User": self.user,
            "WorkingDir": self.workdir,
            "ExposedPorts": {port: {} for port in self.ports},
        }
        return {key: value for key, value in fields.items() if value}

    def identity(self) -> dict[str, object]:
        """Everything about the spec that decides the archive's content (for the input hash)."""
        hook = self.hook
        identity: dict[str, object] = {
            "name": self.name,
            "tag": self.tag,
            "debootstrap": self.debootstrap,
            "from_image": self.from_image,
            "packages": list(self.packages),
            "sources": list(self.sources),
            "hook": None if hook is None else _qualified_name(hook),
            "config": self.oci_config(),
        }
        # Only when set, so that images without them keep their hashes (and cached archives).
        if self.repository != REPOSITORY:
            identity["repository"] = self.repository
        if self.prepare is not None:
            identity["prepare"] = _qualified_name(self.prepare)
        if self.pip_lock is not None:
            identity["pip_lock"] = dataclasses.asdict(self.pip_lock)
        return identity


def _qualified_name(hook: Hook) -> str:
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    return f"{hook.__module__}.{name}"


def _compile_pause(build: Build) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise errors.LocalClusterError(
            "gcc is needed to build the pause image: run `apt-get install gcc libc6-dev`"
        )
    libc = subprocess.run([gcc, "-print-file-name=libc.a"], capture_output=True, text=True)
    if not Path(libc.stdout.strip()).is_absolute():
        raise errors.LocalClusterError(
            "the static C library is missing (pause is linked statically):"
            " run `apt-get install libc6-dev`"
        )
    target = build.rootfs / "pause"
    build.run(
        [gcc, "-Os", "-static", "-s", "-o", str(target), str(build.sources / "pause.c")],
        what="gcc -Os -static pause.c",
    )
    target.chmod(0o755)


def _configure_debian(build: Build) -> None:
    """Apt sources as in Debian's own images (updates and security too), deb822 style, for
    the debootstrapped suite. The keyring is ``.pgp`` where the suite's keyring package has
    it (trixie on, ``.gpg`` a compatibility link there), else ``.gpg`` (bookworm)."""
    suite = build.spec.debootstrap or "bookworm"
    keyrings = "/usr/share/keyrings"
    keyring = f"{keyrings}/debian-archive-keyring.pgp"
    if not (build.rootfs / keyring.lstrip("/")).is_file():
        keyring = f"{keyrings}/debian-archive-keyring.gpg"
    apt = build.rootfs / "etc/apt"
    (apt / "sources.list").unlink(missing_ok=True)
    (apt / "sources.list.d").mkdir(parents=True, exist_ok=True)
    (apt / "sources.list.d/debian.sources").write_text(
        f"Types: deb\nURIs: {DEBIAN_MIRROR}\nSuites: {suite} {suite}-updates\n"
        f"Components: main\nSigned-By: {keyring}\n\n"
        f"Types: deb\nURIs: {DEBIAN_SECURITY_MIRROR}\nSuites: {suite}-security\n"
        f"Components: main\nSigned-By: {keyring}\n"
    )


PAUSE = ImageSpec(
    name="pause",
    tag="3.10-stateward1",
    sources=("pause.c",),
    hook=_compile_pause,
    entrypoint=("/pause",),
    env=(),
    user="65535:65535",
)


def _base_spec(suite: str, revision: int = 1) -> ImageSpec:
    """``base:SUITE-REVISION``: Debian ``suite`` minbase, apt sources for the suite, its
    updates and its security archive (:func:`_configure_debian`, which reads the suite)."""
    return ImageSpec(
        name="base",
        tag=f"{suite}-{revision}",
        debootstrap=suite,
        hook=_configure_debian,
        cmd=("/bin/bash",),
        env=(DEFAULT_PATH, "LANG=C.UTF-8"),
    )


BASE = _base_spec("bookworm")  # Debian 12: PostgreSQL 15, Python 3.11
# Debian 13: PostgreSQL 17, Python 3.13. Only a build stage: no pod runs it.
BASE_TRIXIE = dataclasses.replace(_base_spec("trixie"), on_nodes=False)

# --------------------------------------------------------------------------------------------
# Images with the stateward package: the PostgreSQL instance image (PostgreSQL, pgBackRest,
# Patroni and stateward-instance) and the operator's own image

INSTANCE_UID = 999
"""uid and gid of ``postgres`` in the instance image: ``specs.pods.POSTGRES_UID``, which the
pods run as (as in the official postgres image). Created before the packages install, which
would otherwise allocate the next free system id (about 100)."""
STATEWARD_VENV = "/opt/stateward"
"""The venv with the stateward wheel (and, in the instance image, Patroni) in both images."""
BUILD_CA_BUNDLE = "/tmp/stateward-build-ca.crt"  # noqa: S108 - inside the rootfs, build only
BUILD_DIR = "/tmp/stateward-build"  # noqa: S108 - inside the rootfs, build only
"""Where the lock files and the stateward source tree are during an image build."""
PATRONI_REQUIREMENTS = ("patroni[kubernetes,psycopg3]==4.1.5", "psycopg[binary]==3.3.9")
"""From PyPI into the instance image's venv, with stateward (Debian's Patroni is 3.0), by way
of the image's lock files (``make lock``)."""
PATRONI_FROM_SOURCE = ("ydiff",)
"""Patroni 4.1 requires ydiff<1.5, which PyPI has only as source: built in the image by the
build lock's setuptools."""
_PACKAGE_SUFFIXES = (".py", ".pyi", ".typed", ".yaml")
"""What the stateward wheel takes from ``src/stateward`` (modules and package data)."""


def source_dir() -> Path:
    """The checkout the images' stateward wheel is built from (``pyproject.toml``,
    ``src/stateward``); ``$STATEWARD_SOURCE_DIR`` overrides. The checkout this module lives
    in, by default: an installed wheel has none."""
    configured = os.environ.get("STATEWARD_SOURCE_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[3]


_NO_CHECKOUT = (
    "the local images are built from a stateward source checkout (pyproject.toml, src/,"
    " images/) and {root} is none: run from a checkout or set STATEWARD_SOURCE_DIR to one"
)


def _package_files(root: Path) -> list[str]:
    """Paths, relative to ``root``, of what builds the stateward wheel, sorted."""
    package = root / "src" / "stateward"
    if not (root / "pyproject.toml").is_file() or not package.is_dir():
        raise errors.LocalClusterError(_NO_CHECKOUT.format(root=root))
    found = ["pyproject.toml"]
    for parent, folders, names in os.walk(package):
        folders[:] = [name for name in folders if name != "__pycache__"]
        found.extend(
            os.path.relpath(os.path.join(parent, name), root)
            for name in names
            if name.endswith(_PACKAGE_SUFFIXES)
        )
    return sorted(found)


def stateward_digest() -> Mapping[str, str]:
    """One sha256 over the stateward sources (names and content): a code change, including
    to this builder, rebuilds the images that hold stateward. About 100 small files,
    milliseconds."""
    root = source_dir()
    digest = hashlib.sha256()
    for relative in _package_files(root):
        content = (root / relative).read_bytes()
        digest.update(f"{relative}\0{len(content)}\0".encode())
        digest.update(content)
    return {"stateward": digest.hexdigest()}


def _instance_major(spec: ImageSpec) -> int:
    return int(spec.tag.split(".")[0])  # the tag is the PostgreSQL version


def _no_main_cluster(conf: Path) -> None:
    """``create_main_cluster = false`` in postgresql-common's createcluster.conf."""
    lines = conf.read_text().splitlines() if conf.is_file() else []
    kept = [
        line
        for line in lines
        if not line.lstrip("#").strip().replace(" ", "").startswith("create_main_cluster=")
    ]
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("\n".join([*kept, "create_main_cluster = false"]) + "\n")
    conf.chmod(0o644)


def _system_user(
    build: Build, name: str, uid: int, *, home: str, login_shell: str, comment: str
) -> None:
    """A system user and its group, both with id ``uid``, no home directory made."""
    ids = str(uid)
    build.chroot(["groupadd", "--system", "--gid", ids, name], what=f"groupadd {name}")
    build.chroot(
        [
            "useradd", "--system", "--uid", ids, "--gid", ids, "--no-create-home",
            "--home-dir", home, "--shell", login_shell, "--comment", comment, name,
        ],
        what=f"useradd {name}",
    )  # fmt: skip


def _prepare_instance(build: Build) -> None:
    """Before apt: the postgres user with the pods' uid, and no Debian cluster at install
    (Patroni runs initdb itself). ucf keeps this createcluster.conf (its default)."""
    _system_user(
        build,
        "postgres",
        INSTANCE_UID,
        home="/var/lib/postgresql",
        login_shell="/bin/bash",
        comment="PostgreSQL administrator",
    )
    _no_main_cluster(build.rootfs / "etc/postgresql-common/createcluster.conf")


def _stateward_project(dest: Path) -> None:
    """A copy of exactly the hashed files of the stateward sources at ``dest``, which pip in
    the image builds (the repository gets no build/ or egg-info; README.md, which only feeds
    the wheel's description, is a stub so that editing it rebuilds nothing)."""
    root = source_dir()
    for relative in _package_files(root):
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / relative, dest / relative)
    (dest / "README.md").write_text(
        "# Stateward\n\nBuilt from a source checkout into a local image.\n"
    )


def _pip_network(rootfs: Path) -> tuple[list[str], dict[str, str]]:
    """pip options and environment that reach PyPI the way the host does: its CA bundle
    (a TLS-intercepting proxy's CA is in the host's, not the image's) copied to the
    rootfs's /tmp for the build only, and its proxy variables."""
    options: list[str] = []
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            shutil.copyfile(candidate, rootfs / BUILD_CA_BUNDLE.lstrip("/"))
            options = ["--cert", BUILD_CA_BUNDLE]
            break
    proxies = {
        name: value
        for name, value in os.environ.items()
        if name.lower() in ("http_proxy", "https_proxy", "no_proxy", "pip_index_url")
    }
    return options, proxies


def _install_stateward(build: Build, *, checks: Sequence[Sequence[str]]) -> None:
    """The venv at :data:`STATEWARD_VENV` (Debian's python3) filled from the image's pip lock
    files (:attr:`ImageSpec.pip_lock`), PyPI reached the way the host reaches it: the build
    lock, then the lock in hash-checking mode, then stateward built from this checkout's
    sources with no index and no dependencies, ``pip check``; then each of ``checks`` run in
    the chroot as smoke tests. A lock that does not match its inputs stops the build before
    anything runs. The sources, the locks and the build's CA bundle are gone afterwards."""
    started = time.monotonic()
    spec, rootfs, venv = build.spec, build.rootfs, STATEWARD_VENV
    target = spec.pip_lock
    if target is None:
        raise errors.LocalClusterError(f"image {spec.name}: no pip_lock to install from")
    locks = lock_files([spec])
    texts: dict[str, str] = {}
    for lock in locks:
        try:
            texts[lock.name] = (build.sources / lock.name).read_text()
        except OSError as error:
            raise errors.LocalClusterError(
                f"image {spec.name}: cannot read its pip lock {build.sources / lock.name}"
                f" ({error.strerror}): run `make lock`"
            ) from error
    problems = [
        f"{lock.shown}: {problem}" for lock in locks for problem in lock.check(texts[lock.name])
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise errors.LocalClusterError(
            f"image {spec.name}: {problems[0]}{more}: run `make lock` (and commit the locks)"
        )
    if not os.path.lexists(rootfs / f"usr/bin/python{target.python}"):
        raise errors.LocalClusterError(
            f"image {spec.name}: its locks are for Python {target.python} (Debian"
            f" {target.suite}), which the image does not have"
        )
    work = rootfs / BUILD_DIR.lstrip("/")
    try:
        _remove_tree(work)
        work.mkdir(parents=True)
        for name, text in texts.items():
            (work / name).write_text(text)
        _stateward_project(work / "stateward")
        options, network = _pip_network(rootfs)
        with chroot_session(build):
            build.chroot(["python3", "-m", "venv", venv], what=f"python3 -m venv {venv}")
            for argv, what in piplock.install_commands(
                target,
                pip=f"{venv}/bin/pip",
                folder=BUILD_DIR,
                project=f"{BUILD_DIR}/stateward",
                options=options,
            ):
                build.chroot(argv, what=what, env=network)
            # The packer stores every mtime as 0, so timestamp-checked .pyc files would never
            # match their sources and, on a read-only root, every start would compile in
            # memory (the operator's imports took 2.0 s instead of 0.7 s). Hash-based .pyc
            # files do not depend on mtimes.
            build.chroot(
                [
                    "sh", "-c",
                    f"python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash"
                    f" {venv} /usr/lib/python3*/ /usr/lib/python3/dist-packages >/dev/null"
                    " || true",
                ],
                what="compile .pyc files by hash",
            )  # fmt: skip
            for check in checks:
                build.chroot(check, what=" ".join([Path(check[0]).name, *check[1:]]))
    finally:
        _remove_tree(work)
        (rootfs / BUILD_CA_BUNDLE.lstrip("/")).unlink(missing_ok=True)
    locked = len(piplock.parse(texts[target.lock_name]).pins)
    elapsed = time.monotonic() - started
    build.progress(
        f"  {spec.name}: {locked} locked packages (pip --require-hashes) and stateward"
        f" installed in {elapsed:.0f}s"
    )


@dataclasses.dataclass(frozen=True)
class UpgradeSource:
    """An older PostgreSQL major an instance image carries for ``pg_upgrade``: its server
    from Debian ``suite``; ``libraries``, that suite's packages of the libraries it links
    which the image's suite has only under another soname (unpacked as they are, beside the
    image's own, never replacing one); ``packages``, the image suite's packages of the rest
    it links that the image lacks."""

    major: int
    suite: str
    libraries: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()


UPGRADE_SOURCES: Mapping[int, UpgradeSource] = {
    # Debian has no suite with both 15 and 17: bookworm has 15, trixie 17. Trixie has ICU
    # 76 and OpenLDAP 2.6 (on OpenSSL, so no GnuTLS until bookworm's libldap needs it).
    17: UpgradeSource(15, "bookworm", ("libicu72", "libldap-2.5-0"), ("libgnutls30t64",)),
}
"""For an instance image's major, the older one it can upgrade from."""
_UPGRADE_SOURCE_SCRIPT = r"""
set -eu
old=$1 suite=$2 keyring=$3 mirror=$4 security=$5
shift 5
work=$(mktemp -d /tmp/stateward-upgrade-source.XXXXXX)
printf 'deb [signed-by=%s] %s %s main\n' \
    "$keyring" "$mirror" "$suite" "$keyring" "$mirror" "$suite-updates" \
    "$keyring" "$security" "$suite-security" > "$work/sources.list"
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
apt_old() {
    apt-get -o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=- \
        -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" "$@"
}
apt_old update
cd "$work"
apt_old download "postgresql-$old" "$@"
dpkg-deb -x "postgresql-${old}_"*.deb "$work/server"
cp -a "$work/server/usr/lib/postgresql/$old" /usr/lib/postgresql/
cp -a "$work/server/usr/share/postgresql/$old" /usr/share/postgresql/
for library in "$@"; do dpkg-deb -x "${library}_"*.deb /; done
cd /
rm -rf "$work"
missing=$(ldd "/usr/lib/postgresql/$old/bin/postgres" | grep 'not found' || true)
[ -z "$missing" ] || { echo "PostgreSQL $old lacks libraries: $missing" >&2; exit 1; }
"""
_UPGRADE_CHECK_SCRIPT = r"""
set -eu
old=$1 new=$2
work=$(mktemp -d /tmp/stateward-upgrade-check.XXXXXX)
chown postgres:postgres "$work"
cd "$work"
as_postgres() { setpriv --reuid=postgres --regid=postgres --clear-groups -- "$@"; }
for major in "$old" "$new"; do
    as_postgres "/usr/lib/postgresql/$major/bin/initdb" -D "$work/$major" -U postgres \
        -E UTF8 --locale=C.UTF-8 --data-checksums >/dev/null
done
as_postgres "/usr/lib/postgresql/$new/bin/pg_upgrade" --check \
    -b "/usr/lib/postgresql/$old/bin" -B "/usr/lib/postgresql/$new/bin" \
    -d "$work/$old" -D "$work/$new" -s "$work" --old-options "-c jit=off"
cd /
rm -rf "$work"
"""


def _add_upgrade_source(build: Build, source: UpgradeSource) -> None:
    """The older major's server beside the image's own (under ``/usr/lib/postgresql/OLD``,
    where its package puts it), for ``pg_upgrade -b``; then a ``pg_upgrade --check`` of a
    fresh old cluster against a fresh new one proves the pair works in this image. The old
    server's JIT (LLVM) is not carried: an upgrade runs it with ``jit=off``."""
    started = time.monotonic()
    old, suite = source.major, source.suite
    keyring = "/usr/share/keyrings/debian-archive-keyring.pgp"
    if not (build.rootfs / keyring.lstrip("/")).is_file():
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    new = _instance_major(build.spec)
    with chroot_session(build):
        if source.packages:
            build.chroot(
                ["apt-get", "install", "--yes", "--no-install-recommends", *source.packages],
                what=f"apt-get install {' '.join(source.packages)} for PostgreSQL {old}",
            )
        build.chroot(
            ["sh", "-c", _UPGRADE_SOURCE_SCRIPT, "sh", str(old), suite, keyring,
             DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR, *source.libraries],
            what=f"PostgreSQL {old} from {suite} for pg_upgrade",
        )  # fmt: skip
        build.chroot(
            ["sh", "-c", _UPGRADE_CHECK_SCRIPT, "sh", str(old), str(new)],
            what=f"pg_upgrade --check from {old} to {new}",
        )
    build.progress(
        f"  {build.spec.name}: PostgreSQL {old} from {suite} added for pg_upgrade and checked"
        f" in {time.monotonic() - started:.0f}s"
    )


def _install_instance(build: Build) -> None:
    """After apt: drop any Debian cluster and the snakeoil key, add the older major's server
    where the image carries one for upgrades (:data:`UPGRADE_SOURCES`), then the venv with
    Patroni and stateward, smoke-tested."""
    rootfs, major = build.rootfs, _instance_major(build.spec)
    _no_main_cluster(rootfs / "etc/postgresql-common/createcluster.conf")
    for cluster in (f"etc/postgresql/{major}/main", f"var/lib/postgresql/{major}/main"):
        if (rootfs / cluster).exists():
            shutil.rmtree(rootfs / cluster)
    # ssl-cert made a key pair at install; an image must not ship one private key to all.
    for name in ("etc/ssl/private/ssl-cert-snakeoil.key", "etc/ssl/certs/ssl-cert-snakeoil.pem"):
        (rootfs / name).unlink(missing_ok=True)
    if major in UPGRADE_SOURCES:
        _add_upgrade_source(build, UPGRADE_SOURCES[major])
    venv = STATEWARD_VENV
    _install_stateward(
        build,
        checks=[
            [f"{venv}/bin/patroni", "--version"],
            [f"{venv}/bin/stateward-instance", "version"],
        ],
    )


def _instance_spec(major: int, base: ImageSpec) -> ImageSpec:
    """``ghcr.io/stateward/postgres-instance:MAJOR``, the operator's default image for
    ``spec.version: "MAJOR"``: imported under that ref, pods use it with no registry. From
    ``base``, the Debian suite whose ``postgresql-MAJOR`` package this is."""
    repository, name = v1alpha1.DEFAULT_IMAGE_REPOSITORY.rsplit("/", 1)
    return ImageSpec(
        name=name,
        tag=str(major),
        repository=repository,
        from_image=f"{base.name}:{base.tag}",
        prepare=_prepare_instance,
        packages=(
            f"postgresql-{major}",
            "pgbackrest",
            "python3",
            "python3-venv",
            "ca-certificates",
            # Arbitrary uids (no passwd entry): stateward-instance preloads it for initdb.
            "libnss-wrapper",
            # The pooler (spec.pooler) runs PgBouncer from the same image.
            "pgbouncer",
        ),
        inputs=stateward_digest,
        hook=_install_instance,
        pip_lock=piplock.Target(
            suite=base.debootstrap or "",
            requirements=PATRONI_REQUIREMENTS,
            from_source=PATRONI_FROM_SOURCE,
        ),
        cmd=("stateward-instance", "run"),
        env=(
            f"PATH={STATEWARD_VENV}/bin:{patroni.bin_dir(major)}:"
            + DEFAULT_PATH.removeprefix("PATH="),
            "LANG=C.UTF-8",
        ),
        user=f"{INSTANCE_UID}:{INSTANCE_UID}",
    )


POSTGRES_15 = _instance_spec(15, BASE)  # Debian bookworm's PostgreSQL 15
POSTGRES_17 = _instance_spec(17, BASE_TRIXIE)  # Debian trixie's PostgreSQL 17


def _prepare_mariadb(build: Build) -> None:
    """Before apt: the mysql user with the pods' uid (the package would take any free one)."""
    _system_user(
        build,
        "mysql",
        MARIADB_UID,
        home="/nonexistent",
        login_shell="/bin/false",
        comment="MariaDB Server",
    )


MARIADB_UID = 999
"""The pods' runAsUser for MySQL and MariaDB (``specs.mariadb.servers.UID``, the official MySQL
image's mysql user)."""


def _mariadb_spec(base: ImageSpec) -> ImageSpec:
    """``ghcr.io/stateward/mariadb-instance:SERIES``: Debian's MariaDB server,
    mariadb-backup and mysqld_exporter (the servers' metrics). The start-up script comes
    from the Database's ConfigMap, so the image holds no Stateward code and changes only
    with Debian's packages."""
    repository, name = v1alpha1.DATABASE_IMAGE_REPOSITORIES[v1alpha1.Engine.MARIADB].rsplit("/", 1)
    return ImageSpec(
        name=name,
        tag="10.11",  # bookworm's series
        repository=repository,
        from_image=f"{base.name}:{base.tag}",
        prepare=_prepare_mariadb,
        # socat serves copies of the data (mariadb-backup) to new replicas; mysqld_exporter
        # serves each server's metrics.
        packages=(
            "mariadb-server",
            "mariadb-backup",
            "socat",
            "ca-certificates",
            "prometheus-mysqld-exporter",
        ),
        cmd=("mariadbd",),
        env=(DEFAULT_PATH, "LANG=C.UTF-8"),
        user=f"{MARIADB_UID}:{MARIADB_UID}",
        ports=("3306/tcp",),
    )


MARIADB_1011 = _mariadb_spec(BASE)

OPERATOR_UID = 65532
"""uid and gid of the operator image's user (``nonroot``, as in distroless images): what
config/manager's Deployment sets as runAsUser and runAsGroup."""
OPERATOR_REPOSITORY = "ghcr.io/stateward"
"""config/manager deploys ``ghcr.io/stateward/stateward:VERSION``."""
OPERATOR_PORTS = ("8081/tcp", "9443/tcp")
"""``stateward operator``'s defaults: probes and metrics, the admission webhook."""


def stateward_version() -> str:
    """The version in :func:`source_dir`'s pyproject.toml, which the wheel in the operator
    image gets; the installed package's when there is no checkout (nothing to build then)."""
    try:
        with open(source_dir() / "pyproject.toml", "rb") as pyproject:
            return str(tomllib.load(pyproject)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return stateward.__version__


def _prepare_operator(build: Build) -> None:
    """The ``nonroot`` user with the Deployment's uid: a process of a uid with no passwd
    entry cannot tell its user name (``getpass.getuser()``, which Kopf's identity calls)."""
    _system_user(
        build,
        "nonroot",
        OPERATOR_UID,
        home="/nonexistent",
        login_shell="/usr/sbin/nologin",
        comment="stateward operator",
    )


def _install_operator(build: Build) -> None:
    """The venv with stateward and its dependencies; smoke-tested by the CLI and by loading
    the operator's runtime (Kopf, lightkube and the rest)."""
    venv = STATEWARD_VENV
    _install_stateward(
        build,
        checks=[
            [f"{venv}/bin/stateward", "--help"],
            [f"{venv}/bin/python", "-c", "import stateward.runtime.operator"],
        ],
    )


OPERATOR = ImageSpec(
    name="stateward",
    tag=stateward_version(),
    repository=OPERATOR_REPOSITORY,
    from_image="base",
    prepare=_prepare_operator,
    packages=("python3", "python3-venv", "ca-certificates"),
    inputs=stateward_digest,
    hook=_install_operator,
    pip_lock=piplock.Target(suite=BASE.debootstrap or ""),
    entrypoint=(f"{STATEWARD_VENV}/bin/stateward",),
    cmd=("operator",),
    env=(f"PATH={STATEWARD_VENV}/bin:" + DEFAULT_PATH.removeprefix("PATH="), "LANG=C.UTF-8"),
    user=f"{OPERATOR_UID}:{OPERATOR_UID}",
    ports=OPERATOR_PORTS,
)
"""The operator's own image, under the ref config/manager deploys: built and imported here,
the Deployment runs with no registry (its imagePullPolicy is IfNotPresent)."""

IMAGES: tuple[ImageSpec, ...] = (
    PAUSE,
    BASE,
    POSTGRES_15,
    BASE_TRIXIE,
    POSTGRES_17,
    MARIADB_1011,
    OPERATOR,
)
PAUSE_REF = PAUSE.ref
BASE_REF = BASE.ref
INSTANCE_REFS: Mapping[int, str] = {15: POSTGRES_15.ref, 17: POSTGRES_17.ref}
"""PostgreSQL major version -> the instance image built here for it."""
OPERATOR_REF = OPERATOR.ref


@dataclasses.dataclass(frozen=True)
class Archive:
    """An image archive in the cache, ready for ``ctr images import``."""

    spec: ImageSpec
    path: Path
    ref: str


# --------------------------------------------------------------------------------------------
# Pip lock files (piplock): what the venvs of the images holding stateward take from PyPI

UV_REQUIREMENT = "uv>=0.13,<0.14"
"""What ``make lock`` resolves with (the dev extra): uv resolves for another Python version
than the one it runs on, which the trixie image's lock needs."""


def _pyproject() -> dict[str, Any]:
    path = source_dir() / "pyproject.toml"
    try:
        with open(path, "rb") as pyproject:
            return tomllib.load(pyproject)
    except OSError as error:
        raise errors.LocalClusterError(_NO_CHECKOUT.format(root=source_dir())) from error


@dataclasses.dataclass(frozen=True)
class LockFile:
    """One pip lock file of an image and what it is resolved from: ``inputs`` (requirements)
    with ``from_source`` built from source, for ``spec.pip_lock``'s suite."""

    spec: ImageSpec
    name: str
    title: str
    inputs: tuple[str, ...]
    from_source: tuple[str, ...] = ()

    @property
    def target(self) -> piplock.Target:
        assert self.spec.pip_lock is not None
        return self.spec.pip_lock

    @property
    def path(self) -> Path:
        return images_dir() / self.spec.name / self.name

    @property
    def shown(self) -> str:
        """The path as the repository names it."""
        return f"images/{self.spec.name}/{self.name}"

    def header(self) -> str:
        return piplock.header(
            title=self.title, target=self.target, inputs=self.inputs, from_source=self.from_source
        )

    def check(self, text: str) -> list[str]:
        """What is wrong with ``text`` as this lock (:func:`piplock.check`); none when current."""
        return piplock.check(
            text, target=self.target, inputs=self.inputs, from_source=self.from_source
        )

    def problems(self) -> list[str]:
        """What is wrong with the committed file, each sentence prefixed with its path."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return [f"{self.shown}: missing"]
        return [f"{self.shown}: {problem}" for problem in self.check(text)]


def lock_files(catalog: Sequence[ImageSpec] = IMAGES) -> list[LockFile]:
    """The lock files of the images with a ``pip_lock``, build lock first for each, once
    each: the build lock's inputs are ``pyproject.toml``'s ``build-system.requires`` (which
    also build ``from_source``), the lock's its ``dependencies`` and the target's own."""
    project = _pyproject()
    build_requires = tuple(project["build-system"]["requires"])
    dependencies = tuple(project["project"]["dependencies"])
    found: dict[tuple[str, str], LockFile] = {}
    for spec in catalog:
        target = spec.pip_lock
        if target is None:
            continue
        python = f"Python {target.python} of Debian {target.suite}"
        built = " and ".join(("stateward", *target.from_source))
        for lock in (
            LockFile(
                spec=spec,
                name=target.build_lock_name,
                title=f"What builds {built} in the {spec.name} image ({python}).",
                inputs=build_requires,
            ),
            LockFile(
                spec=spec,
                name=target.lock_name,
                title=f"What the {spec.name} image's venv takes from PyPI ({python}).",
                inputs=(*dependencies, *target.requirements),
                from_source=target.from_source,
            ),
        ):
            found.setdefault((spec.name, lock.name), lock)
    return list(found.values())


def _uv() -> list[str]:
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    found = shutil.which("uv")
    if found is None:
        raise errors.LocalClusterError(
            f"locking needs uv: `make lock` installs it (the dev extra), or pip install"
            f" '{UV_REQUIREMENT}'"
        )
    return [found]


def write_locks(
    *,
    upgrade: bool = False,
    progress: Progress = _stderr,
    catalog: Sequence[ImageSpec] = IMAGES,
    uv: Sequence[str] | None = None,
) -> list[Path]:
    """Resolve every lock file of ``catalog`` with ``uv pip compile`` and write the changed
    ones; return those. uv keeps the versions a file already has while they fit its inputs,
    unless ``upgrade``. A lock is replaced only once uv succeeded and the result checks."""
    command = list(uv) if uv is not None else _uv()
    written: list[Path] = []
    for lock in lock_files(catalog):
        with tempfile.TemporaryDirectory(prefix="stateward-lock-") as scratch:
            folder = Path(scratch)
            (folder / "requirements.in").write_text("".join(f"{r}\n" for r in lock.inputs))
            output = folder / lock.name
            if lock.path.is_file():
                shutil.copyfile(lock.path, output)  # its versions are uv's preferences
            argv = piplock.compile_command(
                command,
                target=lock.target,
                source="requirements.in",
                output=lock.name,
                from_source=lock.from_source,
                upgrade=upgrade,
            )
            progress(f"Locking {lock.shown}: uv {' '.join(argv[len(command) :])}")
            done = subprocess.run(argv, cwd=folder, capture_output=True, text=True)
            if done.returncode != 0:
                reason = " ".join(done.stderr.split()) or "no output"
                raise errors.LocalClusterError(
                    f"uv pip compile for {lock.shown} failed (exit {done.returncode}): {reason}"
                )
            text = lock.header() + output.read_text()
        problems = lock.check(text)
        if problems:
            raise errors.LocalClusterError(
                f"uv pip compile gave {lock.shown} that does not check: {'; '.join(problems)}"
            )
        pins = len(piplock.parse(text).pins)
        if lock.path.is_file() and lock.path.read_text() == text:
            progress(f"  {lock.shown}: unchanged, {pins} packages")
            continue
        lock.path.parent.mkdir(parents=True, exist_ok=True)
        partial = lock.path.with_name(lock.path.name + ".partial")
        partial.write_text(text)
        partial.rename(lock.path)
        written.append(lock.path)
        progress(f"  {lock.shown}: written, {pins} packages")
    return written


# --------------------------------------------------------------------------------------------
# Cache


def images_dir() -> Path:
    """The ``images/`` folder with the Containerfiles and sources (``$STATEWARD_IMAGES_DIR``),
    by default that of :func:`source_dir`; raises, saying so, when there is none."""
    configured = os.environ.get("STATEWARD_IMAGES_DIR")
    if configured:
        return Path(configured)
    folder = source_dir() / "images"
    if not folder.is_dir():
        raise errors.LocalClusterError(_NO_CHECKOUT.format(root=source_dir()))
    return folder


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


# --------------------------------------------------------------------------------------------
# Building a rootfs


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


def _require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise errors.LocalClusterError(
            f"{what} needs root (debootstrap, mount, chroot): run as root"
        )


def _debootstrap(build: Build, suite: str) -> None:
    _require_root(f"building image {build.spec.name}")
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).is_file():
        raise errors.LocalClusterError(
            f"image {build.spec.name} needs debootstrap: run `apt-get install debootstrap`"
        )
    mirror = os.environ.get("STATEWARD_DEBIAN_MIRROR", DEBIAN_MIRROR)
    try:
        build.run(
            [debootstrap, "--variant=minbase", "--arch=amd64", suite, str(build.rootfs), mirror],
            what=f"debootstrap {suite}",
        )
    except errors.LocalClusterError as error:
        inner = build.rootfs / "debootstrap" / "debootstrap.log"  # goes with the work dir
        if inner.is_file():
            with open(build.log, "a") as log:
                log.write(f"--- {inner}\n{inner.read_text(errors='replace')}")
        text = build.log.read_text(errors="replace")
        if any(
            s in text
            for s in (
                "Failed getting release",
                "Couldn't download",
                "Temporary failure resolving",
                "Could not resolve",
            )
        ):
            raise errors.LocalClusterError(
                f"cannot reach the Debian archive {mirror}: check the network or set"
                f" STATEWARD_DEBIAN_MIRROR (log: {build.log})"
            ) from error
        raise


def _unpack_layer(archive: Path, rootfs: Path) -> None:
    """Extract the single layer of one of our archives into an empty directory."""
    with tarfile.open(archive) as outer:

        def blob(digest: str) -> IO[bytes]:
            member = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return member

        manifest = json.load(blob(_index_manifest_digest(outer)))
        layer = manifest["layers"][0]
        gzip_flag = ["-z"] if layer["mediaType"].endswith("+gzip") else []
        extract = subprocess.Popen(
            ["tar", "-x", *gzip_flag, "--numeric-owner", "-C", str(rootfs)], stdin=subprocess.PIPE
        )
        assert extract.stdin is not None
        with extract.stdin:
            shutil.copyfileobj(blob(layer["digest"]), extract.stdin, 1 << 20)
        if extract.wait() != 0:
            raise errors.LocalClusterError(f"cannot unpack the layer of {archive}: remove it")


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


@contextlib.contextmanager
def chroot_mounts(rootfs: Path) -> Iterator[None]:
    """/proc and the host's /dev mounted into the rootfs for the duration; always unmounted."""
    _require_root("installing packages into an image")
    mounted: list[Path] = []
    try:
        for source, target, options in (
            ("proc", rootfs / "proc", ["-t", "proc"]),
            ("/dev", rootfs / "dev", ["--bind"]),
        ):
            target.mkdir(exist_ok=True)
            _checked(["mount", *options, source, str(target)], f"mount {target}")
            mounted.append(target)
        yield
    finally:
        for target in reversed(mounted):
            if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", str(target)], capture_output=True)


@contextlib.contextmanager
def chroot_session(build: Build) -> Iterator[None]:
    """:func:`chroot_mounts` plus the host's resolv.conf (network for apt and pip) and a
    policy-rc.d that starts no service; the rootfs's own files are restored afterwards."""
    policy = build.rootfs / "usr/sbin/policy-rc.d"
    resolv = build.rootfs / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else b""
    policy.write_text("#!/bin/sh\n# the image build starts no services\nexit 101\n")
    policy.chmod(0o755)
    resolv.unlink(missing_ok=True)
    shutil.copyfile("/etc/resolv.conf", resolv)
    try:
        with chroot_mounts(build.rootfs):
            yield
    finally:
        policy.unlink(missing_ok=True)
        resolv.unlink(missing_ok=True)
        resolv.write_bytes(saved)


def _install_packages(build: Build, packages: Sequence[str]) -> None:
    """apt-get install in a chroot; no service starts (policy-rc.d exits 101)."""
    started = time.monotonic()
    build.progress(f"  {build.spec.name}: apt-get install {' '.join(packages)}")
    with chroot_session(build):
        build.chroot(["apt-get", "update"], what="apt-get update")
        build.chroot(
            ["apt-get", "install", "--yes", "--no-install-recommends", *packages],
            what="apt-get install",
        )
        build.chroot(["apt-get", "clean"], what="apt-get clean")
    build.progress(f"  {build.spec.name}: packages installed in {time.monotonic() - started:.0f}s")


def _tidy(rootfs: Path) -> None:
    """Drop what an image should not carry: apt caches and lists, logs, /dev, host files."""
    for folder in ("var/cache/apt", "var/lib/apt/lists", "var/log", "tmp", "var/tmp"):
        _remove_files(rootfs / folder)
    for pattern in ("var/cache/debconf/*-old", "var/lib/dpkg/*-old"):
        for path in rootfs.glob(pattern):
            path.unlink()
    dev = rootfs / "dev"
    if dev.is_dir() and not dev.is_symlink():
        for entry in dev.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                _remove_tree(entry)
            else:
                entry.unlink()
    for folder in ("tmp", "var/tmp"):  # any uid must be able to write here
        if (rootfs / folder).is_dir():
            (rootfs / folder).chmod(0o1777)
    for name in ("etc/resolv.conf", "etc/hostname"):  # debootstrap copies the host's
        if (rootfs / name).is_file() and not (rootfs / name).is_symlink():
            (rootfs / name).write_bytes(b"")
            (rootfs / name).chmod(0o644)


def _remove_files(folder: Path) -> None:
    """Delete every non-directory below ``folder``, keeping the directories (and owners)."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for parent, _, files in os.walk(folder):
        for name in files:
            os.unlink(os.path.join(parent, name))


def _mounts_below(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (from /proc/self/mountinfo)."""
    prefix = str(path.resolve())
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = line.split()[4]
            for escaped, char in (
                ("\\040", " "),
                ("\\011", "\t"),
                ("\\012", "\n"),
                ("\\134", "\\"),
            ):
                point = point.replace(escaped, char)
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """rmtree that never descends into a mount (a bind-mounted /dev would lose the host's)."""
    if not path.exists():
        return
    for point in _mounts_below(path):
        subprocess.run(["umount", "--lazy", point], capture_output=True)
    if _mounts_below(path):
        raise errors.LocalClusterError(
            f"{path} still has mounts below it ({_mounts_below(path)[0]}): unmount, then remove it"
        )
    shutil.rmtree(path)


def _checked(argv: Sequence[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise errors.LocalClusterError(f"{what} failed: {reason}")


def _run_logged(
    argv: Sequence[str],
    *,
    log: Path,
    label: str,
    progress: Progress,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run a command with its output appended to ``log``; a heartbeat every 30 s."""
    started = time.monotonic()
    last = [""]
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            progress(
                f"  {label}: still running, {time.monotonic() - started:.0f}s elapsed"
                f" ({last[0][:80]})"
            )

    with open(log, "a") as sink:
        sink.write(f"$ {' '.join(argv)}\n")
        sink.flush()
        try:
            process = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=None if env is None else dict(env),
            )
        except OSError as error:
            raise errors.LocalClusterError(f"{label}: cannot run {argv[0]} ({error})") from error
        ticker = threading.Thread(target=heartbeat, daemon=True)
        ticker.start()
        assert process.stdout is not None
        try:
            for line in process.stdout:
                sink.write(line)
                sink.flush()  # so `tail -f` on the log follows along
                if line.strip():
                    last[0] = line.strip()
            code = process.wait()
        finally:
            done.set()
            if process.poll() is None:
                process.kill()
    if code != 0:
        raise errors.LocalClusterError(
            f"{label} failed (exit {code}): {last[0] or 'no output'} (log: {log})"
        )


# --------------------------------------------------------------------------------------------
# The deterministic OCI packer


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


# --------------------------------------------------------------------------------------------
# Into containerd


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
