"""The write downtime of an in-place major upgrade (15 -> 17), at 100 MB and 1 GB of data.

On a fresh local cluster with 3 real nodes (as ``bench.dataplane``, whose helpers this
uses) and the operator as a process: for each size, a 3-instance PostgresCluster of
version 15 in its own namespace, a table of that size written through the primary Service,
the cluster waited for until every instance has caught up; then a writer inserts numbered
rows through the primary Service (one ``psql`` each, ``connect_timeout=2``) while
``spec.version`` is set to ``"17"``. Reported: the write downtime (the longest gap between
acknowledged inserts around the upgrade), the time until ``status.upgrade`` is
``Succeeded`` (the replicas cloned anew), acknowledged rows lost, and the data's md5 before
and after.

Writes its table into docs/benchmarks.md between ``<!-- upgrade:begin -->`` and
``<!-- upgrade:end -->``. ``make bench-dataplane`` runs it after ``bench.dataplane``; alone:

    flock /tmp/stateward-real-nodes.lock .venv/bin/python -m bench.upgrade [--sizes 100,1024]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx

from bench import dataplane as dp
from bench.common import environment, output_flags, ready_for_real_nodes, say

BEGIN = "<!-- upgrade:begin -->"
END = "<!-- upgrade:end -->"
ROW_BYTES = 1000
"""About what one row of the filler table takes (a 960-character text and its header)."""
FILL = (
    "create table filler as select g, repeat(md5(g::text), 30) as pad"
    " from generate_series(1, {rows}) g"
)
DIGEST = "select md5(string_agg(md5(pad), ',' order by g)) from filler"


def rows_for(megabytes: int) -> int:
    return megabytes * 1024 * 1024 // ROW_BYTES


def storage_for(megabytes: int) -> str:
    """Room for the data, its WAL and pg_upgrade's new catalog."""
    return f"{max(1, (megabytes * 4) // 1024 + 1)}Gi"


def service_dsn(kube: dp.Kube, ns: str, name: str, timeout: int = 2) -> str:
    address = kube.service_ip(ns, f"{name}-primary")
    return f"host={address} port=5432 dbname=app user=app sslmode=require connect_timeout={timeout}"


def upgrade_once(kube: dp.Kube, megabytes: int, timeout: float) -> dict[str, Any]:
    ns, name = f"bench-upgrade-{megabytes}", "up"
    kube.create_namespace(ns)
    kube.create_pgc(ns, name, dp.NODES, storage=storage_for(megabytes))
    dp.wait_until(lambda: dp.settled(kube, ns, name, dp.NODES), what="Ready", timeout=timeout)
    password = kube.secret(ns, f"{name}-app", "password")
    connection = service_dsn(kube, ns, name, timeout=10)
    filled = time.monotonic()
    if dp.psql(connection, password, FILL.format(rows=rows_for(megabytes)), timeout=1800) is None:
        raise RuntimeError(f"could not write {megabytes} MB into {ns}/{name}")
    size = dp.psql(connection, password, "select pg_database_size('app') / 1048576")
    before = dp.psql(connection, password, DIGEST, timeout=600)
    fill_s = time.monotonic() - filled
    dp.wait_until(
        lambda: dp.settled(kube, ns, name, dp.NODES), what="replicas caught up", timeout=timeout
    )
    writer = dp.Writer([], password, "during", service_dsn(kube, ns, name))
    with writer:
        requested = time.monotonic()
        kube.patch_spec(ns, name, {"version": "17"})

        def succeeded() -> dict[str, Any] | None:
            record = dict(kube.status(ns, name).get("upgrade") or {})
            if record.get("phase") in ("Refused", "Failed"):
                raise RuntimeError(f"the upgrade ended {record['phase']}: {record['message']}")
            return record if record.get("phase") == "Succeeded" else None

        record = dp.wait_until(succeeded, what="the upgrade", timeout=timeout, interval=0.5)
        done = time.monotonic()
        writer.wait_acks_after(done, 20)
    after = dp.psql(connection, password, DIGEST, timeout=600)
    version = dp.psql(connection, password, "show server_version_num")
    present = dp.parse_rows(
        dp.psql(connection, password, "select string_agg(n::text, ',') from during") or ""
    )
    result = dp.outcome(writer, requested, done, present)
    kube.delete_namespace(ns, timeout)
    return {
        **result,
        "megabytes": megabytes,
        "database_mb": int(size or 0),
        "fill_s": round(fill_s, 1),
        "upgrade_s": round(done - requested, 1),
        "same_data": before is not None and before == after,
        "server_version_num": version,
        "record": record,
    }


def markdown(runs: list[dict[str, Any]], env: dict[str, str]) -> str:
    lines = [
        f"Run {env['date']} on {env['machine']}; {dp.NODES} real nodes; 3 instances,"
        " version 15 -> 17; a writer through the primary Service.",
        "",
        "| data | database size | **write downtime** | request -> `Succeeded` (replicas"
        " cloned) | rows lost | same md5 after | server_version_num |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['megabytes']} MB | {r['database_mb']} MB | **{r['downtime_s']:.1f} s** |"
            f" {r['upgrade_s']:.1f} s | {r['lost']} of {r['acknowledged']} |"
            f" {'yes' if r['same_data'] else '**no**'} | {r['server_version_num']} |"
        )
    return "\n".join(lines) + "\n"


def write_doc(text: str) -> None:
    dp.write_after_dataplane(BEGIN, END, "Major upgrade", text)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.upgrade", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--sizes", default="100,1024", help="data sizes in MB (100,1024)")
    parser.add_argument("--timeout", type=float, default=900, help="per wait (900) s")
    output_flags(parser)
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    if not args.sizes or min(args.sizes) < 1:
        parser.error("--sizes takes positive megabytes, comma-separated")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not ready_for_real_nodes():
        return 2
    dp.warm_caches()
    failures: list[str] = []
    runs: list[dict[str, Any]] = []
    with (
        dp.local_cluster(args.keep, failures) as cluster,
        dp.operator_for(cluster),
        cluster.http_client() as client,
    ):
        client.timeout = httpx.Timeout(30)
        kube = dp.Kube(client)
        for megabytes in args.sizes:
            say(f"==> upgrade 15 -> 17 with {megabytes} MB")
            run = upgrade_once(kube, megabytes, args.timeout)
            say(
                f"    downtime {run['downtime_s']:.1f} s, Succeeded after"
                f" {run['upgrade_s']:.1f} s, lost {run['lost']}, same data {run['same_data']}"
            )
            runs.append(run)
    text = markdown(runs, environment())
    print(text)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2, default=str))
    if not args.no_doc:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
