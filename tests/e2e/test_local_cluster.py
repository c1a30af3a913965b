"""`stateward local up | status | down` as a user runs them, including the bad situations."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.waiting import wait_for

from stateward_local import binaries
from stateward_local.controlplane.processes import free_port_base

pytestmark = pytest.mark.e2e

KUBECTL_TIMEOUT = 60


def stateward(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stateward", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    # The control-plane lifecycle on kwok nodes only; real nodes have their own e2e tests
    # (tests/e2e/test_real_nodes_cli.py), and only one cluster with real nodes fits a host.
    env = {
        **os.environ,
        "STATEWARD_LOCAL_PORT_BASE": str(free_port_base()),
        "STATEWARD_LOCAL_NODES": "0",
    }
    env.pop("STATEWARD_LOCAL_DIR", None)
    yield tmp_path, env
    stateward("local", "down", cwd=tmp_path, env=env)


def _pids(state_dir: Path) -> list[int]:
    return [p["pid"] for p in json.loads((state_dir / "state.json").read_text())["processes"]]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return status not in ("Z", "X")


def test_up_status_down_lifecycle(workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    up = stateward("local", "up", cwd=cwd, env=env)
    assert up.returncode == 0, up.stderr
    kubeconfig = cwd / ".stateward" / "local" / "kubeconfig"
    assert str(kubeconfig) in up.stderr + up.stdout

    nodes = subprocess.run(
        [
            str(binaries.locate().kubectl),
            "--kubeconfig",
            str(kubeconfig),
            "get",
            "nodes",
            "--no-headers",
        ],
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT,
        check=True,
    ).stdout.splitlines()
    assert len(nodes) == 3
    assert all(line.split()[1] == "Ready" for line in nodes), nodes

    status = stateward("local", "status", cwd=cwd, env=env)
    assert status.returncode == 0
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        assert any(
            line.startswith(name) and "running" in line for line in status.stdout.splitlines()
        )

    again = stateward("local", "up", cwd=cwd, env=env)
    assert again.returncode != 0
    assert "already running" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1

    pids = _pids(cwd / ".stateward" / "local")
    # One component dies: status says which, and says so with a non-zero exit.
    os.kill(pids[-1], signal.SIGKILL)
    wait_for(lambda: not _alive(pids[-1]), what="kwok to die")
    dead = stateward("local", "status", cwd=cwd, env=env)
    assert dead.returncode == 1
    assert any(line.startswith("kwok") and "DEAD" in line for line in dead.stdout.splitlines())

    down = stateward("local", "down", cwd=cwd, env=env)
    assert down.returncode == 0, down.stderr
    assert not any(_alive(pid) for pid in pids)
    assert not (cwd / ".stateward" / "local").exists()


def test_stale_state_is_refused_with_the_fix(workdir: tuple[Path, dict[str, str]]) -> None:
    cwd, env = workdir
    state = cwd / ".stateward" / "local"
    state.mkdir(parents=True)
    (state / "state.json").write_text(
        '{"processes": [{"name": "etcd", "pid": 999999, "start_time": "1", "log": "x"}]}'
    )
    stale = stateward("local", "up", cwd=cwd, env=env)
    assert stale.returncode == 1
    assert "stale state" in stale.stderr and "stateward local down" in stale.stderr
    assert stateward("local", "down", cwd=cwd, env=env).returncode == 0
    assert not state.exists()


def test_taken_port_is_refused_and_nothing_is_left_running(
    workdir: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = workdir
    base = int(env["STATEWARD_LOCAL_PORT_BASE"])
    with socket.socket() as squatter:
        # The port may be in TIME_WAIT from the previous test's cluster on the same base
        # (free_port_base counts such ports free, as every server here binds with reuse).
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", base + 1))
        squatter.listen()
        taken = stateward("local", "up", cwd=cwd, env=env)
    assert taken.returncode == 1
    assert f"etcd_client ({base + 1})" in taken.stderr
    assert len(taken.stderr.strip().splitlines()) == 1
    assert not (cwd / ".stateward" / "local" / "state.json").exists()


def test_missing_binary_is_named(workdir: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    cwd, env = workdir
    empty = tmp_path / "no-tools"
    empty.mkdir()
    env = {**env, "STATEWARD_CACHE_DIR": str(tmp_path / "empty-cache"), "PATH": str(empty)}
    missing = stateward("local", "up", cwd=cwd, env=env)
    assert missing.returncode == 1
    assert "Go toolchain is not on PATH" in missing.stderr
    assert not (cwd / ".stateward" / "local" / "state.json").exists()
