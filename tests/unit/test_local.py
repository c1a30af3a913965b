"""Pure parts of the local cluster: ports, process identity, kwok stages, binary cache."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import yaml
from lab import kwok

from stateward_local import binaries
from stateward_local.cluster import Config, LocalCluster
from stateward_local.controlplane import components, processes
from stateward_local.errors import LocalClusterError
from stateward_local.nodes import layout

pytestmark = pytest.mark.unit

STOCK = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .status.phase, operator: In, values: [Running]}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef: {apiGroup: v1, kind: Node}
"""


def test_ports_are_consecutive_from_the_base() -> None:
    ports = components.Ports.from_base(20000)
    assert sorted(vars(ports).values()) == list(range(20000, 20006))
    assert ports.apiserver == 20000


def test_free_port_base_gives_ports_a_server_can_listen_on() -> None:
    base = processes.free_port_base()
    assert base + 6 <= processes.ephemeral_ports().start, "outgoing connections could take it"
    for offset in range(6):
        # As the control plane's servers bind: Go's net.Listen and asyncio both set
        # SO_REUSEADDR, so a port left in TIME_WAIT by a stopped server is free to them.
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", base + offset))
            probe.listen()


def test_a_taken_port_is_never_part_of_a_free_base() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert processes.port_taken(port)
        base = processes.free_port_base(start=port - 3, stop=port + 40)
        assert not base <= port < base + 6


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    assert processes.ephemeral_ports(setting) == range(40000, 50001)
    assert processes.ephemeral_ports(tmp_path / "missing") == range(32768, 61000)


def test_a_process_is_known_by_its_start_time() -> None:
    mine = processes.start_time(os.getpid())
    assert mine is not None
    record = processes.ProcessRecord("me", os.getpid(), mine, "log")
    assert record.alive()
    assert not processes.ProcessRecord("me", os.getpid(), "1", "log").alive(), "a recycled pid"
    assert processes.start_time(2**22 + 12345) is None


def test_product_stages_are_kwok_stock_plus_pvc_expansion_and_no_simulated_roles() -> None:
    documents = list(yaml.safe_load_all(components.compose_stages(STOCK)))
    names = [d["metadata"]["name"] for d in documents]
    assert names == ["pod-complete", "node-initialize", "pvc-resize"]
    assert "stateward.io/role" not in components.compose_stages(STOCK)


def test_test_stages_add_roles_and_failing_jobs_on_top() -> None:
    documents = list(yaml.safe_load_all(kwok.simulate(components.compose_stages(STOCK))))
    names = [d["metadata"]["name"] for d in documents]
    assert names[:3] == ["pod-complete", "node-initialize", "pvc-resize"]
    assert set(names[3:]) == {"stateward-pod-fail", "stateward-simulated-patroni-role"}
    complete = documents[0]["spec"]["selector"]["matchExpressions"]
    assert any(kwok.SIMULATED_FAILURE_SUFFIX in str(e.get("cel", "")) for e in complete), (
        "Job pods meant to fail must not also complete"
    )
    role = next(d for d in documents if d["metadata"]["name"].endswith("patroni-role"))
    assert kwok.ROLE_LABEL in str(role)


def test_binary_names_and_version_flags() -> None:
    assert binaries.Component.binary_name("go.etcd.io/etcd/server/v3") == "etcd"
    assert binaries.KUBERNETES.binaries == (
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
        "kube-proxy",
    )
    flags = binaries.KUBERNETES.ldflags
    assert "k8s.io/component-base/version.gitVersion=v1.37.2" in flags
    assert "k8s.io/client-go/pkg/version.gitMinor=37" in flags


def test_cache_location_and_missing_binaries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path))
    etcd = binaries.component_dir(binaries.ETCD)
    assert etcd.parent == tmp_path / "bin" and etcd.name.startswith("etcd-v3.6.16-")
    assert binaries.missing() == list(binaries.COMPONENTS)
    with pytest.raises(LocalClusterError, match="stateward local build"):
        binaries.locate()


def test_no_go_toolchain_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LocalClusterError, match="Go toolchain is not on PATH"):
        binaries.build(binaries.KWOK, progress=lambda _: None)


def test_the_local_authority_keeps_its_ca_on_disk_and_signs_with_it(tmp_path: Path) -> None:
    from cryptography import x509

    from stateward_local.controlplane import pki as local_pki

    first = local_pki.Authority(tmp_path)
    again = local_pki.Authority(tmp_path)  # loaded, not made anew
    pair = again.issue("user", common_name="someone", groups=("team",))
    ca = x509.load_pem_x509_certificate(first.cert_path.read_bytes())
    issued = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    issued.verify_directly_issued_by(ca)
    assert issued.subject.rfc4514_string() == "O=team,CN=someone"
    assert oct(pair.key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "ca.key").stat().st_mode & 0o777) == "0o600"


def test_stateward_local_is_handed_to_the_local_distribution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stateward.cli import main

    with pytest.raises(SystemExit) as exited:
        main.main(["local", "--help"])
    assert exited.value.code == 0
    assert "node" in capsys.readouterr().out, "the local cluster's own verbs"


def test_stateward_local_without_the_distribution_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As in the operator's image, which carries only the stateward wheel."""
    import importlib

    from stateward.cli import main

    real = importlib.import_module

    def without_local(name: str, package: str | None = None) -> object:
        if name.startswith("stateward_local"):
            raise ModuleNotFoundError(f"No module named {name!r}", name="stateward_local")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_local)
    assert main.main(["local", "up"]) == 2
    error = capsys.readouterr().err
    assert "stateward-local" in error and "make venv" in error and "pip install ./local" in error
    assert error.count("\n") == 1, "one line"


def test_the_slot_comes_from_the_flag_or_the_environment_and_reaches_the_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stateward_local.cli import _local_config, build_parser

    monkeypatch.setenv("STATEWARD_LOCAL_SLOT", "2")
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path / "cache"))
    for component in binaries.COMPONENTS:  # a built cache, without building one
        (directory := binaries.component_dir(component)).mkdir(parents=True)
        for name in component.outputs:
            (directory / name).touch()
    assert Config.default(state_dir=tmp_path).slot == layout.Slot(2)
    args = build_parser().parse_args(["up", "--state-dir", str(tmp_path), "--slot", "1"])
    config = _local_config(args)
    assert config.slot == layout.Slot(1) and config.kwok_nodes == 3
    cluster = LocalCluster(config)
    assert cluster.slot == layout.Slot(1) and cluster.plane.slot == layout.Slot(1)
    argv = components.controller_manager_argv(cluster.plane, binaries.locate())
    assert "--cluster-cidr=10.245.0.0/16" in argv
    assert "--service-cluster-ip-range=10.97.0.0/16" in argv
    # `down` and the node verbs find the slot in the state a running cluster wrote.
    (tmp_path / "state.json").write_text('{"real_nodes": 2, "slot": 3, "processes": []}')
    assert [n.veth for n in LocalCluster(Config.default(state_dir=tmp_path)).real_nodes()] == [
        "stw3v1",
        "stw3v2",
    ]


def test_a_slot_flag_outside_the_range_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stateward_local.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--slot", "4"])
    assert "--slot: invalid choice: 4" in capsys.readouterr().err


def test_side_by_side_returns_both_results_and_reraises_the_background_failure() -> None:
    import threading

    from stateward_local import lanes

    names: list[str] = []
    result = lanes.side_by_side(
        lambda: names.append(threading.current_thread().name) or 1, lambda: 2, name="lane"
    )
    assert result == (1, 2) and names == ["lane"]
    finished: list[str] = []

    def broken() -> None:
        raise LocalClusterError("go build failed")

    with pytest.raises(LocalClusterError, match="go build failed"):
        lanes.side_by_side(broken, lambda: finished.append("images"), name="lane")
    assert finished == ["images"]  # the foreground ran to its end first
