"""``stateward-instance backup``: what the backup Jobs run.

It finds the cluster's primary (the pod Patroni labels primary), runs pgBackRest there
through the API server's exec (``podexec``): ``stanza-create`` (a no-op once the stanza
exists and matches this cluster; a refusal when the repository holds another cluster's),
then ``backup``, then ``info``. The result goes to the container's termination message, where
the operator reads it: ``status.lastBackupTime`` comes only from a backup that pgBackRest
itself lists as complete afterwards.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from stateward.instance import patroni, pgbackrest, podexec

TERMINATION_LOG: Final = Path("/dev/termination-log")
BACKUP_TYPES: Final = ("full", "diff", "incr")
LOCK_EXIT_CODE: Final = 50
"""pgBackRest's LockAcquireError: another backup (or stanza command) holds the lock."""
LOCK_RETRY_SECONDS: Final = 10.0
LOCK_WAIT_SECONDS: Final = 1800.0
MESSAGE_LIMIT: Final = 4000
"""The kubelet keeps at most 4096 bytes of a termination message."""


class BackupError(Exception):
    """Why the backup did not complete, in one line for the Job's log and the operator."""


def primary_pod(pods: Mapping[str, Any]) -> str:
    """The one running, not terminating pod of a pod list labelled primary."""
    running = [
        pod["metadata"]["name"]
        for pod in pods.get("items") or []
        if (pod.get("status") or {}).get("phase") == "Running"
        and not pod["metadata"].get("deletionTimestamp")
    ]
    if not running:
        raise BackupError(
            "the cluster has no running primary (no pod labelled"
            f" {patroni.ROLE_LABEL}={patroni.PRIMARY_ROLE}): nothing to back up from"
        )
    if len(running) > 1:
        raise BackupError(f"more than one pod is labelled primary ({', '.join(running)})")
    return str(running[0])


def selector(cluster: str) -> str:
    return f"{patroni.SCOPE_LABEL}={cluster},{patroni.ROLE_LABEL}={patroni.PRIMARY_ROLE}"


def _say(message: str) -> None:
    print(f"stateward-instance backup: {message}", flush=True)


def backup(
    api: podexec.InCluster, *, cluster: str, container: str, stanza: str, backup_type: str
) -> dict[str, Any]:
    """Take one backup of ``cluster``; the repository's summary afterwards."""
    pods = api.get(f"/api/v1/namespaces/{api.namespace}/pods?labelSelector={selector(cluster)}")
    pod = primary_pod(pods)
    _say(f"{backup_type} backup of {cluster} from its primary {pod}")
    # Info level on the console: the Job's log then tells what pgBackRest did.
    steps = (
        # Small files: 10 s per I/O is ample, and an unreachable store fails in about a
        # minute and a half instead of eight (pgBackRest retries each I/O up to 8 times).
        (
            "stanza-create",
            ["pgbackrest", "--log-level-console=info", "--io-timeout=10", "stanza-create"],
        ),
        (
            "backup",
            # An immediate checkpoint instead of waiting for a spread one.
            [
                "pgbackrest",
                "--log-level-console=info",
                "backup",
                f"--type={backup_type}",
                "--start-fast",
            ],
        ),
    )
    for step, command in steps:
        code = podexec.run(api, pod, container, command)
        waited = 0.0
        while code == LOCK_EXIT_CODE and waited < LOCK_WAIT_SECONDS:
            # Another backup of this stanza holds pgBackRest's lock (a scheduled one and a
            # requested one met): take ours after it rather than fail.
            _say(f"another backup is running; retrying in {LOCK_RETRY_SECONDS:.0f}s")
            time.sleep(LOCK_RETRY_SECONDS)
            waited += LOCK_RETRY_SECONDS
            code = podexec.run(api, pod, container, command)
        if code != 0:
            raise BackupError(
                f"pgbackrest {step} in {pod} failed (exit code {code}); its output is in this"
                " Job's log"
            )
    code, out = podexec.capture(api, pod, container, ["pgbackrest", "info", "--output=json"])
    if code != 0:
        raise BackupError(f"pgbackrest info in {pod} failed (exit code {code})")
    try:
        summary = pgbackrest.summarize(json.loads(out), stanza)
    except ValueError as error:
        raise BackupError(str(error)) from None
    latest = summary.get("latest") or {}
    _say(
        f"complete: {latest.get('label')} finished {latest.get('finishedAt')};"
        f" {summary['count']} backups in the repository"
    )
    return summary


def main(
    *,
    cluster: str,
    container: str,
    stanza: str,
    backup_type: str,
    termination_log: Path = TERMINATION_LOG,
) -> int:
    try:
        api = podexec.InCluster.load()
        summary = backup(
            api, cluster=cluster, container=container, stanza=stanza, backup_type=backup_type
        )
    except (BackupError, podexec.ExecError) as error:
        print(f"stateward-instance backup: {error}", file=sys.stderr, flush=True)
        _report(termination_log, {"error": str(error)})
        return 1
    _report(termination_log, summary)
    return 0


def _report(path: Path, document: Mapping[str, Any]) -> None:
    """The termination message the operator reads (the kubelet keeps at most 4 KiB)."""
    text = json.dumps(document, separators=(",", ":"))
    if len(text) > MESSAGE_LIMIT:
        reason = str(document.get("error") or "the backup's report was too long")
        text = json.dumps({"error": reason[: MESSAGE_LIMIT // 2] + "..."})
    try:
        path.write_text(text)
    except OSError as error:
        print(f"stateward-instance backup: cannot write {path}: {error}", file=sys.stderr)
