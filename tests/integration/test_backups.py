"""Backups on real nodes: pgBackRest in the instance pods, the local S3 object store
(versitygw, run by ``local up``), WAL archiving, scheduled and final backups, and failures.

The repository is checked from both sides: what the operator reports (status, conditions,
Events) and what the object store holds on the host (pgBackRest's ``backup.info`` in the
bucket directory), so a status that claims a backup nobody wrote fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab.dataplane import (
    client_of,
    create_cluster,
    event_reasons,
    fresh_namespace,
    local_repository,
    operator_on,
    ready,
    sql,
    status_of,
)
from lab.operator import get_pgc
from lab.waiting import wait_for
from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from stateward.cli import plugin
from stateward_local.cluster import LocalCluster
from stateward_local.images import catalog
from stateward_local.run import (
    OperatorProcess,
    PostgresClusterResource,
)
from stateward_local.services import objectstore
from tests.integration.conftest import condition

pytestmark = pytest.mark.integration

EVERY_MINUTE = "* * * * *"
LABEL = re.compile(r"^(\d{8}-\d{6}F(_\d{8}-\d{6}[DI])?)=", re.MULTILINE)


@pytest.fixture(scope="module")
def client(real_cluster: LocalCluster) -> Client:
    return client_of(real_cluster)


@pytest.fixture(scope="module")
def backup_operator(real_cluster: LocalCluster, client: Client) -> Iterator[OperatorProcess]:
    with operator_on(real_cluster, client, "backup-operator") as handle:
        yield handle


@pytest.fixture
def ns(client: Client, backup_operator: OperatorProcess) -> Iterator[str]:
    with fresh_namespace(client) as name:
        yield name


def stored_backups(real: LocalCluster, path: str, stanza: str) -> list[str]:
    """The backup labels pgBackRest's ``backup.info`` in the bucket lists, oldest first."""
    info = Path(
        real.objectstore_dir, "data", objectstore.BUCKET, path.lstrip("/"), "backup", stanza
    )
    try:
        text = (info / "backup.info").read_text()
    except FileNotFoundError:
        return []
    current = (
        text.split("[backup:current]", 1)[1].split("\n[", 1)[0]
        if "[backup:current]" in (text)
        else ""
    )
    return [match.group(1) for match in LABEL.finditer(current)]


def gone(client: Client, ns: str, name: str) -> bool:
    try:
        get_pgc(client, name, ns)
    except ApiError as error:
        return error.status.code == 404
    return False


def test_scheduled_and_final_backups_are_real_pgbackrest_backups(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    path = f"/{ns}/orders"
    backup = local_repository(client, ns, path)
    backup["retention"] = {"full": 1}  # each full backup expires the one before
    create_cluster(
        client,
        ns,
        "orders",
        replicas=2,
        backupSchedule=EVERY_MINUTE,
        backup=backup,
        deletionPolicy={},
    )
    ready(client, ns, "orders")
    primary = status_of(client, ns, "orders")["primaryPod"]
    assert sql(real_cluster, ns, primary, "CREATE TABLE t AS SELECT generate_series(1, 1000) n")
    # The schedule fires within a minute; the Job execs pgBackRest in the primary.
    reported = wait_for(
        lambda: (s := status_of(client, ns, "orders")).get("lastBackupTime") and s,
        what="a scheduled backup reported in status",
        timeout=300,
        interval=2,
    )
    backups = reported["backups"]
    assert backups["count"] >= 1 and backups["full"] >= 1
    assert backups["latest"]["type"] == "full"
    assert reported["lastBackupTime"] == backups["latest"]["finishedAt"]
    assert backups["recoverableFrom"] <= backups["latest"]["finishedAt"]
    assert backups["job"].startswith("orders-backup-")
    # The Job that may exec into the instances ran the operator's own image, by digest.
    operator_image = catalog.OPERATOR_REF
    job_pods = client.list(Pod, namespace=ns, labels={"job-name": backups["job"]})
    ran = {c.image for p in job_pods for c in p.spec.containers}  # type: ignore[union-attr]
    assert ran == {f"{operator_image}@{real_cluster.image_pins()[operator_image]}"}, ran
    # What status claims is in the bucket, written by pgBackRest.
    assert backups["latest"]["label"] in stored_backups(real_cluster, path, "orders")
    last = condition(get_pgc(client, "orders", ns), "LastBackupSucceeded")
    assert last["status"] == "True" and backups["latest"]["label"] in last["message"]
    assert "BackupSucceeded" in event_reasons(client, ns)
    # WAL is archived continuously: a switched segment reaches the repository, and no
    # attempt has failed (the stanza is created at bootstrap, before the first segment).
    archiver = "SELECT archived_count, failed_count FROM pg_stat_archiver"
    archived, failed = map(int, sql(real_cluster, ns, primary, archiver).split("|"))
    assert failed == 0
    sql(real_cluster, ns, primary, "INSERT INTO t SELECT generate_series(1001, 2000)")
    sql(real_cluster, ns, primary, "SELECT pg_switch_wal()")
    wait_for(
        lambda: (
            (now := sql(real_cluster, ns, primary, archiver)) and int(now.split("|")[0]) > archived
        ),
        what="the switched WAL segment archived",
        timeout=60,
    )
    assert int(sql(real_cluster, ns, primary, archiver).split("|")[1]) == 0
    # Stop the schedule (one backup a minute is enough); a backup on request, through the
    # kubectl plugin, which waits for the outcome.
    client.patch(
        PostgresClusterResource,
        "orders",
        {"spec": {"backupSchedule": None}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    # (A scheduled backup that started before that finishes first: this one is the newest.)
    wait_for(
        lambda: (
            not [
                p
                for p in client.list(Pod, namespace=ns, labels={"stateward.io/backup": "scheduled"})
                if p.status and p.status.phase in ("Pending", "Running")
            ]
        ),
        what="the last scheduled backup to finish",
        timeout=120,
    )
    lines: list[str] = []
    argv = ["--kubeconfig", str(real_cluster.kubeconfig), "-n", ns, "backup", "orders"]
    assert plugin.COMMANDS["backup"](plugin.parse(argv), lines.append) == 0, lines
    requested = status_of(client, ns, "orders")["onDemandBackup"]
    assert requested["phase"] == "Succeeded" and requested["job"].startswith("orders-backup-")
    label = requested["message"].split()[1]
    # Retention: only the newest full backup is kept, and the window starts with it.
    assert stored_backups(real_cluster, path, "orders") == [label]
    kept = status_of(client, ns, "orders")["backups"]
    assert kept["count"] == 1 and kept["latest"]["label"] == label
    assert kept["recoverableFrom"] == kept["latest"]["finishedAt"]
    assert "BackupRequested" in event_reasons(client, ns)
    # Deletion: the final backup is a real one too, and the cluster goes only after it.
    before = stored_backups(real_cluster, path, "orders")
    client.delete(PostgresClusterResource, "orders", namespace=ns)
    wait_for(lambda: gone(client, ns, "orders"), what="the cluster to go", timeout=300)
    after = stored_backups(real_cluster, path, "orders")
    assert len(after) == 1 and after[-1] not in before, (before, after)
    assert {"FinalBackupStarted", "FinalBackupSucceeded"} <= set(event_reasons(client, ns))


# A failed backup, a failing final backup, and then deletion, which waits up to the
# instance's 120 s grace period for a PostgreSQL that cannot archive its WAL to stop.
@pytest.mark.timeout(600)
def test_an_unreachable_repository_fails_visibly_and_never_counts_as_a_backup(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    backup = local_repository(client, ns, f"/{ns}/lost")
    # A store that does not answer: a Service name nothing serves.
    backup["repository"]["s3"]["endpoint"] = "nowhere.kube-system.svc"
    create_cluster(
        client,
        ns,
        "lost",
        replicas=1,
        backupSchedule=EVERY_MINUTE,
        backup=backup,
        deletionPolicy={},
    )
    ready(client, ns, "lost")
    failed = wait_for(
        lambda: (
            (c := condition(get_pgc(client, "lost", ns), "LastBackupSucceeded"))
            and c["status"] == "False"
            and c
        ),
        what="the failed scheduled backup reported",
        timeout=300,
        interval=2,
    )
    assert "failed" in failed["message"] and "lost-backup-" in failed["message"]
    status = status_of(client, ns, "lost")
    assert "lastBackupTime" not in status and "backups" not in status
    assert "BackupFailed" in event_reasons(client, ns)
    # Deletion waits for a final backup it cannot take, and says how to go without one.
    client.patch(
        PostgresClusterResource,
        "lost",
        {"spec": {"backupSchedule": None}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    client.delete(PostgresClusterResource, "lost", namespace=ns)
    # The first failed pod is reported while its Job still retries.
    waiting = wait_for(
        lambda: (
            (c := condition(get_pgc(client, "lost", ns), "FinalBackup"))
            and c.get("reason") in ("PodFailed", "Failed")
            and c
        ),
        what="the final backup to fail",
        timeout=300,
        interval=2,
    )
    assert "spec.deletionPolicy.finalBackup=false" in waiting["message"]
    assert "pgbackrest stanza-create" in waiting["message"]
    assert "FinalBackupPodFailed" in event_reasons(client, ns) or (
        "FinalBackupFailed" in event_reasons(client, ns)
    )
    client.patch(
        PostgresClusterResource,
        "lost",
        {"spec": {"deletionPolicy": {"finalBackup": False}}},
        namespace=ns,
        patch_type=PatchType.MERGE,
    )
    # Deletion waits for the instance to stop (Patroni's state goes only after it), and a
    # PostgreSQL whose WAL cannot be archived takes up to its grace period (120 s) to stop.
    wait_for(lambda: gone(client, ns, "lost"), what="the cluster to go", timeout=300)


CHECKSUM = "SELECT count(*) || ':' || md5(string_agg(n::text, ',' ORDER BY n)) FROM t"


def restored(
    client: Client,
    ns: str,
    name: str,
    source: str,
    replicas: int,
    version: str = "15",
    **target: str,
) -> None:
    create_cluster(
        client,
        ns,
        name,
        replicas=replicas,
        version=version,
        backup=local_repository(client, ns, f"/{ns}/{name}"),
        bootstrap={"restore": {"cluster": source, **target}},
    )


# Four clusters come up in turn (source, point in time, clone, the source again after its
# final backup and deletion), each wait allowing 300 s on a busy machine: the default 300 s
# for the whole story cut it short in a clean-clone run under load.
@pytest.mark.timeout(900)
def test_restores_to_a_point_in_time_a_clone_and_a_deleted_cluster_into_its_own_name(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    create_cluster(
        client,
        ns,
        "src",
        replicas=1,
        backup=local_repository(client, ns, f"/{ns}/src"),
        deletionPolicy={},
    )
    primary = ready(client, ns, "src")["status"]["primaryPod"]
    assert sql(real_cluster, ns, primary, "CREATE TABLE t AS SELECT generate_series(1, 1000) n")
    lines: list[str] = []
    argv = ["--kubeconfig", str(real_cluster.kubeconfig), "-n", ns, "backup", "src"]
    assert plugin.COMMANDS["backup"](plugin.parse(argv), lines.append) == 0, lines
    between = _two_writes_with_a_moment_between(real_cluster, ns, primary)
    source_sum = sql(real_cluster, ns, primary, CHECKSUM)
    assert source_sum.startswith("1002:")

    # Point in time: the first write is there, the second is not.
    restored(client, ns, "pitr", "src", 1, targetTime=between)
    pitr = ready(client, ns, "pitr", timeout=300)["status"]["primaryPod"]
    assert sql(real_cluster, ns, pitr, "SELECT count(*), max(n) FROM t") == "1001|1001"

    # A clone of the running cluster (its latest state), with a replica made from it; it
    # writes and archives on its own timeline into its own repository.
    restored(client, ns, "clone", "src", 2)
    clone = ready(client, ns, "clone", timeout=300)["status"]["primaryPod"]
    assert sql(real_cluster, ns, clone, CHECKSUM) == source_sum
    # A new timeline (the WAL file name's first 8 hex digits; pg_control's checkpoint
    # timeline would lag until the first checkpoint after the promotion).
    timeline = sql(real_cluster, ns, clone, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    assert int(timeline[:8], 16) > 1, timeline
    written = "WITH i AS (INSERT INTO t VALUES (2000) RETURNING n) SELECT n FROM i"
    assert sql(real_cluster, ns, clone, written) == "2000"
    sql(real_cluster, ns, clone, "SELECT pg_switch_wal()")
    wait_for(
        lambda: (
            sql(real_cluster, ns, clone, "SELECT archived_count > 0 FROM pg_stat_archiver") == "t"
        ),
        what="the clone archiving into its own repository",
        timeout=60,
    )
    assert Path(
        real_cluster.objectstore_dir, "data", objectstore.BUCKET, ns, "clone", "archive", "clone"
    ).is_dir()
    # The source did not see the clone's write.
    assert sql(real_cluster, ns, primary, CHECKSUM) == source_sum

    # Deleted (a final backup first), then a new cluster of the same name restores it.
    client.delete(PostgresClusterResource, "src", namespace=ns)
    wait_for(lambda: gone(client, ns, "src"), what="the source to go", timeout=300)
    restored(client, ns, "src", "src", 1)
    again = ready(client, ns, "src", timeout=300)["status"]["primaryPod"]
    assert sql(real_cluster, ns, again, CHECKSUM) == source_sum


def _two_writes_with_a_moment_between(real: LocalCluster, ns: str, primary: str) -> str:
    """Rows 1001 and 1002 into ``t``, both archived; the moment between them (RFC 3339)."""
    sql(real, ns, primary, "INSERT INTO t VALUES (1001)")
    between = sql(
        real,
        ns,
        primary,
        """SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""",
    )
    sql(real, ns, primary, "INSERT INTO t VALUES (1002)")
    _archived_after_switch(real, ns, primary)
    return between


def _archived_after_switch(real: LocalCluster, ns: str, pod: str) -> None:
    """A new WAL segment archived: archiving works (pgBackRest accepts this major)."""
    archiver = "SELECT archived_count FROM pg_stat_archiver"
    archived = int(sql(real, ns, pod, archiver) or 0)
    sql(real, ns, pod, "SELECT pg_switch_wal()")
    wait_for(
        lambda: int(sql(real, ns, pod, archiver) or 0) > archived,
        what=f"a WAL segment of {pod} archived",
        timeout=90,
    )


@pytest.mark.timeout(900)
def test_an_upgraded_cluster_archives_again_and_restores_to_a_point_in_time_on_17(
    real_cluster: LocalCluster, client: Client, ns: str
) -> None:
    # pgBackRest refuses WAL of another major than its stanza's: after pg_upgrade the
    # upgraded primary upgrades the stanza itself, so archiving goes on, and a backup taken
    # on 17 restores to a point in time on 17.
    create_cluster(client, ns, "old", replicas=1, backup=local_repository(client, ns, f"/{ns}/old"))
    primary = ready(client, ns, "old")["status"]["primaryPod"]
    assert sql(real_cluster, ns, primary, "CREATE TABLE t AS SELECT generate_series(1, 1000) n")
    argv = ["--kubeconfig", str(real_cluster.kubeconfig), "-n", ns, "backup", "old"]
    lines: list[str] = []
    assert plugin.COMMANDS["backup"](plugin.parse(argv), lines.append) == 0, lines
    client.patch(
        PostgresClusterResource, "old", {"spec": {"version": "17"}},
        namespace=ns, patch_type=PatchType.MERGE,
    )  # fmt: skip
    wait_for(
        lambda: (status_of(client, ns, "old").get("upgrade") or {}).get("phase") == "Succeeded",
        what="the upgrade to 17",
        timeout=600,
    )
    primary = ready(client, ns, "old")["status"]["primaryPod"]
    assert sql(real_cluster, ns, primary, "SHOW server_version_num").startswith("17")
    _archived_after_switch(real_cluster, ns, primary)
    lines.clear()
    assert plugin.COMMANDS["backup"](plugin.parse(argv), lines.append) == 0, lines
    between = _two_writes_with_a_moment_between(real_cluster, ns, primary)

    restored(client, ns, "pitr17", "old", 1, version="17", targetTime=between)
    pitr = ready(client, ns, "pitr17", timeout=300)["status"]["primaryPod"]
    assert sql(real_cluster, ns, pitr, "SHOW server_version_num").startswith("17")
    assert sql(real_cluster, ns, pitr, "SELECT count(*), max(n) FROM t") == "1001|1001"
