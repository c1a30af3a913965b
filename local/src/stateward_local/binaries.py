"""Cluster binaries, built from the Go module proxy once and cached outside the repository.

Each component is a small wrapper Go module under ``tools/`` (package data of
``stateward_local``, installed with the wheel) that pins one upstream release:
the control plane (Kubernetes, etcd), kwok for simulated nodes, containerd, the CNI plugins
and CoreDNS for real nodes, versitygw (the S3 store of local backups) and Helm (the chart's
tests). The build lands in
``$STATEWARD_CACHE_DIR/bin/<component>-<version>/`` (default ``~/.cache/stateward``). Builds
write to a ``.partial`` sibling and rename it into place only when every binary is linked; a
directory that lacks one of its component's files (an older cache, built before a binary was
added to the component) counts as missing and is rebuilt.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from stateward_local import errors, lanes

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
CONTAINERD_VERSION = "v2.4.2"
CNI_PLUGINS_VERSION = "v1.9.1"
COREDNS_VERSION = "v1.15.0"
VERSITYGW_VERSION = "v1.8.0"
HELM_VERSION = "v4.3.2"

# kwok's stock stage sets, copied next to the kwok binary when it is built (they live in the
# kwok module, not in its binary). Loading any Stage replaces kwok's built-in defaults, so the
# node, pod and volume sets are loaded together.
KWOK_STAGE_DIRS = (
    "kustomize/stage/node/fast",
    "kustomize/stage/node/heartbeat-with-lease",
    "kustomize/stage/pod/fast",
    "kustomize/stage/volume/fast",
)

Progress = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Component:
    """One wrapper module and the binaries it produces."""

    name: str
    version: str
    module_dir: str
    packages: tuple[str, ...]
    ldflags: str = "-s -w"
    # Go build tags, passed as one ``-tags`` argument.
    tags: tuple[str, ...] = ()
    # Files the build writes next to the binaries; a cache directory without them is stale.
    extra_files: tuple[str, ...] = ()

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(self.binary_name(package) for package in self.packages)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Every file a complete cache directory of this component holds."""
        return (*self.binaries, *self.extra_files)

    @staticmethod
    def binary_name(package: str) -> str:
        # go.etcd.io/etcd/server/v3 builds a binary named "v3"; give it its real name.
        return (
            "etcd" if package.startswith("go.etcd.io/etcd/server") else package.rsplit("/", 1)[-1]
        )


def _kubernetes_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


KUBERNETES = Component(
    name="kubernetes",
    version=KUBERNETES_VERSION,
    module_dir="kubernetes",
    packages=tuple(
        f"k8s.io/kubernetes/cmd/{cmd}"
        for cmd in (
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
            "kubelet",
            "kube-proxy",
        )
    ),
    ldflags=_kubernetes_ldflags(KUBERNETES_VERSION),
)
ETCD = Component(
    name="etcd",
    version=ETCD_VERSION,
    module_dir="etcd",
    packages=("go.etcd.io/etcd/server/v3",),
    ldflags=f"-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA={ETCD_VERSION}",
)
KWOK = Component(
    name="kwok",
    version=KWOK_VERSION,
    module_dir="kwok",
    packages=("sigs.k8s.io/kwok/cmd/kwok",),
    ldflags=f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={KWOK_VERSION}",
    extra_files=("stages.yaml",),
)

_CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD = Component(
    name="containerd",
    version=CONTAINERD_VERSION,
    module_dir="containerd",
    packages=tuple(
        f"{_CONTAINERD_MODULE}/cmd/{cmd}"
        for cmd in ("containerd", "ctr", "containerd-shim-runc-v2")
    ),
    # The tag set of upstream's `make STATIC=1 BUILDTAGS="no_btrfs no_devmapper"`. With cgo off
    # only no_btrfs (the btrfs snapshotter is cgo) and no_devmapper change what is compiled;
    # upstream's shim-only no_grpc tag cannot be used when one `go build` links all three.
    tags=(
        "urfave_cli_no_docs",
        "no_btrfs",
        "no_devmapper",
        "osusergo",
        "netgo",
        "static_build",
    ),
    ldflags=(
        f"-s -w -X {_CONTAINERD_MODULE}/version.Version={CONTAINERD_VERSION}"
        f" -X {_CONTAINERD_MODULE}/version.Package={_CONTAINERD_MODULE}"
    ),
)
CNI = Component(
    name="cni-plugins",
    version=CNI_PLUGINS_VERSION,
    module_dir="cni",
    packages=tuple(
        f"github.com/containernetworking/plugins/plugins/{plugin}"
        for plugin in (
            "main/ptp",
            "main/loopback",
            "main/bridge",
            "ipam/host-local",
            "meta/portmap",
        )
    ),
    ldflags=(
        "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion="
        + CNI_PLUGINS_VERSION
    ),
)
COREDNS = Component(
    name="coredns",
    version=COREDNS_VERSION,
    module_dir="coredns",
    # The wrapper's own main (tools/coredns/main.go) links only the plugins the Corefile uses.
    packages=("stateward.io/tools/coredns",),
    tags=("grpcnotrace",),  # upstream Makefile's default GOTAGS
    ldflags=f"-s -w -X github.com/coredns/coredns/coremain.GitCommit={COREDNS_VERSION}",
)
VERSITYGW = Component(
    name="versitygw",
    version=VERSITYGW_VERSION,
    module_dir="versitygw",
    packages=("github.com/versity/versitygw/cmd/versitygw",),
    ldflags=f"-s -w -X main.Version={VERSITYGW_VERSION}",
)
HELM = Component(
    name="helm",
    version=HELM_VERSION,
    module_dir="helm",
    packages=("helm.sh/helm/v4/cmd/helm",),
    # Upstream's Makefile: without the version `helm version` says v4.3, and charts with a
    # kubeVersion or a Helm version constraint are judged against it.
    ldflags=(
        f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION}"
        " -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
    ),
)
SHARES_KUBERNETES = (COREDNS, KWOK, HELM)
"""Components built mostly from Kubernetes' own libraries (client-go, apimachinery, x/net,
protobuf, ...). Their wrapper modules select the same version of every module they share
with the kubernetes wrapper (``local/align_go_modules.py`` keeps them so; a unit test checks),
so Go's build cache compiles each of those packages once, not once per component: about
1,850 of their 2,270 packages."""

# Smallest builds first, so a slow network or an interrupted run still leaves most of them;
# those sharing Kubernetes' libraries last, when the Kubernetes lane has compiled most of them.
COMPONENTS = (CNI, ETCD, CONTAINERD, VERSITYGW, *SHARES_KUBERNETES, KUBERNETES)


def cache_dir() -> Path:
    configured = os.environ.get("STATEWARD_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "stateward"


def tools_dir() -> Path:
    """The ``tools/`` folder with the wrapper modules (``$STATEWARD_TOOLS_DIR`` overrides):
    package data next to this module, so an installed wheel has them too."""
    configured = os.environ.get("STATEWARD_TOOLS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent / "tools"


def component_dir(component: Component) -> Path:
    """The cache directory of one build: named by the release and by a digest of the wrapper
    module's sources (go.mod, go.sum, Go files), so a build with other dependencies (the
    aligned ones of :data:`SHARES_KUBERNETES`) or other plugins (CoreDNS) is never taken
    for this one."""
    name = f"{component.name}-{component.version}-{source_digest(component)}"
    return cache_dir() / "bin" / name


def source_digest(component: Component) -> str:
    module = tools_dir() / component.module_dir
    digest = hashlib.sha256()
    for path in sorted(module.iterdir()):
        if path.name in ("go.mod", "go.sum") or path.suffix == ".go":
            content = path.read_bytes()
            digest.update(f"{path.name}\0{len(content)}\0".encode())
            digest.update(content)
    return digest.hexdigest()[:10]


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Paths of every binary the local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kubelet: Path
    kwok: Path
    kwok_stages: Path
    kube_proxy: Path
    containerd: Path
    ctr: Path
    containerd_shim: Path
    # The directory holding the CNI plugins (containerd's `bin_dir`), not a single binary.
    cni_bin_dir: Path
    coredns: Path
    versitygw: Path
    helm: Path


def missing_files(component: Component) -> list[Path]:
    """The files a cached build of ``component`` should have but lacks (all, if never built)."""
    directory = component_dir(component)
    return [directory / name for name in component.outputs if not (directory / name).is_file()]


def locate() -> Binaries:
    """Paths where the binaries live once built; raises if any is missing."""
    for component in COMPONENTS:
        absent = missing_files(component)
        if absent:
            raise errors.LocalClusterError(
                f"missing binary {absent[0]}: run `stateward local build` (or `make binaries`)"
                " first"
            )
    kubernetes, etcd, kwok, containerd, cni, coredns, versitygw, helm = (
        component_dir(c)
        for c in (KUBERNETES, ETCD, KWOK, CONTAINERD, CNI, COREDNS, VERSITYGW, HELM)
    )
    return Binaries(
        etcd=etcd / "etcd",
        kube_apiserver=kubernetes / "kube-apiserver",
        kube_controller_manager=kubernetes / "kube-controller-manager",
        kube_scheduler=kubernetes / "kube-scheduler",
        kubectl=kubernetes / "kubectl",
        kubelet=kubernetes / "kubelet",
        kwok=kwok / "kwok",
        kwok_stages=kwok / "stages.yaml",
        kube_proxy=kubernetes / "kube-proxy",
        containerd=containerd / "containerd",
        ctr=containerd / "ctr",
        containerd_shim=containerd / "containerd-shim-runc-v2",
        cni_bin_dir=cni,
        coredns=coredns / "coredns",
        versitygw=versitygw / "versitygw",
        helm=helm / "helm",
    )


def missing() -> list[Component]:
    """Components to build: never built, or cached without one of their files."""
    return [c for c in COMPONENTS if missing_files(c)]


def ensure(*, progress: Progress = _stderr) -> Binaries:
    """Build whatever is not cached yet, then return the paths.

    Two processes on one host (a test run and ``make run``, or parallel test sessions) may
    both find a component missing; a lock on the cache makes the second wait for the first's
    build and then find it cached, instead of compiling into the same ``.partial`` at once.
    """
    if not missing():
        return locate()
    cache = component_dir(COMPONENTS[0]).parent
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".build.lock", "w") as lock:
        if not _try_lock(lock):
            progress(f"Waiting for another process building into {cache} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        build_all(missing(), progress=progress)
    return locate()


def build_all(components: Sequence[Component], *, progress: Progress = _stderr) -> None:
    """Build ``components`` in two lanes: Kubernetes (the longest build by far) alone, the
    others one after another beside it. One ``go build`` leaves a core idle while it fetches
    modules, waits on a package's dependencies or links (single-threaded): on two cores the
    lanes finish a cold cache in less time than one lane would."""
    heavy = [c for c in components if c is KUBERNETES]
    light = [c for c in components if c is not KUBERNETES]
    if not heavy or not light:
        for component in components:
            build(component, progress=progress)
        return

    def lane(batch: Sequence[Component]) -> None:
        for component in batch:
            build(component, progress=progress)

    lanes.side_by_side(lambda: lane(light), lambda: lane(heavy), name="go-build")


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise errors.LocalClusterError(
            "the Go toolchain is not on PATH: install Go >= 1.26 (e.g. `apt-get install golang`)"
            " so the control-plane binaries can be built from the Go module proxy"
        )
    return go


def build(component: Component, *, progress: Progress = _stderr) -> Path:
    """Compile one component into the cache; prints a heartbeat while the compiler works."""
    go = _go()
    module = tools_dir() / component.module_dir
    if not (module / "go.mod").is_file():
        raise errors.LocalClusterError(f"wrapper module {module}/go.mod not found")
    final = component_dir(component)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    progress(
        f"Building {component.name} {component.version} ({', '.join(component.binaries)}) from the"
        f" Go module proxy into {final}. This happens once; later runs reuse the cache."
    )
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": os.environ.get("GOFLAGS", "-mod=mod")}
    started = time.monotonic()
    _run_go_build(
        go_build_argv(go, component, partial),
        cwd=module,
        env=env,
        label=f"{component.name} {component.version}",
        progress=progress,
    )
    if component is KWOK:
        _collect_kwok_stages(go, module, partial, env)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    progress(f"Built {component.name} {component.version} in {time.monotonic() - started:.0f}s.")
    return final


def go_build_argv(go: str, component: Component, out_dir: Path) -> list[str]:
    """The ``go build`` command line that links every binary of ``component`` into ``out_dir``."""
    # One invocation for all packages lets the compiler share work across them; with several
    # packages -o names a directory and each binary takes its package's last path element.
    if len(component.packages) == 1:
        output = str(out_dir / component.binary_name(component.packages[0]))
    else:
        output = f"{out_dir}/"
    tags = ["-tags", ",".join(component.tags)] if component.tags else []
    return [
        go,
        "build",
        "-v",
        "-trimpath",
        # No DWARF from the compiler: `-ldflags -s -w` drops it at link anyway, and not
        # generating it saved 5-7% of etcd's cold compile here (58 s against 62).
        "-gcflags=all=-dwarf=false",
        *tags,
        "-ldflags",
        component.ldflags,
        "-o",
        output,
        *component.packages,
    ]


def _run_go_build(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    label: str,
    progress: Progress,
) -> None:
    """Run ``go build -v``; report the package count every 30 s so a slow build looks alive."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    compiled = 0
    tail: list[str] = []
    done = threading.Event()
    started = time.monotonic()

    def heartbeat() -> None:
        while not done.wait(30):
            progress(
                f"  {label}: still compiling, {compiled} packages so far,"
                f" {time.monotonic() - started:.0f}s elapsed"
            )

    ticker = threading.Thread(target=heartbeat, daemon=True)
    ticker.start()
    assert process.stdout is not None
    for line in process.stdout:
        compiled += 1
        tail = [*tail[-20:], line.rstrip()]
    code = process.wait()
    done.set()
    if code != 0:
        text = "\n".join(tail)
        if "dial tcp" in text or "proxy.golang.org" in text or "lookup " in text:
            raise errors.LocalClusterError(
                "cannot reach the Go module proxy: check GOPROXY and the network, then retry"
                f" (go said: {tail[-1] if tail else 'nothing'})"
            )
        raise errors.LocalClusterError(f"go build of {label} failed:\n{text}")
    progress(f"  {label}: linked after {time.monotonic() - started:.0f}s")


def _collect_kwok_stages(go: str, module: Path, out: Path, env: dict[str, str]) -> None:
    listed = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"],
        cwd=module,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    source = Path(listed.stdout.strip())
    documents: list[str] = []
    for folder in KWOK_STAGE_DIRS:
        for path in sorted((source / folder).glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            text = path.read_text()
            if "kind: Stage" in text:
                documents.append(text.strip())
    (out / "stages.yaml").write_text("\n---\n".join(documents) + "\n")
