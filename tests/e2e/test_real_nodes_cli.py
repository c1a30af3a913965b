"""Real nodes as a user drives them: `local up`, `kubectl run`, node drills, `local down`.

`local down` must leave the host as it found it — links, addresses, routes, the nftables
ruleset, mounts, cgroups, sysctls and directories — after a clean run and after a crash.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from lab.slots import STORY_SLOT
from lab.waiting import wait_for

from stateward_local import binaries
from stateward_local.controlplane.processes import free_port_base
from stateward_local.images import catalog
from stateward_local.nodes import host, layout

pytestmark = pytest.mark.e2e


def host_snapshot() -> dict[str, Any]:
    """The host as the stories may change it: all of it, less what the clusters with real
    nodes in other slots hold (the workers' shared clusters come and go meanwhile).
    ``shared`` (sysctls, the directories the node components hard-code) belongs to every
    cluster on the host: see ``assert_restored``."""

    def out(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    slot = STORY_SLOT
    foreign = [layout.Slot(n) for n in range(layout.SLOTS) if n != slot.number]
    owners = [str(o) for o in map(host.bridge_owner, foreign) if o is not None]

    def ours(name: str) -> bool:  # a link's name: the bridge, or a veth named after it
        return not name.startswith(tuple(s.bridge for s in foreign))

    def own_route(line: str) -> bool:
        device = re.search(r"\bdev (\S+)", line)
        return device is None or ours(device[1])

    tables = re.split(r"(?m)^(?=table )", out("nft", "list", "ruleset"))
    cgroups = sorted(
        str(path)
        for hierarchy in host.cgroup_hierarchies()
        for path in hierarchy.glob("stateward*")
        if path.name not in {s.cgroup_parent for s in foreign}
    )
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = sorted(
            target
            for line in mountinfo
            if not (target := line.split()[4]).startswith(tuple(f"{o}/" for o in owners))
        )
    return {
        "links": sorted(
            name
            for line in out("ip", "-o", "link").splitlines()
            if ours(name := line.split(":")[1].strip())
        ),
        "addresses": [a for a in out("ip", "-o", "addr").splitlines() if ours(a.split()[1])],
        "routes": [
            r for r in out("ip", "route", "show", "table", "all").splitlines() if own_route(r)
        ],
        "nft": [
            t
            for t in tables
            if not t.startswith(tuple(f"table inet {s.nft_table} " for s in foreign))
        ],
        "mounts": mounts,
        "cgroups": cgroups,
        "others": owners,
        "shared": {
            "sysctls": {
                key: host.read_sysctl(key)
                for key in ("net.ipv4.ip_forward", *layout.KERNEL_TUNABLES)
            },
            "dirs": {
                target: Path(target).exists()
                for target in (*layout.BIND_TARGETS.values(), *layout.TMPFS_TARGETS)
            },
        },
    }


def assert_restored(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Everything of the story's slot is as it was. The host-wide part is too, unless
    another cluster with real nodes came or went meanwhile: the last cluster to go restores
    it, so while the other worker's cluster runs it keeps what that cluster needs."""
    if before["others"] != after["others"]:
        before, after = ({**s, "shared": None} for s in (before, after))
    assert after == before


class Cli:
    def __init__(self, tmp_path: Path) -> None:
        self.state_dir = tmp_path / "local"
        self.env = {
            **os.environ,
            "STATEWARD_LOCAL_DIR": str(self.state_dir),
            "STATEWARD_LOCAL_PORT_BASE": str(free_port_base()),
            "STATEWARD_LOCAL_SLOT": str(STORY_SLOT.number),
            "KUBECONFIG": str(self.state_dir / "kubeconfig"),
        }

    def stateward(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "stateward", "local", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(binaries.locate().kubectl), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def up(self) -> None:
        result = self.stateward("up", "--nodes", "1", "--kwok-nodes", "0")
        assert result.returncode == 0, result.stderr[-3000:]


def crash(cli: Cli) -> None:
    """Every process of the cluster, containers included, killed at once; no `down`."""
    state = json.loads((cli.state_dir / "state.json").read_text())
    for process in state["processes"]:
        os.kill(process["pid"], signal.SIGKILL)
    for node in layout.nodes_in(cli.state_dir, 1, STORY_SLOT):
        for path in host.cgroup_paths(node):
            for pid in host.cgroup_pids(path):
                os.kill(pid, signal.SIGKILL)


def test_kubectl_run_on_a_real_node_then_down_restores_the_host(tmp_path: Path) -> None:
    before = host_snapshot()
    cli = Cli(tmp_path)
    cli.up()
    try:
        nodes_out = cli.kubectl("get", "nodes", "-o", "wide")
        assert "node-1" in nodes_out.stdout and " Ready " in nodes_out.stdout
        run = cli.kubectl(
            "run", "hello", f"--image={catalog.BASE_REF}", "--image-pull-policy=Never",
            "--restart=Never", "--", "bash", "-c", "echo hello from $(hostname)",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        wait_for(
            lambda: (
                cli.kubectl("get", "pod", "hello", "-o", "jsonpath={.status.phase}").stdout
                == "Succeeded"
            ),
            what="the kubectl-run pod to succeed",
            timeout=90,
        )
        assert cli.kubectl("logs", "hello").stdout.strip() == "hello from hello"

        status = cli.stateward("status")
        assert status.returncode == 0, status.stdout
        assert "node node-1" in status.stdout and "running" in status.stdout
        stop = cli.stateward("node", "stop", "node-1")
        assert stop.returncode == 0, stop.stderr
        assert "powered off" in stop.stdout
        assert "stopped" in cli.stateward("status").stdout
        unknown = cli.stateward("node", "freeze", "node-9")
        assert unknown.returncode == 1
        assert "no real node 'node-9'; the real nodes are: node-1" in unknown.stderr
        start = cli.stateward("node", "start", "node-1")
        assert start.returncode == 0, start.stderr
        wait_for(
            lambda: cli.kubectl(
                "get", "node", "node-1", "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
            ).stdout == "True",
            what="node-1 Ready after start",
            timeout=120,
        )  # fmt: skip
    finally:
        down = cli.stateward("down")
    assert down.returncode == 0, down.stderr
    assert_restored(before, host_snapshot())


def test_a_second_cluster_is_refused_while_the_first_runs_and_takes_over_after_it_crashed(
    tmp_path: Path,
) -> None:
    """Only one cluster with real nodes fits a host: a second is refused with the way out
    while the first runs. A first that crashed (its session killed, no `down`) must not
    leave the host unusable: the next `up` undoes what it left and starts. And when that one
    crashes too, its `down` alone restores the host and removes its state."""
    before = host_snapshot()
    first = Cli(tmp_path / "first")
    first.up()
    second = Cli(tmp_path / "second")
    try:
        refused = second.stateward("up", "--nodes", "1", "--kwok-nodes", "0")
        assert refused.returncode == 1
        assert f"the bridge {STORY_SLOT.bridge} already exists" in refused.stderr
        assert "stateward local down" in refused.stderr
        assert not second.state_dir.exists() or not any(
            p.name != "logs" for p in second.state_dir.iterdir()
        )
        crash(first)
        up = second.stateward("up", "--nodes", "1", "--kwok-nodes", "0")
        assert up.returncode == 0, up.stderr[-3000:]
        undone = f"a local cluster that crashed left on this host ({first.state_dir})"
        assert undone in up.stderr
        assert not first.state_dir.exists()
        assert host.bridge_owner(STORY_SLOT) == second.state_dir.resolve()
        crash(second)
        down = second.stateward("down")
        assert down.returncode == 0, down.stderr
        assert_restored(before, host_snapshot())
        assert not second.state_dir.exists()
    finally:
        for cli in (second, first):
            assert cli.stateward("down").returncode == 0
    assert_restored(before, host_snapshot())
