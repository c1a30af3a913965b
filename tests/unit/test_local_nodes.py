"""Pure parts of the real nodes: addressing, the host-change journal, component configuration."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest

from stateward_local.nodes import daemons, host, layout, lifecycle

pytestmark = pytest.mark.unit


def node(tmp_path: Path, index: int = 1) -> layout.Node:
    return layout.nodes_in(tmp_path, index)[index - 1]


def test_nodes_are_named_from_one_with_addresses_on_the_bridge(tmp_path: Path) -> None:
    found = layout.nodes_in(tmp_path, 3)
    assert [n.name for n in found] == ["node-1", "node-2", "node-3"]
    assert [n.ip for n in found] == ["10.250.0.11", "10.250.0.12", "10.250.0.13"]
    assert all(ipaddress.ip_address(n.ip) in layout.NETWORK for n in found)
    assert layout.HOST_IP not in {n.ip for n in found}
    assert [n.veth for n in found] == ["stwv1", "stwv2", "stwv3"]
    assert all(len(n.veth) <= 15 for n in found)  # IFNAMSIZ
    assert found[1].directory == tmp_path / "nodes" / "node-2"
    assert found[1].net_ns == tmp_path / "nodes" / "node-2" / "ns" / "net"


def test_cluster_ranges_do_not_overlap() -> None:
    ranges = [layout.NETWORK, *map(ipaddress.ip_network, (layout.POD_CIDR, layout.SERVICE_CIDR))]
    for index, first in enumerate(ranges):
        for second in ranges[index + 1 :]:
            assert not first.overlaps(second)


def test_journal_keeps_order_and_records_each_change_once(tmp_path: Path) -> None:
    journal = host.Journal(tmp_path / "host.json")
    assert journal.entries() == []
    journal.record(kind="link", name="stw0")
    journal.record(kind="dir", path="/var/lib/kubelet")
    journal.record(kind="link", name="stw0")
    assert journal.entries() == [
        {"kind": "link", "name": "stw0"},
        {"kind": "dir", "path": "/var/lib/kubelet"},
    ]
    # The file is what `down` reads after a crash: it must be complete JSON at every step.
    assert json.loads((tmp_path / "host.json").read_text()) == journal.entries()


def test_journal_undo_reverts_newest_first_and_reports_failures(tmp_path: Path) -> None:
    made = tmp_path / "a" / "b"
    journal = host.Journal(tmp_path / "host.json")
    host.make_dir(journal, made)
    assert made.is_dir()
    assert [e["path"] for e in journal.entries()] == [str(tmp_path / "a"), str(made)]
    journal.record(kind="no-such-change")
    problems = journal.undo()
    assert len(problems) == 1 and "no-such-change" in problems[0]
    assert not (tmp_path / "a").exists()  # b removed before a
    assert not journal.path.exists()


def test_make_dir_records_nothing_for_existing_directories(tmp_path: Path) -> None:
    journal = host.Journal(tmp_path / "host.json")
    host.make_dir(journal, tmp_path)
    assert journal.entries() == []


def test_node_processes_join_the_node_cgroups_then_its_namespaces(tmp_path: Path) -> None:
    one = node(tmp_path)
    argv = lifecycle.wrap(one, ["/bin/kubelet", "--v=1"], path_dirs=[Path("/cache/containerd")])
    assert argv[:2] == ["sh", "-c"]
    script = argv[2]
    assert script.index("cgroup.procs") < script.index("exec")
    assert "/cache/containerd:" in script
    assert argv[4:] == [
        "nsenter",
        f"--net={one.net_ns}",
        f"--mount={one.mount_ns}",
        "--",
        "/bin/kubelet",
        "--v=1",
    ]


def test_forwarding_is_confined_to_the_bridge() -> None:
    rules = host.nft_ruleset()
    assert f"table inet {layout.NFT_TABLE}" in rules
    assert f'iifname "{layout.BRIDGE}" oifname != "{layout.BRIDGE}" drop' in rules
    assert f'oifname "{layout.BRIDGE}" iifname != "{layout.BRIDGE}" drop' in rules


def test_containerd_config_is_per_node_and_works_without_cap_sys_resource(
    tmp_path: Path,
) -> None:
    one = node(tmp_path)
    text = daemons.containerd_config(one, cni_bin_dir=Path("/cni"), sandbox_image="local/pause:1")
    config = tomllib.loads(text)
    assert config["version"] == 3
    assert config["root"] == str(one.path("containerd"))
    assert config["grpc"]["address"] == layout.CONTAINERD_SOCKET
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cni"] == {
        "bin_dirs": ["/cni"],
        "conf_dir": "/etc/cni/net.d",
        "use_internal_loopback": True,
    }
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False
    # Every node's containerd would share NRI's socket on the host: off.
    assert config["plugins"]["io.containerd.nri.v1.nri"] == {"disable": True}
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "local/pause:1"


def test_kubelet_config_keeps_the_node_in_its_cgroup_root_and_never_collects_images(
    tmp_path: Path,
) -> None:
    one = node(tmp_path, 2)
    config = daemons.kubelet_config(one, ca_file=Path("/ca.crt"), resolv_conf=Path("/r"))
    assert config["cgroupRoot"] == "/stateward/node-2"
    assert config["address"] == one.ip
    assert config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["evictionHard"]["memory.available"] == "1Mi"
    assert config["clusterDNS"] == [layout.HOST_IP]
    argv = daemons.kubelet_argv(
        one,
        kubelet=Path("/k"),
        config=Path("/c"),
        kubeconfig=Path("/kc"),
        labels={"b": "2", "a": "1"},
    )
    assert f"--node-ip={one.ip}" in argv
    assert "--hostname-override=node-2" in argv
    assert "--node-labels=a=1,b=2" in argv


def test_kube_proxy_uses_nftables_and_leaves_machine_wide_conntrack_alone(
    tmp_path: Path,
) -> None:
    config = daemons.kube_proxy_config(node(tmp_path), kubeconfig=Path("/kp"))
    assert config["mode"] == "nftables"
    assert config["clusterCIDR"] == layout.POD_CIDR
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["conntrack"]["tcpEstablishedTimeout"] == "0s"


def test_cni_config_allocates_from_the_node_pod_cidr() -> None:
    config = daemons.cni_conflist("10.244.3.0/24")
    (plugin,) = config["plugins"]
    assert plugin["type"] == "ptp"
    assert plugin["ipMasq"] is False
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]


def test_cluster_dns_binds_only_the_bridge_address_and_forwards_nowhere() -> None:
    text = daemons.corefile(Path("/dns.kubeconfig"))
    assert f"bind {layout.HOST_IP}" in text
    assert "kubeconfig /dns.kubeconfig" in text
    assert "forward" not in text
