"""The exec client's pure parts: the URL, exit codes, the in-cluster configuration."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import pytest

from stateward.instance import podexec

pytestmark = pytest.mark.unit


def test_exec_url_carries_every_argument_in_order() -> None:
    url = podexec.exec_url(
        "https://10.96.0.1:443", "db", "demo-0", "postgres", ["pgbackrest", "backup", "--type=full"]
    )
    parsed = urllib.parse.urlparse(url)
    assert parsed.scheme == "wss"
    assert parsed.netloc == "10.96.0.1:443"
    assert parsed.path == "/api/v1/namespaces/db/pods/demo-0/exec"
    query = urllib.parse.parse_qsl(parsed.query)
    assert [v for k, v in query if k == "command"] == ["pgbackrest", "backup", "--type=full"]
    assert ("container", "postgres") in query
    assert ("stdout", "true") in query and ("stderr", "true") in query
    assert not any(k == "stdin" for k, _ in query)


def test_exit_code_from_the_final_status() -> None:
    assert podexec.exit_code({"status": "Success"}) == 0
    failure = {
        "status": "Failure",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "82"}]},
    }
    assert podexec.exit_code(failure) == 82


def test_a_status_without_exit_code_is_an_exec_error() -> None:
    with pytest.raises(podexec.ExecError, match="container not found"):
        podexec.exit_code({"status": "Failure", "message": 'container not found ("x")'})


def test_in_cluster_configuration(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "namespace").write_text("db")
    (tmp_path / "ca.crt").write_text("pem")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    api = podexec.InCluster.load(env, tmp_path)
    assert api.server == "https://10.96.0.1:443"
    assert api.token == "tok"
    assert api.namespace == "db"
    assert "tok" not in repr(api)
    ipv6 = podexec.InCluster.load({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    assert ipv6.server == "https://[fd00::1]:443"


def test_outside_a_pod_the_error_says_where_it_runs(tmp_path: Path) -> None:
    with pytest.raises(podexec.ExecError, match="backup Job"):
        podexec.InCluster.load({}, tmp_path)
