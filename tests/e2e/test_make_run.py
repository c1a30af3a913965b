"""The main job as a user runs it: `stateward local run` (what `make run` calls)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from lab.slots import STORY_SLOT
from lab.waiting import wait_for

from stateward_local import binaries
from stateward_local.controlplane.processes import free_port_base

pytestmark = pytest.mark.e2e


def local(tmp_path: Path, env: dict[str, str], verb: str) -> subprocess.CompletedProcess[str]:
    """`stateward local VERB` against the run's state directory."""
    return subprocess.run(
        [sys.executable, "-m", "stateward", "local", verb],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def start_run(
    tmp_path: Path, *, real_nodes: int = 3
) -> tuple[subprocess.Popen[str], list[str], dict[str, str]]:
    """`stateward local run` in its own state directory and ports; its output lines as read."""
    env = {
        **os.environ,
        "STATEWARD_LOCAL_PORT_BASE": str(free_port_base()),
        "STATEWARD_LOCAL_DIR": str(tmp_path / "local"),
        "STATEWARD_LOCAL_NODES": str(real_nodes),
        "STATEWARD_LOCAL_SLOT": str(STORY_SLOT.number),
        "PYTHONFAULTHANDLER": "1",  # a stuck run shows its threads' stacks on SIGABRT
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "stateward", "local", "run"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As in a terminal, Ctrl-C must reach it: a pytest-xdist worker can run with SIGINT
        # ignored, and a child inherits that (Python then never raises KeyboardInterrupt;
        # two-worker runs hung here, the run's stack in time.sleep of its status loop).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    threading.Thread(
        target=lambda: [lines.append(line) for line in process.stdout or []], daemon=True
    ).start()
    return process, lines, env


def test_run_brings_a_sample_cluster_to_ready_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    process, lines, env = start_run(tmp_path)
    try:
        ready = wait_for(
            lambda: next(
                (
                    m
                    for line in lines
                    if (m := re.search(r"phase=Ready ready=3/3 primary=(\S+)", line))
                ),
                None,
            ),
            what="the sample cluster to be shown Ready",
            timeout=240,
        )
        primary = ready.group(1)
        kubeconfig = tmp_path / "local" / "kubeconfig"
        # The run proves replication itself and says how to connect, without the password.
        checked = wait_for(
            lambda: next((line for line in lines if "Replication:" in line), None),
            what="the replication check line",
            timeout=90,
        )
        assert f"written on the primary {primary} was read back on the replica" in checked
        # Beside it, the sample MariaDB Database: a primary (whichever server answered first:
        # the pods start in parallel) and a replicating replica.
        wait_for(
            lambda: any(
                re.search(r"shop \(Database mariadb\): phase=Running ready=2/2 primary=shop-[01]\b",
                          line)
                for line in lines
            ),
            what="the sample MariaDB Database shown Running",
            timeout=240,
        )  # fmt: skip
        assert any("sample-app" in line and "base64 -d" in line for line in lines)
        # A real database: Patroni elected the primary the status names, the others replay.
        for pod in ("sample-0", "sample-1", "sample-2"):
            recovery = subprocess.run(
                [
                    str(binaries.locate().kubectl), f"--kubeconfig={kubeconfig}", "exec", pod,
                    "--", "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-tAc",
                    "select pg_is_in_recovery()",
                ],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert recovery.stdout.strip() == ("f" if pod == primary else "t"), recovery.stderr
        shown = subprocess.run(
            [str(binaries.locate().kubectl), f"--kubeconfig={kubeconfig}", "get", "pgc", "-A"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        header, row = shown.splitlines()[:2]
        assert header.split()[:7] == [
            "NAMESPACE",
            "NAME",
            "VERSION",
            "REPLICAS",
            "READY",
            "PHASE",
            "PRIMARY",
        ]
        assert row.split()[1:7] == ["sample", "15", "3", "3", "Ready", primary]
        status = local(tmp_path, env, "status")
        assert any(
            line.startswith("operator") and "running" in line for line in status.stdout.splitlines()
        ), status.stdout
        process.send_signal(signal.SIGINT)
        # The operator gets 15 s to stop gracefully before it is killed; the rest is room for
        # a busy machine (a two-worker CI run once needed more than 30 s).
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # its stacks, into the lines read
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            pytest.fail(
                "Ctrl-C did not stop the run in 90 s; its last output:\n" + "".join(lines[-60:])
            )
        assert code == 0
        assert any("cluster keeps running" in line for line in lines)
        after = local(tmp_path, env, "status")
        assert after.returncode == 0, after.stdout
        assert not any(line.startswith("operator") for line in after.stdout.splitlines())

    finally:
        if process.poll() is None:
            process.kill()
        local(tmp_path, env, "down")


def test_down_stops_an_operator_whose_run_was_killed(tmp_path: Path) -> None:
    # Only the operator matters here: no real nodes, so it runs beside other tests' clusters.
    process, lines, env = start_run(tmp_path, real_nodes=0)
    try:
        wait_for(
            lambda: any("Applied the sample" in line for line in lines),
            what="the operator to be started",
            timeout=180,
        )
        state = json.loads((tmp_path / "local" / "state.json").read_text())
        operator_pid = next(p["pid"] for p in state["processes"] if p["name"] == "operator")
        process.kill()  # `make run` dies without cleaning up
        process.wait(timeout=30)
        assert Path(f"/proc/{operator_pid}").exists()
    finally:
        down = local(tmp_path, env, "down")
    assert "operator" in down.stdout
    wait_for(
        lambda: (
            not Path(f"/proc/{operator_pid}").exists()
            or Path(f"/proc/{operator_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        ),
        what="the orphaned operator to be stopped",
    )
