"""``kubectl stateward`` as a user runs it: the installed console script, through kubectl's
plugin lookup, against the real control plane (kwok nodes: no instance streams, so a
switchover is refused — which is what the plugin must report)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from lightkube import Client

from stateward.cli.run import OperatorProcess
from stateward.local import binaries
from stateward.local.cluster import LocalCluster
from tests.integration.conftest import wait_phase

pytestmark = pytest.mark.integration


def kubectl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl ARGS`` with the venv's bin first on PATH, so kubectl finds the plugin there."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        [str(binaries.locate().kubectl), *args],
        env={**os.environ, "PATH": path, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_plugin_reports_refuses_and_explains(
    control_plane: LocalCluster,
    kube: Client,
    namespace: str,
    make_cluster: Callable[..., str],
    operator: OperatorProcess,
) -> None:
    name = make_cluster()
    wait_phase(kube, name, namespace, "Ready", timeout=120)

    shown = kubectl(control_plane, "stateward", "-n", namespace, "status", name)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"PostgresCluster {namespace}/{name}: Ready")
    assert "AllInstancesReady" in shown.stdout and f"primary {name}-0" in shown.stdout

    missing = kubectl(control_plane, "stateward", "-n", namespace, "status", "nope")
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        f"kubectl stateward: postgrescluster 'nope' in namespace '{namespace}' not found"
    )

    refused = kubectl(control_plane, "stateward", "-n", namespace, "switchover", name)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "switchover failed: no ready, streaming replica" in refused.stdout
