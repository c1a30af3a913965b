"""The host side of the real nodes: the journal of every host change (written before the change,
so `down` can undo exactly what `up` did, even after a crash), sysctls, cgroups, the bridge,
the nftables table that keeps pod traffic on the machine, and the routes.

Each cluster's bridge, routes, table and cgroups belong to its slot alone. Sysctls and the
directories the node components hard-code belong to the whole host: while another cluster
with real nodes runs, ``down`` hands them to that cluster's journal instead of undoing them
under it, and the last cluster to go restores the host as it was before the first came.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateward_local.errors import LocalClusterError
from stateward_local.nodes.layout import (
    BIND_TARGETS,
    CGROUP_ROOT,
    SLOTS,
    TMPFS_TARGETS,
    Slot,
)

if TYPE_CHECKING:
    from stateward_local.nodes.layout import Node

HOST_LOCK = Path("/run/stateward-local.lock")
"""Held while a cluster changes or undoes what the whole host shares (and while it decides
who inherits that), so two clusters never interleave there."""
SHARED_KINDS = frozenset({"sysctl", "dir"})
"""Journal entries that change the whole host rather than one cluster's slot."""


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def host_lock() -> contextlib.AbstractContextManager[None]:
    return _flock(HOST_LOCK)


class Journal:
    """Host changes in the order they were made; ``undo`` reverts them newest first."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        try:
            loaded: list[dict[str, Any]] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        return loaded

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Another cluster's ``down`` may hand entries to this journal while its own cluster
        records one: each read-modify-write holds the journal's lock."""
        return _flock(self.path.with_name(self.path.name + ".lock"))

    def _write(self, entries: list[dict[str, Any]]) -> None:
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(self.path)

    def record(self, **entry: Any) -> None:
        with self._locked():
            entries = self.entries()
            if entry not in entries:
                self._write([*entries, entry])

    def inherit(self, entries: list[dict[str, Any]]) -> None:
        """Take over another cluster's host-wide changes. They go first: they describe the
        host as it was before either cluster came, so they are undone last. (An entry that
        is already there is kept once, at the front: the earliest decides what is restored.)"""
        with self._locked():
            self._write([*entries, *(e for e in self.entries() if e not in entries)])

    def undo(self, heir: Journal | None = None) -> list[str]:
        """Revert every recorded change, newest first; failures are collected, not fatal.
        With an ``heir`` (a cluster that still runs), host-wide changes go to its journal
        instead: undoing them now would pull sysctls and directories from under it."""
        entries = self.entries()
        if heir is not None:
            heir.inherit([e for e in entries if e["kind"] in SHARED_KINDS])
            entries = [e for e in entries if e["kind"] not in SHARED_KINDS]
        problems: list[str] = []
        for entry in reversed(entries):
            try:
                _undo(entry)
            except (OSError, subprocess.CalledProcessError, LocalClusterError) as error:
                problems.append(f"{entry}: {error}")
        self.path.unlink(missing_ok=True)
        self.path.with_name(self.path.name + ".lock").unlink(missing_ok=True)
        return problems


def _undo(entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    if kind == "sysctl":
        write_sysctl(entry["key"], entry["old"])
    elif kind == "link":
        if link_exists(entry["name"]):
            run(["ip", "link", "del", entry["name"]])
    elif kind == "route":
        run(["ip", "route", "del", entry["dst"]], check=False)
    elif kind == "nft":
        run(["nft", "delete", "table", "inet", entry["table"]], check=False)
    elif kind == "mount":
        if is_mountpoint(Path(entry["target"])):
            run(["umount", "-l", entry["target"]])
    elif kind == "dir":
        with contextlib.suppress(FileNotFoundError, OSError):
            Path(entry["path"]).rmdir()
    elif kind == "cgroup":
        remove_cgroup(Path(entry["path"]))
    else:
        raise LocalClusterError(f"unknown host change {kind!r} in the journal")


def run(argv: list[str], *, check: bool = True, input: str | None = None) -> str:
    """Run a host command; on failure raise one line with its stderr."""
    result = subprocess.run(argv, capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise LocalClusterError(
            f"`{' '.join(argv)}` failed: {detail[-1] if detail else f'exit {result.returncode}'}"
        )
    return result.stdout


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def is_mountpoint(path: Path) -> bool:
    target = str(path.resolve()) if path.exists() else str(path)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == target for line in mountinfo)


def read_sysctl(key: str) -> str:
    return Path("/proc/sys", *key.split(".")).read_text().strip()


def write_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", *key.split(".")).write_text(value)


def set_sysctl(journal: Journal, key: str, value: str) -> None:
    old = read_sysctl(key)
    if old != value:
        journal.record(kind="sysctl", key=key, old=old)
        write_sysctl(key, value)


def record_sysctls(journal: Journal, keys: Iterable[str]) -> None:
    """Remember current values of sysctls someone else (the kubelet) is about to change."""
    with host_lock():
        for key in keys:
            with contextlib.suppress(OSError):
                journal.record(kind="sysctl", key=key, old=read_sysctl(key))


def make_dir(journal: Journal, path: Path) -> None:
    """Create ``path`` and each missing parent, recording each so ``down`` removes it."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        journal.record(kind="dir", path=str(directory))
        directory.mkdir()


def cgroup_hierarchies() -> list[Path]:
    """Mount points of every cgroup hierarchy under /sys/fs/cgroup."""
    found: list[Path] = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0] if right else ""
            target = Path(left.split()[4])
            if fstype in ("cgroup", "cgroup2") and CGROUP_ROOT in (target, *target.parents):
                found.append(target)
    return sorted(found)


def cgroup_paths(node: Node) -> list[Path]:
    return [h / node.slot.cgroup_parent / node.name for h in cgroup_hierarchies()]


def daemon_cgroup_procs(node: Node) -> list[Path]:
    return [path / "daemons" / "cgroup.procs" for path in cgroup_paths(node)]


def freezer_path(node: Node) -> Path | None:
    for hierarchy in cgroup_hierarchies():
        if (hierarchy / "freezer.state").exists() or hierarchy.name == "freezer":
            return hierarchy / node.slot.cgroup_parent / node.name
    return None


def create_cgroups(journal: Journal, node: Node) -> None:
    for hierarchy in cgroup_hierarchies():
        parent = node.slot.cgroup_parent
        for relative in (parent, f"{parent}/{node.name}"):
            path = hierarchy / relative
            if not path.exists():
                journal.record(kind="cgroup", path=str(path))
                path.mkdir()
            _inherit_cpuset(path)
        daemons = hierarchy / parent / node.name / "daemons"
        daemons.mkdir(exist_ok=True)
        _inherit_cpuset(daemons)


def _inherit_cpuset(path: Path) -> None:
    for name in ("cpuset.cpus", "cpuset.mems"):
        own = path / name
        if own.exists() and not own.read_text().strip():
            own.write_text((path.parent / name).read_text())


def cgroup_pids(root: Path) -> set[int]:
    pids: set[int] = set()
    if not root.exists():
        return pids
    for directory, _, files in os.walk(root):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                text = Path(directory, "cgroup.procs").read_text()
                pids.update(int(pid) for pid in text.split())
    return pids


def kill_cgroup(roots: Iterable[Path], *, timeout: float = 20.0) -> None:
    """SIGKILL every process under ``roots`` (frozen first, so nothing forks meanwhile)."""
    roots = list(roots)
    freezer = next((r for r in roots if (r / "freezer.state").exists()), None)
    deadline = time.monotonic() + timeout
    while True:
        pids = set().union(*(cgroup_pids(r) for r in roots)) if roots else set()
        if not pids:
            return
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")
        if time.monotonic() > deadline:
            raise LocalClusterError(f"processes {sorted(pids)} under {roots[0]} would not die")
        time.sleep(0.1)


def remove_cgroup(path: Path, *, timeout: float = 20.0) -> None:
    """Kill what runs under ``path`` and remove it with every child cgroup."""
    if not path.exists():
        return
    kill_cgroup([path])
    deadline = time.monotonic() + timeout
    while path.exists():
        for directory, _, _ in sorted(os.walk(path), key=lambda d: -len(d[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        if path.exists():
            if time.monotonic() > deadline:
                raise LocalClusterError(f"cgroup {path} could not be removed")
            time.sleep(0.1)


BRIDGE_ALIAS = "stateward local cluster "


def bridge_owner(slot: Slot) -> Path | None:
    """The state directory of the cluster that made the slot's bridge (from the alias it
    set), or None when there is no bridge or someone else made it."""
    alias = Path("/sys/class/net", slot.bridge, "ifalias")
    try:
        text = alias.read_text().strip()
    except OSError:
        return None
    return Path(text.removeprefix(BRIDGE_ALIAS)) if text.startswith(BRIDGE_ALIAS) else None


def peers(state_dir: Path) -> list[Path]:
    """The state directories of the other clusters with real nodes on this host, by slot."""
    found = (bridge_owner(Slot(number)) for number in range(SLOTS))
    return [owner for owner in found if owner is not None and owner != state_dir]


def refuse_if_taken(slot: Slot) -> None:
    if link_exists(slot.bridge):
        alias = Path("/sys/class/net", slot.bridge, "ifalias")
        owner = alias.read_text().strip() if alias.exists() else ""
        free = [n for n in range(SLOTS) if not link_exists(Slot(n).bridge)]
        elsewhere = f"; or start this one beside it with --slot {free[0]}" if free else ""
        raise LocalClusterError(
            f"the bridge {slot.bridge} already exists ({owner or 'owner unknown'}): another"
            " local cluster with real nodes is up in slot"
            f" {slot.number}; stop it with `stateward local down` (with its --state-dir), or"
            f" start this one with --nodes 0{elsewhere}; if that cluster's state directory is"
            f" gone, `ip link delete {slot.bridge}` and `nft delete table inet {slot.nft_table}`"
            " remove what it left"
        )
    for route in run(["ip", "-4", "route", "show"]).splitlines():
        destination = route.split()[0]
        if destination == "default":
            continue
        with contextlib.suppress(ValueError):
            network = ipaddress.ip_network(destination, strict=False)
            for ours in (
                slot.network,
                ipaddress.ip_network(slot.pod_cidr),
                ipaddress.ip_network(slot.service_cidr),
            ):
                if network.overlaps(ours):
                    raise LocalClusterError(
                        f"the host already routes {network}, which overlaps the local"
                        f" cluster's {ours} (slot {slot.number}); real nodes need that range"
                        " free: pick another --slot"
                    )


def prepare_host(journal: Journal, state_dir: Path, slot: Slot) -> None:
    """The bridge, forwarding confined to it, and the private mount for namespace files.
    (Under the host lock: the bridge exists before the host-wide changes are made, so a
    cluster going down meanwhile hands its own to this one.)"""
    with host_lock():
        journal.record(kind="link", name=slot.bridge)
        run(["ip", "link", "add", slot.bridge, "type", "bridge"])
        run(["ip", "link", "set", slot.bridge, "alias", f"{BRIDGE_ALIAS}{state_dir}"])
        set_sysctl(journal, "net.ipv4.ip_forward", "1")
        for target in (*BIND_TARGETS.values(), *TMPFS_TARGETS):
            make_dir(journal, Path(target))
    run(["ip", "addr", "add", f"{slot.host_ip}/{slot.network.prefixlen}", "dev", slot.bridge])
    run(["ip", "link", "set", slot.bridge, "up"])
    journal.record(kind="nft", table=slot.nft_table)
    run(["nft", "-f", "-"], input=nft_ruleset(slot))
    nodes_dir = state_dir / "nodes"
    nodes_dir.mkdir(parents=True, exist_ok=True)
    # Namespace files may only be bind mounted under a mount that does not propagate
    # (what `ip netns` does for /run/netns): make the nodes directory such a mount.
    journal.record(kind="mount", target=str(nodes_dir))
    run(["mount", "--bind", str(nodes_dir), str(nodes_dir)])
    run(["mount", "--make-private", str(nodes_dir)])


def undo(journal: Journal, state_dir: Path) -> list[str]:
    """Undo a cluster's host changes (``Journal.undo``), handing the host-wide ones to
    another cluster with real nodes when one is up."""
    with host_lock():
        others = peers(state_dir)
        heir = Journal(others[0] / journal.path.name) if others else None
        return journal.undo(heir)


def nft_ruleset(slot: Slot) -> str:
    """Forward only between the bridge's own members: nothing from a pod leaves the host."""
    return f"""\
table inet {slot.nft_table} {{
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname "{slot.bridge}" oifname != "{slot.bridge}" drop
    oifname "{slot.bridge}" iifname != "{slot.bridge}" drop
  }}
}}
"""


def add_route(journal: Journal, destination: str, node: Node) -> None:
    """Route ``destination`` (a node's pod CIDR, or the Service CIDR) through ``node``."""
    journal.record(kind="route", dst=destination)
    run(["ip", "route", "replace", destination, "via", node.ip, "dev", node.slot.bridge])
