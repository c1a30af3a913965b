"""``stateward``: the operator process and the embedded local cluster."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from stateward.local import binaries
from stateward.local.cluster import Config, LocalCluster
from stateward.local.errors import LocalClusterError


def _local_config(args: argparse.Namespace) -> Config:
    config = Config.default(state_dir=args.state_dir, port_base=args.port_base)
    if getattr(args, "nodes", None) is not None:
        config = Config(
            state_dir=config.state_dir,
            ports=config.ports,
            nodes=args.nodes,
            controllers=not args.apiserver_only,
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
    healthy = all(p.running for p in processes)
    print(f"kubeconfig: {cluster.kubeconfig}" if healthy else "some processes died: see logs")
    return 0 if healthy else 1


def _local_build(_: argparse.Namespace) -> int:
    for component in binaries.missing():
        binaries.build(component)
    paths = binaries.locate()
    print(f"binaries ready in {paths.kube_apiserver.parent.parent}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stateward", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="the embedded local Kubernetes cluster")
    verbs = local.add_subparsers(dest="verb", required=True)
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
    up.add_argument("--nodes", type=int, default=3, help="simulated (kwok) nodes (default 3)")
    up.add_argument(
        "--apiserver-only",
        action="store_true",
        help="only etcd and kube-apiserver: no controllers, scheduler or nodes",
    )
    up.set_defaults(handler=_local_up)
    down = verbs.add_parser("down", parents=[common], help="stop every process `up` started")
    down.add_argument("--keep", action="store_true", help="keep the state directory")
    down.set_defaults(handler=_local_down)
    verbs.add_parser("status", parents=[common], help="what runs and what died").set_defaults(
        handler=_local_status
    )
    verbs.add_parser(
        "build", help="build the control-plane binaries into the cache (once)"
    ).set_defaults(handler=_local_build)
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
