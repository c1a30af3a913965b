"""A node's life: its namespaces (network, and a mount namespace in which the paths the
components hard-code are the node's own directories), the wrapper that starts a process
inside them, and the drills: power off, freeze, partition.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from stateward_local.errors import LocalClusterError
from stateward_local.nodes.host import (
    cgroup_paths,
    create_cgroups,
    daemon_cgroup_procs,
    freezer_path,
    is_mountpoint,
    kill_cgroup,
    link_exists,
    peers,
    run,
)
from stateward_local.nodes.layout import (
    BIND_TARGETS,
    CONTAINERD_SOCKET,
    PATH,
    TMPFS_TARGETS,
)

if TYPE_CHECKING:
    from stateward_local.nodes.host import Journal
    from stateward_local.nodes.layout import Node


def in_node(node: Node, argv: list[str], *, check: bool = True) -> str:
    """Run a command inside the node's network and mount namespaces."""
    return run(
        ["nsenter", f"--net={node.net_ns}", f"--mount={node.mount_ns}", "--", *argv], check=check
    )


def create_node(journal: Journal, node: Node) -> None:
    """Namespaces, link and cgroups of a node (the processes come later)."""
    (node.directory / "ns").mkdir(parents=True, exist_ok=True)
    for key in (*BIND_TARGETS, "containerd", "logs"):
        node.path(key).mkdir(parents=True, exist_ok=True)
    node.net_ns.touch()
    journal.record(kind="mount", target=str(node.net_ns))
    run(["unshare", f"--net={node.net_ns}", "true"])
    journal.record(kind="link", name=node.veth)
    run(
        [
            "ip", "link", "add", node.veth, "type", "veth",
            "peer", "name", "eth0", "netns", str(node.net_ns),
        ]
    )  # fmt: skip
    slot = node.slot
    run(["ip", "link", "set", node.veth, "master", slot.bridge, "up"])
    for argv in (
        ["ip", "link", "set", "lo", "up"],
        ["ip", "addr", "add", f"{node.ip}/{slot.network.prefixlen}", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "route", "add", "default", "via", slot.host_ip],
        ["sysctl", "-qw", "net.ipv4.ip_forward=1"],
    ):
        run(["nsenter", f"--net={node.net_ns}", "--", *argv])
    create_cgroups(journal, node)
    create_mount_ns(journal, node)


def create_mount_ns(journal: Journal, node: Node) -> None:
    """A fresh mount namespace whose hard-coded paths are the node's own directories."""
    node.mount_ns.touch()
    journal.record(kind="mount", target=str(node.mount_ns))
    run(["unshare", f"--mount={node.mount_ns}", "--propagation", "private", "true"])
    nodes_dir = node.directory.parent
    # The copy of the host's mounts includes every node's namespace files, this cluster's
    # and any other's on the host; dropping them here keeps one node's namespaces from
    # pinning another's after it is powered off. Whether each is mounted is asked inside
    # the namespace: another cluster on the host (a parallel test worker) may mount or
    # unmount its directory between the copy and a look from the host, and an unmount of
    # what the copy lacks failed this node's start (a clean-clone CI run).
    others = [p / "nodes" for p in peers(nodes_dir.parent)]
    script = [
        *(f"if mountpoint -q {d}; then umount -l {d}; fi" for d in (nodes_dir, *others)),
        # The kubelet needs shared propagation for volume mounts; inside this namespace only.
        "mount --make-rshared /",
    ]
    for key, target in BIND_TARGETS.items():
        script.append(f"mount --bind {node.path(key)} {target}")
    for target in TMPFS_TARGETS:
        script.append(f"mount -t tmpfs -o mode=0755 tmpfs {target}")
    run(["nsenter", f"--mount={node.mount_ns}", "--", "sh", "-ec", "; ".join(script)])


def containerd_socket(pid: int) -> Path:
    """The node's containerd socket as the host sees it, through a process of the node."""
    return Path(f"/proc/{pid}/root{CONTAINERD_SOCKET}")


def destroy_mount_ns(node: Node) -> None:
    """Drop the node's mount namespace: with no process left in it, every mount in it
    (pod network namespaces, volume mounts) goes with it, as at power loss."""
    if is_mountpoint(node.mount_ns):
        run(["umount", "-l", str(node.mount_ns)])


def wrap(node: Node, argv: list[str], *, path_dirs: Iterable[Path] = ()) -> list[str]:
    """``argv`` as a node process: in the node's cgroups, then its namespaces."""
    procs = " ".join(str(p) for p in daemon_cgroup_procs(node))
    search = ":".join([*(str(d) for d in path_dirs), PATH])
    script = f'echo $$ | tee {procs} >/dev/null && export PATH={search} && exec "$@"'
    return [
        "sh",
        "-c",
        script,
        node.name,
        "nsenter",
        f"--net={node.net_ns}",
        f"--mount={node.mount_ns}",
        "--",
        *argv,
    ]


def set_link(node: Node, *, up: bool) -> None:
    run(["ip", "link", "set", node.veth, "up" if up else "down"])


def link_up(node: Node) -> bool:
    flags = Path("/sys/class/net", node.veth, "flags")
    return flags.exists() and bool(int(flags.read_text(), 16) & 1)


def set_frozen(node: Node, *, frozen: bool, timeout: float = 60.0) -> None:
    """Freeze (or thaw) every process of ``node`` and wait until the kernel says it is done.

    The v1 freezer stays FREEZING while a task sits where it cannot be frozen (in
    uninterruptible I/O, say, which a busy host makes common); writing FROZEN again retries
    them, so the request is repeated until it holds. A node that will not freeze is thawed
    again before the error, never left half frozen."""
    path = freezer_path(node)
    if path is None:
        raise LocalClusterError("no cgroup freezer on this host: `node freeze` needs one")
    state = path / "freezer.state"
    want = "FROZEN" if frozen else "THAWED"
    deadline = time.monotonic() + timeout
    retry = 0.0
    while state.read_text().strip() != want:
        now = time.monotonic()
        if now > deadline:
            if frozen:
                state.write_text("THAWED")
            raise LocalClusterError(
                f"{node.name} did not reach {want} in {timeout:.0f}s"
                f" (it is {state.read_text().strip()})"
            )
        if now >= retry:
            state.write_text(want)
            retry = now + 0.5
        time.sleep(0.05)


def frozen(node: Node) -> bool:
    path = freezer_path(node)
    return (
        path is not None
        and (path / "freezer.state").exists()
        and ((path / "freezer.state").read_text().strip() != "THAWED")
    )


def power_off(node: Node) -> None:
    """Power loss: the link goes down and every process of the node dies at once."""
    if link_exists(node.veth):
        set_link(node, up=False)
    kill_cgroup(cgroup_paths(node))
    destroy_mount_ns(node)
