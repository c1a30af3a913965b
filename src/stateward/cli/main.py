"""``stateward``: the operator process and the embedded local cluster."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stateward.local import binaries, host, images
from stateward.local.cluster import Config, LocalCluster
from stateward.local.errors import LocalClusterError
from stateward.specs import pinning


def _local_config(args: argparse.Namespace) -> Config:
    config = Config.default(
        state_dir=args.state_dir, port_base=args.port_base, real_nodes=getattr(args, "nodes", None)
    )
    if getattr(args, "kwok_nodes", None) is not None:
        apiserver_only = args.apiserver_only
        config = Config(
            state_dir=config.state_dir,
            ports=config.ports,
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
    from stateward.cli import run

    if args.state_dir:
        os.environ["STATEWARD_LOCAL_DIR"] = str(args.state_dir)
    if args.port_base:
        os.environ["STATEWARD_LOCAL_PORT_BASE"] = str(args.port_base)
    return run.run()


def _local_node(args: argparse.Namespace) -> int:
    cluster = LocalCluster(_local_config(args))
    if not cluster.running():
        raise LocalClusterError(f"no local cluster is running from {cluster.state_dir}")
    action = getattr(cluster, f"node_{args.action.replace('-', '_')}")
    action(args.name)
    print(f"{args.name}: {NODE_ACTIONS[args.action]}")
    return 0


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""``stateward operator --log-level`` (the chart's ``logLevel``)."""

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
    for archive in images.ensure(getattr(args, "names", None) or None):
        size = archive.path.stat().st_size / 2**20
        print(f"{archive.ref:<48} {size:8.1f} MiB  {archive.path}")
    return 0


def _local_lock(args: argparse.Namespace) -> int:
    """Write the images' pip lock files, or with --check say which are not current."""
    if not args.check:
        images.write_locks(upgrade=args.upgrade)
        return 0
    problems = [problem for lock in images.lock_files() for problem in lock.problems()]
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print("stateward: run `make lock` (stateward local lock)", file=sys.stderr)
        return 1
    print("the images' pip lock files are current")
    return 0


def _local_build(args: argparse.Namespace) -> int:
    """Everything the local cluster needs before it starts: host packages (real nodes),
    the binaries, the images. Each step is cached; a warm run costs about a second."""
    if not args.binaries_only:
        host.ensure_packages()
    for component in binaries.missing():
        binaries.build(component)
    paths = binaries.locate()
    print(f"binaries ready in {paths.kube_apiserver.parent.parent}")
    if not args.binaries_only:
        _local_images(args)
    return 0


def _operator(args: argparse.Namespace) -> int:
    # Imported here: the local-cluster verbs must not pay for loading Kopf.
    from stateward.runtime import operator

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)
    options = operator.Options(
        namespace=args.namespace,
        identity=args.identity or "",
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        resync_interval=args.resync_interval,
        probe_address=args.probe_address,
        probe_port=args.probe_port,
        webhook_address=args.webhook_address,
        webhook_port=args.webhook_port,
        webhook_host=args.webhook_host,
        webhook_service=args.webhook_service,
        webhooks=not args.no_webhooks,
        webhook_certificate_interval=args.webhook_certificate_interval,
        watch_namespaces=tuple(dict.fromkeys(args.watch_namespace)),
        log_level=args.log_level,
        foreign_repository_paths=args.allow_foreign_repository_paths,
        image_pins=args.pin_image,
        operator_image=args.operator_image,
    )
    try:
        return operator.run(options)
    except operator.StartupError as error:
        print(f"stateward operator: {error}", file=sys.stderr)
        return 2


class _PinImage(argparse.Action):
    """``--pin-image``: each one checked as it is read, collected into one mapping."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        pins = dict(getattr(namespace, self.dest) or {})
        try:
            pins |= pinning.parse_pins([*(f"{k}@{v}" for k, v in pins.items()), str(values)])
        except ValueError as error:
            parser.error(str(error))
        setattr(namespace, self.dest, pins)


def _manifests(args: argparse.Namespace) -> int:
    """Write (or with --check, verify) every generated file under config/."""
    from stateward.api import manifests
    from stateward.runtime import rbac

    root: Path = args.root if args.root is not None else manifests.default_root()
    generated = {
        **manifests.generated_crds(),
        **rbac.rendered(),
        **manifests.chart_crds(),
        **rbac.chart_rendered(),
    }
    return manifests.sync(root, generated, check=args.check)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stateward", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    op = commands.add_parser("operator", help="run the operator against $KUBECONFIG or in-cluster")
    op.add_argument("--kubeconfig", type=Path, default=None, help="default: $KUBECONFIG")
    op.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "stateward-system"),
        help="namespace of the leader Lease (default $POD_NAMESPACE or stateward-system)",
    )
    op.add_argument("--identity", default=None, help="leader identity (default host-pid)")
    op.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default 15)")
    op.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default 10)")
    op.add_argument("--retry-period", type=float, default=2.0, help="seconds (default 2)")
    op.add_argument(
        "--resync-interval", type=float, default=300.0, help="seconds between full resyncs"
    )
    op.add_argument("--probe-address", default="0.0.0.0", help="healthz/readyz/metrics bind")  # noqa: S104
    op.add_argument("--probe-port", type=int, default=8081)
    op.add_argument("--webhook-address", default="0.0.0.0", help="admission webhook bind")  # noqa: S104
    op.add_argument("--webhook-port", type=int, default=9443)
    op.add_argument(
        "--webhook-host",
        default=None,
        help="out of cluster: host the API server reaches the webhook at (default 127.0.0.1)",
    )
    op.add_argument(
        "--webhook-service",
        default=None,
        help="in-cluster: the Service (in --namespace) the API server reaches the webhook by",
    )
    op.add_argument(
        "--webhook-certificate-interval",
        type=float,
        default=30.0,
        help="seconds between re-reads of the webhook certificate's Secret (default 30)",
    )
    op.add_argument("--no-webhooks", action="store_true", help="serve no admission webhook")
    op.add_argument(
        "--watch-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="run the PostgresClusters of this namespace only (repeat for more; default: all)",
    )
    op.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("STATEWARD_LOG_LEVEL", "INFO").upper(),
        help="DEBUG, INFO, WARNING or ERROR (default $STATEWARD_LOG_LEVEL or INFO)",
    )
    op.add_argument(
        pinning.FLAG,
        dest="pin_image",
        metavar="REPOSITORY:TAG@sha256:DIGEST",
        action=_PinImage,
        default={},
        help="run every container of REPOSITORY:TAG by this digest (repeatable): the default"
        " images and any spec.image naming that tag",
    )
    op.add_argument(
        "--operator-image",
        default="",
        metavar="IMAGE",
        help="this operator's image, which backup Jobs run (in a pod its own image is read"
        " instead); unset, they run each cluster's instance image",
    )
    op.add_argument(
        "--allow-foreign-repository-paths",
        action="store_true",
        help="let a cluster's repository paths leave /NAMESPACE/ (namespaces that share a"
        " bucket on purpose); off, no cluster can name another namespace's backups",
    )
    op.set_defaults(handler=_operator)

    manifests = commands.add_parser(
        "manifests",
        help="write the CRDs and RBAC under config/ from the code (make manifests)",
    )
    manifests.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming each generated file that is stale or missing",
    )
    manifests.add_argument(
        "--root", type=Path, default=None, help="repository root (default: this checkout)"
    )
    manifests.set_defaults(handler=_manifests)

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
    up.set_defaults(handler=_local_up)
    down = verbs.add_parser("down", parents=[common], help="stop every process `up` started")
    down.add_argument("--keep", action="store_true", help="keep the state directory")
    down.set_defaults(handler=_local_down)
    verbs.add_parser("status", parents=[common], help="what runs and what died").set_defaults(
        handler=_local_status
    )
    verbs.add_parser(
        "run",
        parents=[common],
        help="cluster + operator + a sample PostgresCluster, status shown until Ctrl-C",
    ).set_defaults(handler=_local_run)
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
