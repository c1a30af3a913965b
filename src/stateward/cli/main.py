"""``stateward``: the operator process, its generated manifests, and ``stateward local`` (the
embedded local cluster, handed to the stateward-local distribution when it is installed)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from stateward.specs import pinning

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""``stateward operator --log-level`` (the chart's ``logLevel``)."""


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

    # The local cluster is the stateward-local distribution (local/ in the repository), which
    # the operator's image does not carry: `main` hands `stateward local ...` to it whole.
    commands.add_parser(
        "local", add_help=False, help="the embedded local Kubernetes cluster (stateward-local)"
    )
    return parser


def _local(argv: list[str]) -> int:
    """``stateward local ...``: the development cluster's CLI, when it is installed."""
    try:
        cli = importlib.import_module("stateward_local.cli")
    except ModuleNotFoundError as error:
        if error.name != "stateward_local":
            raise
        print(
            "stateward local: the local cluster is not installed here. It is the"
            " stateward-local distribution, kept out of the operator and its image: from a"
            " checkout, `make venv` installs it (or `pip install ./local`).",
            file=sys.stderr,
        )
        return 2
    code: int = cli.main(argv)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["local"]:
        return _local(arguments[1:])
    args = build_parser().parse_args(arguments)
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    return code
