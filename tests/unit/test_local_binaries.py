"""Pure parts of the binary cache and of the host package check."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import pytest

from stateward_local import binaries
from stateward_local.errors import LocalClusterError
from stateward_local.nodes import daemons, layout, packages

pytestmark = pytest.mark.unit


def _fill(component: binaries.Component, *, skip: str | None = None) -> Path:
    directory = binaries.component_dir(component)
    directory.mkdir(parents=True, exist_ok=True)
    for name in component.outputs:
        if name != skip:
            (directory / name).write_text("")
    return directory


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("STATEWARD_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_cache_dir_lacking_a_binary_is_missing(cache: Path) -> None:
    for component in binaries.COMPONENTS:
        _fill(component)
    assert binaries.missing() == []
    # A cache built before kube-proxy joined the Kubernetes component.
    stale = binaries.component_dir(binaries.KUBERNETES) / "kube-proxy"
    stale.unlink()
    assert binaries.missing() == [binaries.KUBERNETES]
    assert binaries.missing_files(binaries.KUBERNETES) == [stale]
    with pytest.raises(LocalClusterError, match="kube-proxy"):
        binaries.locate()


def test_kwok_without_its_stages_is_missing(cache: Path) -> None:
    _fill(binaries.KWOK, skip="stages.yaml")
    assert binaries.KWOK in binaries.missing()


def test_locate_fills_every_field_once_all_are_built(cache: Path) -> None:
    for component in binaries.COMPONENTS:
        _fill(component)
    found = binaries.locate()
    assert found.kube_proxy.name == "kube-proxy"
    assert found.containerd_shim.name == "containerd-shim-runc-v2"
    assert found.ctr.parent == found.containerd.parent
    assert found.containerd.parent.name.startswith("containerd-v2.4.2-")
    assert found.cni_bin_dir.parent == cache / "bin"
    assert found.cni_bin_dir.name.startswith("cni-plugins-v1.9.1-")
    assert (found.cni_bin_dir / "host-local").is_file()
    assert found.coredns.parent.name.startswith("coredns-v1.15.0-")
    for path in (p for name, p in vars(found).items() if name != "cni_bin_dir"):
        assert path.is_file(), path


def test_a_changed_wrapper_module_builds_into_another_cache_dir(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = tmp_path / "tools"
    shutil.copytree(binaries.tools_dir() / "coredns", tools / "coredns")
    monkeypatch.setenv("STATEWARD_TOOLS_DIR", str(tools))
    before = binaries.component_dir(binaries.COREDNS)
    assert before == binaries.component_dir(binaries.COREDNS), "stable"
    (tools / "coredns" / "README").write_text("not a source")
    assert binaries.component_dir(binaries.COREDNS) == before
    main = tools / "coredns" / "main.go"
    main.write_text(main.read_text() + "\n// one more plugin\n")
    assert binaries.component_dir(binaries.COREDNS) != before
    assert binaries.component_dir(binaries.COREDNS).parent == before.parent == cache / "bin"


def test_new_components_and_their_binary_names() -> None:
    assert binaries.CONTAINERD.binaries == ("containerd", "ctr", "containerd-shim-runc-v2")
    assert binaries.CNI.binaries == ("ptp", "loopback", "bridge", "host-local", "portmap")
    assert binaries.COREDNS.binaries == ("coredns",)
    assert binaries.KUBERNETES.binaries[-1] == "kube-proxy"
    assert binaries.COMPONENTS[-1] is binaries.KUBERNETES, "the slowest build goes last"
    assert len({c.name for c in binaries.COMPONENTS}) == len(binaries.COMPONENTS)


def test_tags_and_ldflags_reach_the_go_argv(tmp_path: Path) -> None:
    argv = binaries.go_build_argv("go", binaries.CONTAINERD, tmp_path)
    tags = argv[argv.index("-tags") + 1].split(",")
    assert {"no_btrfs", "no_devmapper"} <= set(tags)
    ldflags = argv[argv.index("-ldflags") + 1]
    assert "-X github.com/containerd/containerd/v2/version.Version=v2.4.2" in ldflags
    assert argv[argv.index("-o") + 1] == f"{tmp_path}/", "several packages: -o is a directory"
    assert argv[-3:] == list(binaries.CONTAINERD.packages)


def test_untagged_single_binary_argv(tmp_path: Path) -> None:
    argv = binaries.go_build_argv("/usr/bin/go", binaries.ETCD, tmp_path)
    assert "-tags" not in argv
    assert argv[:2] == ["/usr/bin/go", "build"]
    assert "-gcflags=all=-dwarf=false" in argv  # stripped at link anyway; faster to compile
    assert argv[argv.index("-o") + 1] == str(tmp_path / "etcd")
    coredns = binaries.go_build_argv("go", binaries.COREDNS, tmp_path)
    assert coredns[coredns.index("-o") + 1] == str(tmp_path / "coredns")
    assert coredns[-1] == "stateward.io/tools/coredns"


def test_the_coredns_build_links_every_plugin_the_corefile_uses() -> None:
    """The wrapper's main links a chosen few plugins; a Corefile directive it lacks would stop
    CoreDNS at start ("unknown directive"), so every one the local cluster writes is there,
    imported and in the directive order."""
    main = (binaries.tools_dir() / "coredns" / "main.go").read_text()
    imported = set(re.findall(r'"github.com/coredns/coredns/plugin/(\w+)"', main))
    ordered = re.findall(r'"(\w+)"', main.split("var directives = []string{", 1)[1].split("}")[0])
    corefile = daemons.corefile(Path("/k"), layout.Slot(1))
    used = set(re.findall(r"^    (\w+)", corefile, re.MULTILINE))
    assert used == {"bind", "errors", "kubernetes", "cache"}
    assert used <= imported and used <= set(ordered)
    assert set(ordered) == imported


def required(go_mod: str) -> dict[str, str]:
    """The version a go.mod requires of each module (single lines and blocks)."""
    lines = [
        line.split()
        for block in re.findall(r"^require \((.*?)^\)", go_mod, re.MULTILINE | re.DOTALL)
        for line in block.splitlines()
    ]
    lines += [m.split()[1:] for m in re.findall(r"^require [^(\s].*$", go_mod, re.MULTILINE)]
    return {words[0]: words[1] for words in lines if len(words) >= 2 and words[0] != "//"}


def test_required_reads_blocks_and_single_lines() -> None:
    go_mod = "module m\n\nrequire a.io/x v1.0.0\n\nrequire (\n\tb.io/y v0.2.0 // indirect\n)\n"
    assert required(go_mod) == {"a.io/x": "v1.0.0", "b.io/y": "v0.2.0"}


@pytest.mark.parametrize("component", binaries.SHARES_KUBERNETES, ids=lambda c: c.name)
def test_a_component_built_on_kubernetes_libraries_selects_kubernetes_versions(
    component: binaries.Component,
) -> None:
    """Go's build cache shares a compiled package only when its module's selected version
    (and every import's) is the same: one differing x/net recompiles all of client-go."""
    tools = binaries.tools_dir()
    leader = required((tools / binaries.KUBERNETES.module_dir / "go.mod").read_text())
    follower = required((tools / component.module_dir / "go.mod").read_text())
    shared = leader.keys() & follower.keys()
    assert {"k8s.io/client-go", "golang.org/x/net", "google.golang.org/protobuf"} <= shared
    differing = {m: (follower[m], leader[m]) for m in shared if follower[m] != leader[m]}
    assert differing == {}, "run local/align_go_modules.py"


def test_components_sharing_kubernetes_libraries_build_after_the_others() -> None:
    light = [c for c in binaries.COMPONENTS if c is not binaries.KUBERNETES]
    assert light[-len(binaries.SHARES_KUBERNETES) :] == list(binaries.SHARES_KUBERNETES)


def test_missing_tools_map_to_debian_packages() -> None:
    assert packages.packages_for([]) == []
    assert packages.packages_for(["nft", "runc"]) == ["runc", "nftables"]
    assert packages.packages_for(["nsenter", "unshare", "ip"]) == ["iproute2", "util-linux"]
    assert packages.packages_for([packages.LIBC_ARCHIVE]) == ["libc6-dev"]
    with pytest.raises(ValueError, match="docker"):
        packages.packages_for(["docker"])


def test_missing_tools_checks_executables_and_files() -> None:
    present = {"runc", "iptables", "conntrack", "debootstrap", "ip", "nsenter"}
    absent = packages.missing_tools(
        find=lambda name: f"/usr/sbin/{name}" if name in present else None,
        exists=lambda path: False,
    )
    assert absent == ["nft", packages.LIBC_ARCHIVE, "unshare"]
    assert packages.packages_for(absent) == ["nftables", "libc6-dev", "util-linux"]


def test_install_command_names_every_package() -> None:
    command = packages.install_command(["runc", "nftables"], root=False)
    assert command.startswith("sudo apt-get update && ")
    assert command.endswith("apt-get install -y --no-install-recommends runc nftables")
    assert not packages.install_command(["runc"], root=True).startswith("sudo")


def test_without_root_ensure_packages_says_what_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "missing_tools", lambda: ["runc", "nft"])
    monkeypatch.setattr(packages.os, "geteuid", lambda: 1000)
    with pytest.raises(LocalClusterError, match=r"runc, nftables.*sudo apt-get update"):
        packages.ensure_packages(lambda _: None)


def test_ensure_packages_does_nothing_when_all_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "missing_tools", lambda: [])
    assert packages.ensure_packages(lambda _: None) == []


def test_kubernetes_builds_in_a_lane_of_its_own_and_a_failure_in_either_lane_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple[str, str]] = []

    def build(component: binaries.Component, *, progress: object) -> None:
        built.append((component.name, threading.current_thread().name))

    monkeypatch.setattr(binaries, "build", build)
    binaries.build_all(binaries.COMPONENTS, progress=lambda _: None)
    lanes = dict(built)
    assert sorted(lanes) == sorted(c.name for c in binaries.COMPONENTS)
    assert lanes["kubernetes"] == threading.main_thread().name
    assert {lanes[c.name] for c in binaries.COMPONENTS if c is not binaries.KUBERNETES} == {
        "go-build"
    }
    light = [name for name, lane in built if lane == "go-build"]
    assert light == [c.name for c in binaries.COMPONENTS if c is not binaries.KUBERNETES]

    def broken(component: binaries.Component, *, progress: object) -> None:
        if component is binaries.ETCD:
            raise LocalClusterError("go build of etcd failed")

    monkeypatch.setattr(binaries, "build", broken)
    with pytest.raises(LocalClusterError, match="etcd failed"):
        binaries.build_all(binaries.COMPONENTS, progress=lambda _: None)
