"""``stateward local``: the embedded local Kubernetes cluster for development and tests.

The operator's ``stateward`` command hands ``stateward local ...`` here; this distribution
(stateward-local) is not part of the operator or its image.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stateward_local import binaries, lanes
from stateward_local.cluster import Config, LocalCluster
from stateward_local.errors import LocalClusterError
from stateward_local.images import cache, catalog, locks, nodestore
from stateward_local.nodes import layout, packages


def _local_config(args: argparse.Namespace) -> Config:
    config = Config.default(
        state_dir=args.state_dir,
        port_base=args.port_base,
        real_nodes=getattr(args, "nodes", None),
        slot=getattr(args, "slot", None),
    )
    if getattr(args, "kwok_nodes", None) is not None:
        apiserver_only = args.apiserver_only
        config = dataclasses.replace(
            config,
            kwok_nodes=args.kwok_nodes,
            real_nodes=0 if apiserver_only else config.real_nodes,
            controllers=not apiserver_only,
        )
    return config


def _local_up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(_local_config(args))
    cluster.up()
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _local_down(args: argparse.Namespace) -> int:
    cluster = LocalCluster(_local_config(args))
    stopped = cluster.down(keep=args.keep)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    if args.keep:
        print(f"state kept in {cluster.state_dir}")
    return 0


def _local_status(args: argparse.Namespace) -> int:
    cluster = LocalCluster(_local_config(args))
    processes = cluster.status()
    if not processes:
        print(f"no local cluster in {cluster.state_dir}")
        return 1
    for process in processes:
        state = "running" if process.running else "DEAD"
        print(f"{process.name:<24} pid {process.pid:<8} {state:<8} log {process.log}")
    node_states = cluster.node_states()
    for node, state in node_states:
        print(f"node {node.name:<19} ip {node.ip:<12} {state}")
    healthy = all(p.running for p in processes) and all(s == "running" for _, s in node_states)
    print(f"kubeconfig: {cluster.kubeconfig}" if healthy else "some processes died: see logs")
    return 0 if healthy else 1


def _local_run(args: argparse.Namespace) -> int:
    from stateward_local import run  # the operator's client stack: only `run` needs it

    if args.state_dir:
        os.environ["STATEWARD_LOCAL_DIR"] = str(args.state_dir)
    if args.port_base:
        os.environ["STATEWARD_LOCAL_PORT_BASE"] = str(args.port_base)
    if args.slot is not None:
        os.environ["STATEWARD_LOCAL_SLOT"] = str(args.slot)
    return run.run()


def _local_node(args: argparse.Namespace) -> int:
    cluster = LocalCluster(_local_config(args))
    if not cluster.running():
        raise LocalClusterError(f"no local cluster is running from {cluster.state_dir}")
    action = getattr(cluster, f"node_{args.action.replace('-', '_')}")
    action(args.name)
    print(f"{args.name}: {NODE_ACTIONS[args.action]}")
    return 0


NODE_ACTIONS = {
    "stop": "powered off (link down, every process killed)",
    "out-of-service": "marked out of service (node.kubernetes.io/out-of-service=nodeshutdown)",
    "start": "powered on (and no longer out of service)",
    "freeze": "frozen (every process stopped by the cgroup freezer)",
    "thaw": "thawed",
    "partition": "partitioned (link cut, processes running)",
    "heal": "link restored",
}


def _local_images(args: argparse.Namespace) -> int:
    _build_images(getattr(args, "names", None) or None)
    return 0


def _build_images(names: Sequence[str] | None) -> list[catalog.Archive]:
    archives = cache.ensure(names)
    for archive in archives:
        size = archive.path.stat().st_size / 2**20
        print(f"{archive.ref:<48} {size:8.1f} MiB  {archive.path}")
    return archives


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _local_lock(args: argparse.Namespace) -> int:
    """Write the images' pip lock files, or with --check say which are not current."""
    if not args.check:
        locks.write_locks(catalog=catalog.IMAGES, upgrade=args.upgrade)
        return 0
    problems = [problem for lock in locks.lock_files(catalog.IMAGES) for problem in lock.problems()]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("stateward: run `make lock` (stateward local lock)", file=sys.stderr)
        return 1
    print("the images' pip lock files are current")
    return 0


def _local_build(args: argparse.Namespace) -> int:
    """Everything the local cluster needs before it starts: host packages (real nodes),
    the binaries and the images (built side by side: the Go builds keep both cores busy, the
    image builds mostly wait on Debian's archive and PyPI), and as root the containerd root
    every real node starts from. Each step is cached; a warm run costs about a second."""
    if args.binaries_only:
        paths = binaries.ensure()
        print(f"binaries ready in {paths.kube_apiserver.parent.parent}")
        return 0
    packages.ensure_packages()
    # The Go builds run in a thread: Ctrl-C reaches `go build` through the terminal, and a
    # killed build leaves only a `.partial` directory. The images stay in the main thread,
    # whose cleanup (chroot mounts) must run on any interruption.
    paths, archives = lanes.side_by_side(
        binaries.ensure, lambda: _build_images(None), name="binaries"
    )
    print(f"binaries ready in {paths.kube_apiserver.parent.parent}")
    if os.geteuid() == 0:
        nodestore.ensure([a for a in archives if a.spec.on_nodes], paths, progress=_progress)
    return 0


def _slot_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--slot",
        type=int,
        choices=range(layout.SLOTS),
        default=None,
        help="the host slot of the real nodes (their bridge, addresses and CIDRs): clusters"
        " in different slots run side by side (default 0, or $STATEWARD_LOCAL_SLOT)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stateward local", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where state lives (default .stateward/local, or $STATEWARD_LOCAL_DIR)",
    )
    common.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="first of six consecutive ports (default 16443, or $STATEWARD_LOCAL_PORT_BASE)",
    )
    up = verbs.add_parser("up", parents=[common], help="start the cluster and wait until ready")
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="real nodes that run containers (default 3, or $STATEWARD_LOCAL_NODES; 0 = none)",
    )
    up.add_argument(
        "--kwok-nodes", type=int, default=3, help="simulated (kwok) nodes for scale (default 3)"
    )
    up.add_argument(
        "--apiserver-only",
        action="store_true",
        help="only etcd and kube-apiserver: no controllers, scheduler or nodes",
    )
    _slot_argument(up)
    up.set_defaults(handler=_local_up)
    down = verbs.add_parser("down", parents=[common], help="stop every process `up` started")
    down.add_argument("--keep", action="store_true", help="keep the state directory")
    down.set_defaults(handler=_local_down)
    verbs.add_parser("status", parents=[common], help="what runs and what died").set_defaults(
        handler=_local_status
    )
    run = verbs.add_parser(
        "run",
        parents=[common],
        help="cluster + operator + a sample PostgresCluster, status shown until Ctrl-C",
    )
    _slot_argument(run)
    run.set_defaults(handler=_local_run)
    build = verbs.add_parser(
        "build",
        help="install host packages, build the binaries and the images into the cache (once)",
    )
    build.add_argument(
        "--binaries-only", action="store_true", help="only the binaries (no root needed)"
    )
    build.set_defaults(handler=_local_build)
    images_verb = verbs.add_parser(
        "images",
        help="build the local container images (pause, base, instances, operator) into the cache",
    )
    images_verb.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="only these images (a ref, name:tag or name, e.g. stateward); default: all",
    )
    images_verb.set_defaults(handler=_local_images)
    lock = verbs.add_parser(
        "lock",
        help="resolve, with uv, what the images' venvs take from PyPI into hash-locked"
        " requirements files (images/*/*requirements-SUITE.txt)",
    )
    lock_mode = lock.add_mutually_exclusive_group()
    lock_mode.add_argument(
        "--upgrade",
        action="store_true",
        help="newest versions that fit (default: keep the locked ones that still fit)",
    )
    lock_mode.add_argument(
        "--check",
        action="store_true",
        help="write nothing, reach no network: exit 1 naming each lock that does not match"
        " its inputs",
    )
    lock.set_defaults(handler=_local_lock)
    node = verbs.add_parser(
        "node",
        parents=[common],
        help="failure drills on a real node: stop, freeze, partition, out-of-service",
    )
    node.add_argument("action", choices=sorted(NODE_ACTIONS), help="what happens to the node")
    node.add_argument("name", help="a real node, e.g. node-2 (see `stateward local status`)")
    node.set_defaults(handler=_local_node)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except LocalClusterError as error:
        print(f"stateward: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
