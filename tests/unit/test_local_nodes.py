"""Pure parts of the real nodes: addressing, the host-change journal, component configuration."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest

from stateward_local.errors import LocalClusterError
from stateward_local.nodes import daemons, host, layout, lifecycle

pytestmark = pytest.mark.unit


SLOT = layout.Slot()


def node(tmp_path: Path, index: int = 1) -> layout.Node:
    return layout.nodes_in(tmp_path, index, SLOT)[index - 1]


def test_nodes_are_named_from_one_with_addresses_on_the_bridge(tmp_path: Path) -> None:
    found = layout.nodes_in(tmp_path, 3, SLOT)
    assert [n.name for n in found] == ["node-1", "node-2", "node-3"]
    assert [n.ip for n in found] == ["10.250.0.11", "10.250.0.12", "10.250.0.13"]
    assert all(ipaddress.ip_address(n.ip) in SLOT.network for n in found)
    assert SLOT.host_ip == "10.250.0.1" and SLOT.host_ip not in {n.ip for n in found}
    assert [n.veth for n in found] == ["stw0v1", "stw0v2", "stw0v3"]
    assert found[1].directory == tmp_path / "nodes" / "node-2"
    assert found[1].net_ns == tmp_path / "nodes" / "node-2" / "ns" / "net"


def test_a_cluster_in_another_slot_has_its_own_bridge_addresses_table_and_cgroups(
    tmp_path: Path,
) -> None:
    second = layout.Slot(1)
    found = layout.nodes_in(tmp_path, 2, second)
    assert [n.ip for n in found] == ["10.250.1.11", "10.250.1.12"]
    assert [n.veth for n in found] == ["stw1v1", "stw1v2"]
    assert (second.bridge, second.host_ip) == ("stw1", "10.250.1.1")
    assert (second.pod_cidr, second.service_cidr) == ("10.245.0.0/16", "10.97.0.0/16")
    assert second.kubernetes_service_ip == "10.97.0.1"
    assert SLOT.kubernetes_service_ip == "10.96.0.1"
    assert second.nft_table != SLOT.nft_table
    assert second.cgroup_parent != SLOT.cgroup_parent


def test_no_range_or_name_of_any_slot_overlaps_another() -> None:
    slots = [layout.Slot(n) for n in range(layout.SLOTS)]
    ranges = [
        network
        for slot in slots
        for network in (
            slot.network,
            ipaddress.ip_network(slot.pod_cidr),
            ipaddress.ip_network(slot.service_cidr),
        )
    ]
    for index, first in enumerate(ranges):
        for second in ranges[index + 1 :]:
            assert not first.overlaps(second), (first, second)
    for attribute in ("bridge", "nft_table", "cgroup_parent", "host_ip"):
        assert len({getattr(slot, attribute) for slot in slots}) == layout.SLOTS
    # No cgroup parent is a prefix of another's (the e2e stories glob their own).
    parents = [slot.cgroup_parent for slot in slots]
    assert not any(a != b and b.startswith(a) for a in parents for b in parents)
    widest = layout.nodes_in(Path("/"), 9, slots[-1])[-1]
    assert len(widest.veth) <= 15  # IFNAMSIZ


@pytest.mark.parametrize("number", [-1, layout.SLOTS])
def test_a_slot_outside_the_range_is_refused_naming_the_flag(number: int) -> None:
    with pytest.raises(LocalClusterError, match=r"no host slot .*--slot"):
        layout.Slot(number)


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


def test_undo_hands_host_wide_changes_to_a_cluster_that_still_runs(tmp_path: Path) -> None:
    """Sysctls and shared directories are undone by the last cluster to go, back to what
    the host had before the first came; everything else of a cluster is its own to undo."""
    made = tmp_path / "shared"
    first = host.Journal(tmp_path / "first.json")
    host.make_dir(first, made)
    first.record(kind="sysctl", key="net.ipv4.ip_forward", old="0")
    first.record(kind="no-such-change")  # a change of its own: undone (and failing) now
    second = host.Journal(tmp_path / "second.json")
    second.record(kind="sysctl", key="kernel.panic", old="10")
    second.record(kind="dir", path=str(made))  # recorded by both: kept once, first
    problems = first.undo(heir=second)
    assert len(problems) == 1 and "no-such-change" in problems[0]
    assert made.is_dir()  # still there for the second cluster
    assert not first.path.exists()
    assert second.entries() == [
        {"kind": "dir", "path": str(made)},
        {"kind": "sysctl", "key": "net.ipv4.ip_forward", "old": "0"},
        {"kind": "sysctl", "key": "kernel.panic", "old": "10"},
    ]


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


@pytest.mark.parametrize("slot", [layout.Slot(0), layout.Slot(1)])
def test_forwarding_is_confined_to_the_bridge(slot: layout.Slot) -> None:
    rules = host.nft_ruleset(slot)
    assert f"table inet {slot.nft_table}" in rules
    assert f'iifname "{slot.bridge}" oifname != "{slot.bridge}" drop' in rules
    assert f'oifname "{slot.bridge}" iifname != "{slot.bridge}" drop' in rules


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
    assert config["cgroupRoot"] == f"/{SLOT.cgroup_parent}/node-2"
    assert config["address"] == one.ip
    assert config["readOnlyPort"] == 0
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["evictionHard"]["memory.available"] == "1Mi"
    assert config["clusterDNS"] == [SLOT.host_ip]
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
    assert config["clusterCIDR"] == SLOT.pod_cidr
    assert config["conntrack"]["maxPerCore"] == 0
    assert config["conntrack"]["tcpEstablishedTimeout"] == "0s"


def test_cni_config_allocates_from_the_node_pod_cidr() -> None:
    config = daemons.cni_conflist("10.244.3.0/24")
    (plugin,) = config["plugins"]
    assert plugin["type"] == "ptp"
    assert plugin["ipMasq"] is False
    assert plugin["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]


def test_cluster_dns_binds_only_the_bridge_address_and_forwards_nowhere() -> None:
    text = daemons.corefile(Path("/dns.kubeconfig"), SLOT)
    assert f"bind {SLOT.host_ip}" in text
    assert "kubeconfig /dns.kubeconfig" in text
    assert "forward" not in text
