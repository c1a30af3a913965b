"""How an image's root filesystem is made: debootstrap, a chroot with the kernel file systems
mounted, apt, build hooks' commands logged to the image's build log, and the tidy-up before
packing. Also where a build reads from: the stateward checkout and its ``images/`` folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from stateward_local import errors
from stateward_local.images.oci import _index_manifest_digest

if TYPE_CHECKING:
    from stateward_local.images.catalog import ImageSpec

# The archive this machine's apt uses (/etc/apt/sources.list.d/debian.sources); the
# environment variable points debootstrap elsewhere without changing any image's identity.
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HEARTBEAT_SECONDS = 30.0

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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


def source_dir() -> Path:
    """The checkout the images' stateward wheel is built from (``pyproject.toml``,
    ``src/stateward``); ``$STATEWARD_SOURCE_DIR`` overrides. The checkout this module lives
    in, by default: an installed wheel has none."""
    configured = os.environ.get("STATEWARD_SOURCE_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[4]


_NO_CHECKOUT = (
    "the local images are built from a stateward source checkout (pyproject.toml, src/,"
    " images/) and {root} is none: run from a checkout or set STATEWARD_SOURCE_DIR to one"
)


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
