"""``kubectl stateward``: operate PostgresClusters from kubectl, in the manner of ``kubectl cnpg``.

Installed as the console script ``kubectl-stateward``, which kubectl finds on PATH. It talks to
the cluster kubectl would (``$KUBECONFIG`` or ``~/.kube/config``, ``--kubeconfig`` and
``--context`` to choose), and never prints a password: ``psql`` connects through the pod's
own socket, where the superuser needs none.

* ``status NAME``: a readable report — phase, instances with role, state, timeline and lag,
  the last switchover and failover, backups, conditions, recent Events;
* ``switchover NAME [--to POD]``: request a switchover and wait for its outcome;
* ``psql NAME [--replica] [-- ARGS]``: a psql shell on the primary (or a replica);
* ``logs NAME``: every instance's log, each line prefixed with its pod;
* ``fence NAME POD`` / ``unfence NAME POD``: stop an instance's PostgreSQL, keeping its pod
  and data for inspection, and start it again (``*`` for every instance).

Errors (no such cluster, no permission, no primary) are one line and exit code 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from lightkube import ApiError, Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Event, Pod
from lightkube.types import PatchType

from stateward import rfc3339
from stateward.api import v1alpha1, validation
from stateward.controllers.kube import PostgresClusterResource
from stateward.instance import metrics
from stateward.specs import meta
from stateward.specs.postgres import statefulset

PROGRAM = "kubectl stateward"


class PluginError(Exception):
    """What went wrong, in one line for the user."""


def _client(args: argparse.Namespace) -> tuple[Client, str]:
    try:
        config = KubeConfig.from_file(args.kubeconfig) if args.kubeconfig else KubeConfig.from_env()
        single = config.get(args.context)
    except Exception as error:  # lightkube raises several types for a missing/bad config
        raise PluginError(f"no usable kubeconfig: {error}") from None
    if single is None:
        raise PluginError(f"kubeconfig has no context {args.context!r}")
    namespace = args.namespace or single.namespace or "default"
    return Client(config=single, field_manager="kubectl-stateward"), namespace


def _explain(error: ApiError, what: str) -> PluginError:
    code = error.status.code
    if code == 404:
        return PluginError(f"{what} not found")
    if code == 403:
        return PluginError(f"no permission: {error.status.message}")
    return PluginError(f"{what}: the API server said {code} {error.status.message}")


def get_cluster(client: Client, name: str, namespace: str) -> dict[str, Any]:
    try:
        found: dict[str, Any] = client.get(
            PostgresClusterResource, name, namespace=namespace
        ).to_dict()  # type: ignore[no-untyped-call]
    except ApiError as error:
        raise _explain(error, f"postgrescluster {name!r} in namespace {namespace!r}") from None
    return found


# --- status ----------------------------------------------------------------------------------


def _ago(stamp: str | None, now: datetime.datetime) -> str:
    if not stamp:
        return "-"
    seconds = int(rfc3339.seconds_since(stamp, now))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{max(seconds, 0)}s ago"


def _version(spec: dict[str, Any], status: dict[str, Any]) -> str:
    """The spec's version, and the data's while they differ (an upgrade running or refused)."""
    wanted, running = spec.get("version", "?"), status.get("version")
    return wanted if running in (None, wanted) else f"{running} (spec: {wanted})"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _tls_line(name: str, tls: dict[str, Any]) -> str:
    """Who signs what the servers serve and what they accept from clients."""
    signer = (
        f"your CA (Secret {tls['caSecretName']})"
        if tls.get("caSecretName")
        else f"the cluster's CA (Secret {name}-ca)"
    )
    served = (
        f"your certificate (Secret {tls['serverSecretName']})"
        if tls.get("serverSecretName")
        else f"a certificate of {signer}"
    )
    return f"TLS 1.3 only: serving {served}; client certificates of {signer}"


def report(
    obj: dict[str, Any], events: Sequence[dict[str, Any]], *, now: datetime.datetime
) -> list[str]:
    """The ``status`` report of one cluster (pure: the object and its Events in, lines out)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace", "default")
    synchronous = spec.get("synchronous") or {}
    sync = synchronous.get("mode", "Preferred")
    if sync != "Off" and synchronous.get("method") == "Quorum":
        sync += f", quorum of any {synchronous.get('number', 1)}"
    lines = [
        f"PostgresCluster {namespace}/{name}: {status.get('phase', 'Pending')}",
        f"  PostgreSQL {_version(spec, status)}, {status.get('readyReplicas', 0)}/"
        f"{spec.get('replicas', '?')} instances ready, primary"
        f" {status.get('primaryPod') or '-'}, synchronous replication {sync}",
        "",
        "Instances:",
    ]
    instances = status.get("instances") or []
    if instances:
        rows = [["NAME", "ROLE", "STATE", "TIMELINE", "LAG"]]
        for i in instances:
            lag = i.get("lagBytes")
            rows.append(
                [
                    i["name"],
                    i.get("role", "-"),
                    i.get("state", "-"),
                    str(i.get("timeline", "-")),
                    "-" if lag is None else f"{lag} B",
                ]
            )
        lines += _table(rows)
    else:
        lines.append("  none reported yet")
    placement = spec.get("placement") or {}
    lines.append(
        f"  placed {placement.get('antiAffinity', 'Required')}: one per"
        f" {placement.get('topologyKey', 'kubernetes.io/hostname')}; metrics on port"
        f" {metrics.PORT} of each (/metrics)"
    )
    lines.append("  " + _tls_line(name, spec.get("tls") or {}))
    if spec.get("pooler") is not None:
        pooler = status.get("pooler") or {}
        wanted = spec["pooler"] or {}
        lines.append(
            f"  Pooler: PgBouncer at {pooler.get('host') or f'{name}-pooler.{namespace}.svc'}:"
            f"{v1alpha1.POOLER_PORT}, {pooler.get('readyInstances', 0)}/"
            f"{wanted.get('instances', 2)} ready,"
            f" {wanted.get('poolMode', v1alpha1.PoolMode.TRANSACTION.value)} pooling"
        )
    switchover = status.get("switchover")
    if switchover:
        lines += [
            "",
            f"Switchover: {switchover.get('phase')} ({switchover.get('reason')}) from"
            f" {switchover.get('fromPod')} to {switchover.get('target')},"
            f" {_ago(switchover.get('startedAt'), now)}"
            + (f": {switchover['message']}" if switchover.get("message") else ""),
        ]
    upgrade = status.get("upgrade")
    if upgrade:
        steps = ["Stopping", "Upgrading", "Starting", "Cloning", "Succeeded"]
        phase = upgrade.get("phase")
        step = f" (step {steps.index(phase) + 1} of {len(steps)})" if phase in steps else ""
        lines += [
            "",
            f"Upgrade: PostgreSQL {upgrade.get('from')} -> {upgrade.get('to')}, {phase}{step},"
            f" started {_ago(upgrade.get('startedAt'), now)}"
            + (f": {upgrade['message']}" if upgrade.get("message") else ""),
        ]
    failover = status.get("lastFailover")
    if failover:
        lines.append(
            f"Last failover: {failover.get('fromPod')} -> {failover.get('toPod')},"
            f" {_ago(failover.get('detectedAt'), now)}"
        )
    backups = status.get("backups") or {}
    lines += [
        "",
        f"Backups: schedule {spec.get('backupSchedule') or 'none'}, last"
        f" {_ago(status.get('lastBackupTime'), now)}"
        + (
            f", {backups.get('count', 0)} in the repository, recoverable from"
            f" {backups['recoverableFrom']}"
            if backups.get("recoverableFrom")
            else ""
        ),
    ]
    if status.get("pendingRestart"):
        lines.append(f"Pending restart: {', '.join(status['pendingRestart'])}")
    conditions = status.get("conditions") or []
    if conditions:
        lines += ["", "Conditions:"]
        lines += _table(
            [["TYPE", "STATUS", "REASON", "MESSAGE"]]
            + [
                [c["type"], c["status"], c.get("reason", ""), c.get("message", "")]
                for c in conditions
            ]
        )
    recent = sorted(events, key=lambda e: e.get("lastTimestamp") or "")[-8:]
    if recent:
        lines += ["", "Recent events:"]
        lines += _table(
            [["AGE", "TYPE", "REASON", "MESSAGE"]]
            + [
                [
                    _ago(e.get("lastTimestamp"), now),
                    e.get("type") or "",
                    e.get("reason") or "",
                    e.get("message") or "",
                ]
                for e in recent
            ]
        )
    return lines


def _events(client: Client, name: str, namespace: str) -> list[dict[str, Any]]:
    found = client.list(Event, namespace=namespace, fields={"involvedObject.name": name})
    result = []
    for e in found:
        when = e.lastTimestamp or e.eventTime or (e.metadata and e.metadata.creationTimestamp)
        result.append(
            {
                "lastTimestamp": when.isoformat() if when else None,
                "type": e.type,
                "reason": e.reason,
                "message": e.message,
            }
        )
    return result


def status_command(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    client, namespace = _client(args)
    obj = get_cluster(client, args.name, namespace)
    for line in report(obj, _events(client, args.name, namespace), now=_now()):
        out(line)
    return 0


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


# --- switchover ------------------------------------------------------------------------------


def _request(
    client: Client,
    args: argparse.Namespace,
    namespace: str,
    annotation: str,
    value: str,
    *,
    outcome: Callable[[dict[str, Any]], dict[str, Any] | None],
    out: Callable[[str], None],
    what: str,
) -> int:
    """Set a request annotation, then (unless ``--no-wait``) poll the cluster until
    ``outcome`` finds its record finished; 0 when it succeeded."""
    try:
        client.patch(
            PostgresClusterResource,
            args.name,
            {"metadata": {"annotations": {annotation: value}}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    except ApiError as error:
        raise _explain(error, f"postgrescluster {args.name!r}") from None
    out(f"{what} of {namespace}/{args.name} requested ({value})")
    if not args.wait:
        return 0
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        record = outcome(get_cluster(client, args.name, namespace))
        if record is not None and record.get("phase") in ("Succeeded", "Failed"):
            out(f"{what} {record['phase'].lower()}: {record.get('message', '')}")
            return 0 if record["phase"] == "Succeeded" else 1
        time.sleep(0.5)
    raise PluginError(f"no outcome within {args.timeout:.0f}s; `{PROGRAM} status {args.name}`")


def switchover_command(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    client, namespace = _client(args)
    obj = get_cluster(client, args.name, namespace)
    before = ((obj.get("status") or {}).get("switchover") or {}).get("startedAt", "")

    def outcome(obj: dict[str, Any]) -> dict[str, Any] | None:
        record = (obj.get("status") or {}).get("switchover") or {}
        pending = v1alpha1.SWITCHOVER_ANNOTATION in (obj["metadata"].get("annotations") or {})
        return None if pending or record.get("startedAt", "") < before else dict(record)

    return _request(
        client,
        args,
        namespace,
        v1alpha1.SWITCHOVER_ANNOTATION,
        args.to or "any",
        outcome=outcome,
        out=out,
        what="switchover",
    )


# --- backup ----------------------------------------------------------------------------------


def backup_command(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Request a full backup now (the ``stateward.io/backup`` annotation) and, unless told
    not to, wait for its outcome in ``status.onDemandBackup``."""
    client, namespace = _client(args)
    get_cluster(client, args.name, namespace)
    request = _now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def outcome(obj: dict[str, Any]) -> dict[str, Any] | None:
        record = (obj.get("status") or {}).get("onDemandBackup") or {}
        return dict(record) if record.get("request") == request else None

    return _request(
        client,
        args,
        namespace,
        v1alpha1.BACKUP_ANNOTATION,
        request,
        outcome=outcome,
        out=out,
        what="backup",
    )


# --- fence and unfence ---------------------------------------------------------------------


def fenced_after(current: list[str], pod: str, *, fence: bool) -> list[str]:
    """The fenced list after fencing or unfencing ``pod`` (``*``: every instance)."""
    if fence:
        return sorted({*current, pod})
    if pod == validation.FENCE_ALL:
        return []
    if validation.FENCE_ALL in current:
        raise PluginError(
            f'every instance is fenced ({v1alpha1.FENCED_INSTANCES_ANNOTATION}: ["*"]);'
            f" unfence '*' first"
        )
    return sorted(set(current) - {pod})


def fence_command(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    """Add (fence) or remove (unfence) a pod in the fencing annotation, as an optimistic
    write: a concurrent change makes it fail instead of being overwritten."""
    client, namespace = _client(args)
    fence = args.command == "fence"
    for _attempt in range(5):
        obj = get_cluster(client, args.name, namespace)
        pods = {i["name"] for i in (obj.get("status") or {}).get("instances") or []}
        if args.pod != validation.FENCE_ALL and pods and args.pod not in pods:
            raise PluginError(
                f"{args.pod!r} is not an instance of {args.name} (instances:"
                f" {', '.join(sorted(pods))}; '*' means all)"
            )
        try:
            current = validation.fenced_instances(obj["metadata"].get("annotations"))
        except ValueError as error:
            raise PluginError(str(error)) from None
        wanted = fenced_after(current, args.pod, fence=fence)
        if wanted == current:
            out(f"{args.pod} is already {'fenced' if fence else 'not fenced'}")
            return 0
        value = json.dumps(wanted) if wanted else None
        patch = {
            "metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "annotations": {v1alpha1.FENCED_INSTANCES_ANNOTATION: value},
            }
        }
        try:
            client.patch(
                PostgresClusterResource, args.name, patch, namespace=namespace,
                patch_type=PatchType.MERGE,
            )  # fmt: skip
        except ApiError as error:
            if error.status.code == 409:
                continue
            raise _explain(error, f"postgrescluster {args.name!r}") from None
        verb = "fenced" if fence else "unfenced"
        out(f"{args.pod} {verb}; `{PROGRAM} status {args.name}` shows it take effect")
        return 0
    raise PluginError(f"{args.name} kept changing; try again")


# --- psql and logs ---------------------------------------------------------------------------


def _instances(client: Client, name: str, namespace: str) -> list[Pod]:
    return list(
        client.list(
            Pod,
            namespace=namespace,
            labels={meta.CLUSTER_LABEL: name, meta.COMPONENT_LABEL: meta.INSTANCE_COMPONENT},
        )
    )


def choose_pod(status: dict[str, Any], *, replica: bool) -> str:
    if replica:
        replicas = status.get("replicaPods") or []
        if not replicas:
            raise PluginError("the cluster has no replica")
        return str(replicas[0])
    primary = status.get("primaryPod")
    if not primary:
        raise PluginError("the cluster has no primary right now (a failover may be under way)")
    return str(primary)


def psql_command(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    client, namespace = _client(args)
    obj = get_cluster(client, args.name, namespace)
    pod = choose_pod(obj.get("status") or {}, replica=args.replica)
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise PluginError("kubectl is not on PATH")
    argv = [kubectl]
    if args.kubeconfig:
        argv.append(f"--kubeconfig={args.kubeconfig}")
    if args.context:
        argv.append(f"--context={args.context}")
    # A terminal only when there is one: `psql NAME -- -c "select 1"` works in a script too.
    interactive = "-it" if sys.stdin.isatty() else "-i"
    argv += ["exec", interactive, "-n", namespace, pod, "-c", statefulset.CONTAINER_NAME, "--"]
    argv += ["psql", "-h", "/var/run/postgresql", "-U", "postgres", *args.psql_args]
    os.execv(kubectl, argv)  # noqa: S606 - no shell; replaces this process
    return 0  # not reached


def logs_command(args: argparse.Namespace, out: Callable[[str], None]) -> int:
    client, namespace = _client(args)
    get_cluster(client, args.name, namespace)
    for pod in _instances(client, args.name, namespace):
        pod_name = str(pod.metadata.name)  # type: ignore[union-attr]
        try:
            for line in client.log(
                pod_name,
                namespace=namespace,
                container=statefulset.CONTAINER_NAME,
                tail_lines=args.tail,
            ):
                out(f"[{pod_name}] {line.rstrip()}")
        except ApiError as error:
            out(f"[{pod_name}] (no log: {error.status.message})")
    return 0


# --- entry point -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog=PROGRAM, description="Operate Stateward PostgresClusters.")
    top.add_argument("-n", "--namespace", help="namespace (default: the context's)")
    top.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )
    top.add_argument("--context", help="kubeconfig context")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser("status", help="a readable report of one cluster")
    status.add_argument("name")
    switchover = commands.add_parser("switchover", help="move the primary to another instance")
    switchover.add_argument("name")
    switchover.add_argument("--to", metavar="POD", help="the pod to promote (default: the best)")
    switchover.add_argument("--no-wait", dest="wait", action="store_false", help="do not wait")
    switchover.add_argument("--timeout", type=float, default=120, help="seconds to wait (120)")
    backup = commands.add_parser("backup", help="take a full backup now and wait for it")
    backup.add_argument("name")
    backup.add_argument("--no-wait", dest="wait", action="store_false", help="do not wait")
    backup.add_argument("--timeout", type=float, default=600, help="seconds to wait (600)")
    psql = commands.add_parser(
        "psql", help="a psql shell on the primary (or a replica); psql arguments after --"
    )
    psql.add_argument("name")
    psql.add_argument("--replica", action="store_true", help="connect to a replica")
    for verb, text in (
        ("fence", "stop an instance's PostgreSQL, keeping its pod and data for inspection"),
        ("unfence", "start a fenced instance again"),
    ):
        command = commands.add_parser(verb, help=text)
        command.add_argument("name")
        command.add_argument("pod", help="the instance's pod, or '*' for every instance")
    logs = commands.add_parser("logs", help="every instance's log, prefixed with its pod")
    logs.add_argument("name")
    logs.add_argument("--tail", type=int, default=100, help="lines per instance (100)")
    return top


COMMANDS: dict[str, Callable[[argparse.Namespace, Callable[[str], None]], int]] = {
    "status": status_command,
    "switchover": switchover_command,
    "backup": backup_command,
    "psql": psql_command,
    "fence": fence_command,
    "unfence": fence_command,
    "logs": logs_command,
}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The flags; what follows ``--`` goes to psql untouched."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser().parse_args(argv)
    args.psql_args = extra
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        return COMMANDS[args.command](args, lambda line: print(line, flush=True))
    except PluginError as error:
        print(f"{PROGRAM}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
