"""The images: each an :class:`ImageSpec` (how its rootfs is made, its build hooks, its OCI
config) — the pause image, Debian bases, the PostgreSQL instance images, MariaDB and the
operator — and :data:`IMAGES`, the catalog every other module reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import stateward
from stateward.api import v1alpha1
from stateward.instance import patroni
from stateward_local import errors
from stateward_local.images import piplock
from stateward_local.images.locks import lock_files
from stateward_local.images.rootfs import (
    _NO_CHECKOUT,
    DEBIAN_MIRROR,
    DEBIAN_SECURITY_MIRROR,
    DEFAULT_PATH,
    Build,
    _remove_tree,
    chroot_session,
    source_dir,
)

REPOSITORY = "localhost/stateward"


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
    """A hook's name in the input hash. Hooks of this package are named by the package, not
    by the module they sit in: moving one between modules changes nothing it does, and must
    not rebuild every image (nor invalidate every cache)."""
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    module = hook.__module__
    if module.startswith(f"{__package__}."):
        module = __package__ or module
    return f"{module}.{name}"


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
    entry cannot tell its user name (``getpass.getuser()``, which libraries call to name it)."""
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
    the operator's runtime (lightkube, aiohttp and the rest)."""
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
