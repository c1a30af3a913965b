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
from lab.dataplane import (
    client_of,
    create_cluster,
    fresh_namespace,
    operator_on,
    ready,
    roles,
)
from lab.waiting import wait_for
from lightkube import Client

from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.run import OperatorProcess
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


def test_every_verb_against_a_real_cluster(real_cluster: LocalCluster) -> None:
    """status, switchover, psql and logs on the real nodes (backup and fence/unfence have
    their own real-node stories: tests/integration/test_backups.py, test_faults.py)."""
    client = client_of(real_cluster)
    with operator_on(real_cluster, client, "plugin-operator"), fresh_namespace(client) as ns:
        create_cluster(client, ns, "verbs", replicas=2)
        first = ready(client, ns, "verbs")["status"]["primaryPod"]
        wait_for(
            lambda: sorted(roles(client, ns, "verbs").values()) == ["primary", "sync_standby"],
            what="a synchronous standby",
            timeout=120,
        )

        shown = kubectl(real_cluster, "stateward", "-n", ns, "status", "verbs")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"PostgresCluster {ns}/verbs: Ready")
        assert "sync_standby" in shown.stdout and first in shown.stdout

        other = "verbs-1" if first == "verbs-0" else "verbs-0"
        moved = kubectl(real_cluster, "stateward", "-n", ns, "switchover", "verbs", "--to", other)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert ready(client, ns, "verbs")["status"]["primaryPod"] == other

        answer = kubectl(real_cluster, "stateward", "-n", ns, "psql", "verbs", "--",
                         "-tAc", "select pg_is_in_recovery()")  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip() == "f", "psql did not reach the new primary"
        replica = kubectl(real_cluster, "stateward", "-n", ns, "psql", "verbs", "--replica", "--",
                          "-tAc", "select pg_is_in_recovery()")  # fmt: skip
        assert replica.stdout.strip() == "t", replica.stderr

        logs = kubectl(real_cluster, "stateward", "-n", ns, "logs", "verbs")
        assert logs.returncode == 0, logs.stderr
        prefixes = {line.split("]", 1)[0] + "]" for line in logs.stdout.splitlines()}
        assert prefixes == {"[verbs-0]", "[verbs-1]"}, sorted(prefixes)[:5]
