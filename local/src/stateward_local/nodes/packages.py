"""Debian packages that real (non-kwok) nodes need from the host.

The Go-built binaries (kubelet, containerd, CNI plugins, CoreDNS) come from the binary cache;
what a node also needs is the host's OCI runtime, firewall and namespace tools, debootstrap to
build images without a registry, and a static libc to link the pause binary. Each requirement
is an executable (looked up on ``PATH`` plus the sbin directories) or an absolute file path.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from stateward_local import binaries, errors

Progress = Callable[[str], None]

SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def _libc_archive() -> str:
    # Debian's multiarch directory: x86_64-linux-gnu, aarch64-linux-gnu, ...
    return f"/usr/lib/{platform.machine()}-linux-gnu/libc.a"


LIBC_ARCHIVE = _libc_archive()

# Debian package -> the executables (or absolute file paths) that show it is installed.
HOST_PACKAGES: dict[str, tuple[str, ...]] = {
    "runc": ("runc",),
    "nftables": ("nft",),
    "iptables": ("iptables",),
    "conntrack": ("conntrack",),
    "debootstrap": ("debootstrap",),
    "libc6-dev": (LIBC_ARCHIVE,),  # static libc for the pause binary (gcc -static)
    "iproute2": ("ip",),
    "util-linux": ("nsenter", "unshare"),
}

APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
APT_TIMEOUT_SECONDS = 1800


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def which(name: str) -> str | None:
    """``shutil.which`` over ``PATH`` and the sbin directories (often absent for non-root)."""
    search = os.pathsep.join([os.environ.get("PATH", os.defpath), *SBIN_DIRS])
    return shutil.which(name, path=search)


def missing_tools(
    *,
    find: Callable[[str], str | None] = which,
    exists: Callable[[str], bool] = os.path.exists,
) -> list[str]:
    """The required executables and files that this host lacks, in ``HOST_PACKAGES`` order."""
    absent: list[str] = []
    for provides in HOST_PACKAGES.values():
        for tool in provides:
            found = exists(tool) if tool.startswith("/") else find(tool) is not None
            if not found:
                absent.append(tool)
    return absent


def packages_for(tools: Iterable[str]) -> list[str]:
    """The Debian packages providing ``tools``: deduplicated, in ``HOST_PACKAGES`` order."""
    wanted = set(tools)
    unknown = wanted - {tool for provides in HOST_PACKAGES.values() for tool in provides}
    if unknown:
        raise ValueError(f"no known package provides {', '.join(sorted(unknown))}")
    return [
        package
        for package, provides in HOST_PACKAGES.items()
        if any(tool in wanted for tool in provides)
    ]


def install_command(packages: Iterable[str], *, root: bool) -> str:
    """The shell command a user runs to install ``packages``."""
    sudo = "" if root else "sudo "
    names = " ".join(shlex.quote(p) for p in packages)
    return (
        f"{sudo}apt-get update && {sudo}env DEBIAN_FRONTEND=noninteractive apt-get install -y"
        f" --no-install-recommends {names}"
    )


def log_path() -> Path:
    return binaries.cache_dir() / "logs" / "host-packages.log"


def ensure_packages(progress: Progress = _stderr) -> list[str]:
    """Install the missing host packages with apt-get; return the packages installed.

    Needs root and apt-get; otherwise raises ``LocalClusterError`` naming the packages and the
    command to run. Output of apt-get goes to ``log_path()``.
    """
    tools = missing_tools()
    if not tools:
        return []
    packages = packages_for(tools)
    root = os.geteuid() == 0
    apt_get = which("apt-get")
    if not root or apt_get is None:
        where = "" if apt_get else " (this host has no apt-get: install their equivalents)"
        raise errors.LocalClusterError(
            f"real nodes need the host packages {', '.join(packages)} (missing:"
            f" {', '.join(tools)}){where}: run `{install_command(packages, root=root)}`"
        )
    log = log_path()
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    steps = (
        ("apt-get update", [apt_get, "update"]),
        (
            f"apt-get install {' '.join(packages)}",
            [apt_get, "install", "-y", "--no-install-recommends", *packages],
        ),
    )
    with log.open("a") as output:
        for label, argv in steps:
            progress(f"Host packages: {label} (log: {log})")
            output.write(f"$ {shlex.join(argv)}\n")
            output.flush()
            try:
                result = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **APT_ENV},
                    timeout=APT_TIMEOUT_SECONDS,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise errors.LocalClusterError(
                    f"{label} did not finish in {APT_TIMEOUT_SECONDS}s (see {log}): check the"
                    f" network and retry, or run `{install_command(packages, root=True)}`"
                ) from None
            if result.returncode != 0:
                raise errors.LocalClusterError(
                    f"{label} failed with exit code {result.returncode} (see {log}): fix the"
                    f" cause and retry, or run `{install_command(packages, root=True)}`"
                )
    still = missing_tools()
    if still:
        raise errors.LocalClusterError(
            f"installed {', '.join(packages)} but {', '.join(still)} is still missing (see {log})"
        )
    progress(f"Host packages: installed {', '.join(packages)} in {time.monotonic() - started:.0f}s")
    return packages
