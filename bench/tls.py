"""What TLS costs: the same PostgreSQL servers reached with and without TLS, side by side.

On a fresh local cluster with 3 real nodes (as ``bench.dataplane``, whose helpers this uses)
and the operator as a process: one 3-instance PostgresCluster (version 15) with
``spec.tls.allowPlaintextClients: true``, so that the application may log in to the same
servers either way, and each measure runs both ways against them:

1. **pgbench, persistent connections**: the TPC-B-like script on the primary (by its pod
   address) for ``--seconds`` with ``sslmode=require``, then with ``sslmode=disable``,
   ``--rounds`` times alternating, so that drift hits both alike: tps and average latency;
2. **pgbench, a new connection per transaction** (``--connect``): the same with a
   connection's setup — the TLS handshake among it — in every transaction;
3. **switchover write downtime**: two writers at once, each a ``psql`` per insert over every
   pod address (``target_session_attrs=read-write``), one with TLS and one without, while
   ``--runs`` switchovers (``stateward.io/switchover: any``) happen: each writer's longest
   gap between acknowledged inserts, its inserts per second before, and rows lost;
4. **apply → Ready**: the members always talk TLS (replication, Patroni's REST API), so
   there is no cluster without TLS to compare with. Reported instead: this cluster's apply →
   Ready, and what TLS adds before its first pod can start — the operator's CPU time to
   make a cluster's CA, serving certificate and client certificates (its own code, in this
   process, median of 20).

Writes its tables into docs/benchmarks.md between ``<!-- tls:begin -->`` and
``<!-- tls:end -->``. ``make bench-dataplane`` runs it after ``bench.upgrade``; alone:

    flock /tmp/stateward-real-nodes.lock .venv/bin/python -m bench.tls [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench import dataplane as dp
from bench import pgbench
from bench.common import environment, output_flags, ready_for_real_nodes, say
from stateward import pki
from stateward.api import v1alpha1
from stateward.specs import tls

BEGIN = "<!-- tls:begin -->"
END = "<!-- tls:end -->"
MODES = ("require", "disable")
"""libpq's ``sslmode`` with TLS and without."""
PLAINTEXT = {"tls": {"allowPlaintextClients": True}}


def connection(hosts: Sequence[str], mode: str, *, read_write: bool = True) -> str:
    """:func:`bench.dataplane.dsn` with ``sslmode`` ``mode``."""
    return dp.dsn(hosts, read_write=read_write).replace("sslmode=require", f"sslmode={mode}")


def issuance_ms(repeats: int = 20) -> list[float]:
    """Milliseconds the operator's code takes to make one cluster's CA, serving certificate
    (every Service and pod name) and client certificates, as it does before the first pod."""
    cluster = v1alpha1.PostgresCluster.model_validate(
        {
            "metadata": {"name": "tls", "namespace": "bench-tls", "uid": "uid"},
            "spec": {"version": "15", "replicas": dp.NODES, "storageSize": "1Gi"},
        }
    )
    took = []
    for _ in range(repeats):
        began = time.perf_counter()
        authority = pki.Authority.new(tls.ca_common_name(cluster))
        authority.issue(
            common_name=f"{cluster.primary_service_name}.{cluster.namespace}.svc",
            hosts=tls.server_names(cluster),
            server=True,
        )
        for user in tls.clients_of(cluster).values():
            authority.issue(common_name=user)
        took.append((time.perf_counter() - began) * 1000)
    return took


def hosts_of(kube: dp.Kube, ns: str, name: str) -> list[str]:
    pods = [kube.pod(ns, pod) for pod in dp.instance_names(name, dp.NODES)]
    return [ip for p in pods if p and (ip := (p.get("status") or {}).get("podIP"))]


def pgbench_rounds(
    kube: dp.Kube, ns: str, name: str, rounds: int, seconds: int, *, connect: bool
) -> dict[str, list[dict[str, Any]]]:
    """pgbench on the primary, with TLS then without, ``rounds`` times."""
    status = dp.wait_until(
        lambda: dp.settled(kube, ns, name, dp.NODES), what="a settled cluster", timeout=240
    )
    address = (kube.pod(ns, status["primaryPod"]) or {})["status"]["podIP"]
    password = kube.secret(ns, f"{name}-app", "password")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for n in range(1, rounds + 1):
        for mode in MODES:
            run = pgbench.steady(connection([address], mode), password, seconds, connect=connect)
            say(
                f"    {'--connect, ' if connect else ''}round {n}, sslmode={mode}:"
                f" {run['tps']:.0f} tps, latency {run['latency_ms']:.2f} ms"
            )
            runs[mode].append(run)
    return runs


def switchover_once(kube: dp.Kube, ns: str, name: str, run: int) -> dict[str, Any]:
    """One switchover under two writers, with TLS and without: what each saw."""
    dp.wait_until(
        lambda: dp.settled(kube, ns, name, dp.NODES), what="a settled cluster", timeout=240
    )
    hosts = hosts_of(kube, ns, name)
    password = kube.secret(ns, f"{name}-app", "password")
    writers = {
        mode: dp.Writer(hosts, password, f"tls_{mode}_{run}", connection(hosts, mode))
        for mode in MODES
    }
    with writers["require"], writers["disable"]:
        after = dp.stamp()
        requested = time.monotonic()
        kube.annotate(ns, name, v1alpha1.SWITCHOVER_ANNOTATION, "any")
        record = dp.wait_switchover(kube, ns, name, after)
        done = time.monotonic()
        if record.get("phase") != "Succeeded":
            raise RuntimeError(f"switchover {run} failed: {record}")
        for writer in writers.values():
            writer.wait_acks_after(done, 20)
    new = kube.status(ns, name)["primaryPod"]
    result: dict[str, Any] = {"to": new}
    for mode, writer in writers.items():
        present = dp.rows_on(kube, ns, new, password, writer.table)
        result[mode] = dp.outcome(writer, requested, done, present)
    return result


def measure(kube: dp.Kube, args: argparse.Namespace) -> dict[str, Any]:
    ns, name = "bench-tls", "tls"
    kube.create_namespace(ns)
    result: dict[str, Any] = {"issuance_ms": issuance_ms()}
    say(f"==> apply → Ready, {dp.NODES} instances, plaintext clients allowed")
    result["ready"] = dp.measure_ready(
        kube, ns, name, dp.NODES, args.ready_timeout, extra=PLAINTEXT
    )
    status = dp.wait_until(
        lambda: dp.settled(kube, ns, name, dp.NODES), what="a settled cluster", timeout=240
    )
    password = kube.secret(ns, f"{name}-app", "password")
    address = (kube.pod(ns, status["primaryPod"]) or {})["status"]["podIP"]
    pgbench.initialize(connection([address], "require"), password)
    say(f"==> pgbench on the primary, {args.rounds} rounds of {args.seconds} s each way")
    result["persistent"] = pgbench_rounds(kube, ns, name, args.rounds, args.seconds, connect=False)
    result["connect"] = pgbench_rounds(kube, ns, name, args.rounds, args.seconds, connect=True)
    say(f"==> {args.runs} switchovers under a writer with TLS and one without")
    result["switchover"] = []
    for run in range(1, args.runs + 1):
        entry = switchover_once(kube, ns, name, run)
        say(
            f"    switchover {run} to {entry['to']}: downtime"
            f" {entry['require']['downtime_s']:.2f} s with TLS,"
            f" {entry['disable']['downtime_s']:.2f} s without; lost"
            f" {entry['require']['lost']} and {entry['disable']['lost']}"
        )
        result["switchover"].append(entry)
    result["runs"], result["rounds"], result["seconds"] = args.runs, args.rounds, args.seconds
    return result


def execute(args: argparse.Namespace) -> dict[str, Any]:
    dp.warm_caches()
    failures: list[str] = []
    with (
        dp.local_cluster(args.keep, failures) as cluster,
        dp.operator_for(cluster),
        cluster.http_client() as client,
    ):
        client.timeout = httpx.Timeout(30)
        result = measure(dp.Kube(client), args)
    result["up_failures"] = failures
    return result


# --- report ---------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _cost(with_tls: float, without: float) -> str:
    """How TLS changes a measure, as a signed percentage of the plaintext one."""
    if not without or without != without or with_tls != with_tls:
        return "—"
    return f"{(with_tls - without) / without * 100:+.1f} %"


def markdown(r: dict[str, Any], env: dict[str, str]) -> str:
    lines = [
        f"Run {env['date']} on {env['machine']}; {dp.NODES} real nodes; one 3-instance"
        " cluster (version 15) with `spec.tls.allowPlaintextClients: true`; pgbench"
        f" ({pgbench.CLIENTS} clients, {pgbench.THREADS} threads, scale {pgbench.SCALE}) on the"
        f" primary, {r['rounds']} alternating rounds of {r['seconds']} s each way; the writers"
        " are `psql`, one connection per insert.",
        "",
        "| | with TLS (`sslmode=require`) | without (`sslmode=disable`) | TLS costs |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("persistent", "persistent connections"),
        ("connect", "a connection per transaction"),
    ):
        runs = r[key]
        tps = {mode: _mean([run["tps"] for run in runs[mode]]) for mode in MODES}
        latency = {mode: _mean([run["latency_ms"] for run in runs[mode]]) for mode in MODES}
        lines += [
            f"| **pgbench, {label}: tps** | **{tps['require']:.0f}** |"
            f" **{tps['disable']:.0f}** | {_cost(tps['require'], tps['disable'])} |",
            f"| pgbench, {label}: average latency | {latency['require']:.2f} ms |"
            f" {latency['disable']:.2f} ms | {_cost(latency['require'], latency['disable'])} |",
        ]
    entries = r["switchover"]
    for label, field, unit, digits in (
        ("**switchover: write downtime** (median)", "downtime_s", " s", 2),
        ("writer: gap between inserts, normally (median)", "insert_gap_before_s", " s", 3),
    ):
        values = {
            mode: statistics.median(
                [e[mode][field] for e in entries if e[mode][field] is not None] or [float("nan")]
            )
            for mode in MODES
        }
        lines.append(
            f"| {label} | {values['require']:.{digits}f}{unit} |"
            f" {values['disable']:.{digits}f}{unit} |"
            f" {_cost(values['require'], values['disable'])} |"
        )
    lost = {mode: sum(e[mode]["lost"] for e in entries) for mode in MODES}
    acked = {mode: sum(e[mode]["acknowledged"] for e in entries) for mode in MODES}
    lines.append(
        f"| switchover: acknowledged rows lost, {len(entries)} runs |"
        f" {lost['require']} of {acked['require']} | {lost['disable']} of {acked['disable']} | |"
    )
    issuance = r["issuance_ms"]
    lines += [
        "",
        f"**apply → Ready**: {r['ready']['ready_s']:.1f} s for this cluster. The members always"
        " talk TLS to each other, so there is no Ready without TLS to set beside it; what TLS"
        " adds before the first pod can start is the operator making the cluster's CA,"
        " serving certificate and client certificates:"
        f" {statistics.median(issuance):.1f} ms of CPU (median of {len(issuance)}, max"
        f" {max(issuance):.1f} ms), and two Secrets written.",
    ]
    for failure in r.get("up_failures") or []:
        lines += ["", f"A first `up()` failed and was retried: {failure.split(' (logs')[0]}"]
    return "\n".join(lines) + "\n"


def write_doc(text: str) -> None:
    dp.write_after_dataplane(BEGIN, END, "What TLS costs", text)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tls", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3, help="switchovers (3)")
    parser.add_argument("--rounds", type=int, default=2, help="pgbench rounds each way (2)")
    parser.add_argument("--seconds", type=int, default=20, help="seconds of each pgbench run (20)")
    parser.add_argument(
        "--ready-timeout", type=float, default=300, help="give up on Ready after (300) s"
    )
    output_flags(parser)
    args = parser.parse_args(argv)
    if min(args.runs, args.rounds, args.seconds) < 1:
        parser.error("--runs, --rounds and --seconds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not ready_for_real_nodes():
        return 2
    result = execute(args)
    text = markdown(result, environment())
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    if not args.no_doc:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
