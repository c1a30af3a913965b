"""``make bench-backup``: backup and restore throughput, WAL archive lag, restore time by size.

A fresh local cluster with three real nodes (``bench.dataplane.local_cluster``), the operator
as a process, and the local S3 object store (versitygw) as the repository. For each pgbench
scale of ``--scales`` (default 10 and 50: about 150 MB and 750 MB of data):

1. a 1-instance PostgresCluster (version 15) with ``spec.backup`` on the object store, and
   ``pgbench -i -s SCALE`` in its primary (the ``postgres`` database);
2. **full backup**: requested with the ``stateward.io/backup`` annotation and waited for
   until ``status.onDemandBackup`` is Succeeded; the throughput is pgBackRest's own report
   (``status.backups.latest``: database size over its start-to-stop time), and the time the
   user waits is measured from the request too;
3. **WAL archive lag**: ``pgbench -N -c 4 -T --load-seconds`` (unthrottled: the machine's
   worst case) while ``pg_stat_archiver`` is sampled every second: segments completed but not
   yet archived, and the age of the newest archived segment; with the WAL rate it generated;
4. **restore**: a new cluster with ``spec.bootstrap.restore`` from the source's repository
   (latest), timed from the create call until Ready, and checked (``pgbench_accounts`` holds
   ``SCALE`` x 100000 rows).

The result goes to ``bench/results/backups.json`` and, unless ``--no-doc``, between the
markers of the "Backups and restore" section of docs/benchmarks.md. Needs root and no other
cluster with real nodes on this host.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from lab.dataplane import (
    annotate,
    create_cluster,
    local_repository,
    ready,
    sql,
    status_of,
)
from lab.operator import wait_leading
from lab.waiting import wait_for
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from bench.common import say, write_block
from bench.dataplane import local_cluster
from stateward.api import v1alpha1
from stateward.controllers import core
from stateward_local import binaries
from stateward_local.cluster import LocalCluster
from stateward_local.run import (
    OPERATOR_NAMESPACE,
    PostgresClusterResource,
    ensure_namespace,
    install_crds,
    start_operator,
)

RESULTS = Path("bench/results/backups.json")
DOC = Path("docs/benchmarks.md")
SECTION = "## Backups and restore"
BEGIN = "<!-- backups:begin -->"
END = "<!-- backups:end -->"
PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
SEGMENT = 16 * 2**20
ACCOUNTS_PER_SCALE = 100_000
METHOD = f"""\
{SECTION}

What a backup and a restore cost on the local cluster: `make bench-backup` (`python -m
bench.backups`, `--help` for the options) rewrites the part between the markers below.

**Method.** A fresh local cluster with 3 real nodes, the operator as a process on the host,
and the local S3 object store (versitygw over a directory on the same disk, TLS) as the
pgBackRest repository. For each pgbench scale: a 1-instance PostgresCluster (version 15),
`pgbench -i -s SCALE` in its primary; a full backup on request (the `stateward.io/backup`
annotation): *backup MB/s* is pgBackRest's own report (database size over the backup's
start-to-stop time, from `status.backups.latest`), *waited* runs from the request until
`status.onDemandBackup` is Succeeded (Job start and the report included); *WAL archive lag*
samples `pg_stat_archiver` every second during an unthrottled `pgbench -N -c 4` (the worst
case on this machine): segments completed but not yet in the repository, and the age of the
newest archived segment, with the WAL rate the load generated; *restore* runs from the create
call of a new cluster with `spec.bootstrap.restore` (the source's latest backup and its
archived WAL) until `status.phase` is Ready, and *restore MB/s* is the database size over
that time. The machine has 2 cores shared with other work; the repository is on the same
disk as the volumes.
"""


# --- pure helpers -----------------------------------------------------------------------------


def segment_number(walfile: str) -> int:
    """A WAL file name's position in the WAL (16 MiB segments: 256 per log file)."""
    return int(walfile[8:16], 16) * 0x100 + int(walfile[16:24], 16)


def unarchived(current: str, archived: str) -> int:
    """Segments completed but not archived: the current one is still being written."""
    if not archived:
        return max(segment_number(current), 0)
    return max(segment_number(current) - segment_number(archived) - 1, 0)


seconds_between = core.seconds_between
"""pgBackRest's start and stop times are RFC 3339 like the API server's: the core's parser."""


def mb_per_s(size_bytes: float, seconds: float) -> float:
    return size_bytes / 2**20 / seconds if seconds > 0 else float("nan")


def rows(result: dict[str, Any]) -> list[str]:
    lines = [
        "| pgbench scale | database MB | backup MB/s (pgBackRest) | backup waited s"
        " | repository MB | WAL generated MB/s | archive lag segments, median / max"
        " | newest archived age s, max | restore s | restore MB/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['scale']} | {r['database_mb']:.0f} | {r['backup_mb_s']:.1f}"
            f" | {r['backup_waited_s']:.1f} | {r['repository_mb']:.0f}"
            f" | {r['wal_mb_s']:.1f} | {r['lag_segments_median']:g} / {r['lag_segments_max']}"
            f" | {r['archived_age_max_s']:.1f} | {r['restore_s']:.1f} | {r['restore_mb_s']:.1f} |"
        )
    return lines


# --- steps ---------------------------------------------------------------------------------


def psql_in(real: LocalCluster, ns: str, pod: str, *argv: str, timeout: float) -> str:
    """A command in the instance container as the postgres user's socket client."""
    result = subprocess.run(
        [str(binaries.locate().kubectl), f"--kubeconfig={real.kubeconfig}", "exec", "-n", ns,
         pod, "--", *argv],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {result.stderr.strip()[-500:]}")
    return result.stdout


def generate(real: LocalCluster, ns: str, pod: str, scale: int) -> float:
    """``pgbench -i`` at ``scale``; the database size in bytes."""
    started = time.monotonic()
    psql_in(real, ns, pod, PGBENCH, "-i", "-q", "-s", str(scale), "-h", "/var/run/postgresql",
            "-U", "postgres", "postgres", timeout=1800)  # fmt: skip
    size = float(sql(real, ns, pod, "SELECT pg_database_size('postgres')"))
    say(f"    pgbench -i -s {scale}: {size / 2**20:.0f} MB in {time.monotonic() - started:.0f} s")
    return size


def full_backup(client: Client, ns: str, name: str) -> dict[str, Any]:
    """A backup on request, waited for; pgBackRest's report of it and the wait."""
    requested = time.monotonic()
    annotate(client, ns, name, f"bench-{uuid.uuid4().hex[:6]}", key=v1alpha1.BACKUP_ANNOTATION)
    status = wait_for(
        lambda: (
            (s := status_of(client, ns, name)).get("onDemandBackup", {}).get("phase")
            in ("Succeeded", "Failed")
            and s
        ),
        what="the requested backup",
        timeout=3600,
        interval=1,
    )
    waited = time.monotonic() - requested
    if status["onDemandBackup"]["phase"] != "Succeeded":
        raise RuntimeError(f"the backup failed: {status['onDemandBackup'].get('message')}")
    latest = status["backups"]["latest"]
    took = seconds_between(latest["startedAt"], latest["finishedAt"])
    return {
        "backup_s": took,
        "backup_mb_s": mb_per_s(latest.get("sizeBytes") or 0, took),
        "backup_waited_s": waited,
        "repository_mb": (latest.get("repositoryBytes") or 0) / 2**20,
        "label": latest["label"],
    }


ARCHIVER = (
    "SELECT pg_walfile_name(pg_current_wal_lsn()), coalesce(last_archived_wal, ''),"
    " coalesce(extract(epoch FROM now() - last_archived_time), 0),"
    " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') FROM pg_stat_archiver"
)


def archive_lag(real: LocalCluster, ns: str, pod: str, seconds: int) -> dict[str, Any]:
    """Sample the archiver every second while an unthrottled pgbench writes."""
    load = subprocess.Popen(
        [str(binaries.locate().kubectl), f"--kubeconfig={real.kubeconfig}", "exec", "-n", ns,
         pod, "--", PGBENCH, "-N", "-c", "4", "-j", "2", "-T", str(seconds), "-h",
         "/var/run/postgresql", "-U", "postgres", "postgres"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    samples: list[tuple[int, float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            line = sql(real, ns, pod, ARCHIVER)
            if line:
                current, archived, age, position = line.split("|")
                samples.append((unarchived(current, archived), float(age), float(position)))
            stop.wait(1)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    output, _ = load.communicate(timeout=seconds + 300)
    elapsed = time.monotonic() - started
    stop.set()
    sampler.join(timeout=30)
    if load.returncode != 0 or len(samples) < 2:
        raise RuntimeError(f"pgbench failed or no sample was taken: {output[-500:]}")
    tps = next((line for line in output.splitlines() if line.startswith("tps")), "tps = ?")
    lags = [lag for lag, _, _ in samples]
    return {
        "lag_segments_median": statistics.median(lags),
        "lag_segments_max": max(lags),
        "archived_age_max_s": max(age for _, age, _ in samples),
        "wal_mb_s": (samples[-1][2] - samples[0][2]) / 2**20 / elapsed,
        "tps": tps.split("(")[0].strip(),
        "samples": len(samples),
    }


def restore(client: Client, real: LocalCluster, ns: str, source: str, scale: int) -> float:
    """A new cluster restored from ``source``'s latest backup; seconds until Ready."""
    target = f"{source}-restored"
    started = time.monotonic()
    create_cluster(
        client, ns, target, replicas=1,
        backup=local_repository(client, ns, f"/{ns}/{target}"),
        bootstrap={"restore": {"cluster": source}},
    )  # fmt: skip
    primary = ready(client, ns, target, timeout=3600)["status"]["primaryPod"]
    took = time.monotonic() - started
    accounts = sql(real, ns, primary, "SELECT count(*) FROM pgbench_accounts")
    if accounts != str(scale * ACCOUNTS_PER_SCALE):
        raise RuntimeError(f"the restored cluster has {accounts} accounts, not {scale}00000")
    client.delete(PostgresClusterResource, target, namespace=ns)
    return took


def one_scale(client: Client, real: LocalCluster, ns: str, scale: int, load: int) -> dict[str, Any]:
    name = f"s{scale}"
    say(f"==> scale {scale}")
    create_cluster(
        client, ns, name, replicas=1, storageSize="8Gi",
        backup=local_repository(client, ns, f"/{ns}/{name}"),
    )  # fmt: skip
    primary = ready(client, ns, name, timeout=600)["status"]["primaryPod"]
    size = generate(real, ns, primary, scale)
    backup = full_backup(client, ns, name)
    say(
        f"    full backup {backup['label']}: {backup['backup_s']:.0f} s,"
        f" {backup['backup_mb_s']:.1f} MB/s, waited {backup['backup_waited_s']:.0f} s"
    )
    lag = archive_lag(real, ns, primary, load)
    say(
        f"    archive lag under load: median {lag['lag_segments_median']:g}, max"
        f" {lag['lag_segments_max']} segments; WAL {lag['wal_mb_s']:.1f} MB/s"
    )
    sql(real, ns, primary, "SELECT pg_switch_wal()")
    took = restore(client, real, ns, name, scale)
    say(f"    restore: Ready after {took:.0f} s ({mb_per_s(size, took):.1f} MB/s)")
    client.delete(PostgresClusterResource, name, namespace=ns)
    return {
        "scale": scale,
        "database_mb": size / 2**20,
        **backup,
        **lag,
        "restore_s": took,
        "restore_mb_s": mb_per_s(size, took),
    }


def run(scales: list[int], load: int, keep: bool) -> dict[str, Any]:
    failures: list[str] = []
    runs = []
    with local_cluster(keep, failures) as real:
        client = Client(KubeConfig.from_file(real.kubeconfig), field_manager="stateward-bench")
        install_crds(client)
        ensure_namespace(client, OPERATOR_NAMESPACE)
        operator = start_operator(real, extra=["--resync-interval=3"], name="bench-operator")
        ns = f"bench-{uuid.uuid4().hex[:8]}"
        client.create(Namespace(metadata=ObjectMeta(name=ns)))
        try:
            wait_leading(operator)
            for scale in scales:
                runs.append(one_scale(client, real, ns, scale, load))
        finally:
            operator.stop()
    return {
        "date": datetime.date.today().isoformat(),
        "load_seconds": load,
        "runs": runs,
        "up_failures": failures,
    }


def write_doc(result: dict[str, Any]) -> None:
    block = "\n".join(
        [f"Measured {result['date']}; load {result['load_seconds']} s per scale.", "",
         *rows(result)]
    ) + "\n"  # fmt: skip
    write_block(DOC, block, METHOD, begin=BEGIN, end=END)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.backups", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--scales", type=int, nargs="+", default=[10, 50], help="pgbench scales (10 50)"
    )
    parser.add_argument(
        "--load-seconds", type=int, default=60, help="seconds of write load for the lag (60)"
    )
    parser.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state and logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args.scales, args.load_seconds, args.keep)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(rows(result)))
    if not args.no_doc:
        write_doc(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
