"""pgBackRest in the instance pods: where its files are, its keys file, the commands the pod
runs (restore, stanza), and what its ``info`` says. Its options for a given cluster are the
operator's (``specs.postgres.backup``).

pgBackRest reads every option from ``PGBACKREST_*`` environment variables as well as from
its configuration files; the instance pods set the options as variables and the S3 keys as a
file (:data:`INCLUDE_DIR`, written at start by ``stateward-instance run`` from the mounted
credentials Secret, mode 0600), so ``pgbackrest`` works the same from Patroni's
``archive_command``, from ``kubectl exec`` and from the backup Job's exec, and no process's
environment holds a key. The stanza is the cluster's name, the repository its
``spec.backup`` (repo1).
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from stateward import rfc3339

CA_DIR: Final = "/etc/stateward/backup"
CA_FILE_NAME: Final = "ca.crt"
CA_FILE: Final = f"{CA_DIR}/{CA_FILE_NAME}"
LOCK_PATH: Final = "/tmp/pgbackrest"  # noqa: S108 - the container's private emptyDir
KEY_FILE: Final = f"{CA_DIR}/s3-key"
KEY_SECRET_FILE: Final = f"{CA_DIR}/s3-key-secret"
"""The S3 keys as the instance container mounts them (from the repository's Secret)."""
INCLUDE_DIR: Final = "/tmp/pgbackrest-conf.d"  # noqa: S108 - the container's private tmpfs
"""``PGBACKREST_CONFIG_INCLUDE_PATH``: :func:`keys_conf` is written here at start."""
ACCESS_KEY_KEY: Final = "accessKeyId"
SECRET_KEY_KEY: Final = "secretAccessKey"  # noqa: S105 - a key name
COMPRESS_TYPE: Final = "lz4"
"""Fast enough that compression never holds back WAL archiving (gz, the default, is ~5x
slower for a similar ratio on WAL)."""
IO_TIMEOUT_SECONDS: Final = 20
ARCHIVE_DISABLED: Final = "/bin/true"
"""The archive_command of a cluster without a repository: archive_mode stays on for every
cluster (turning it on later would need a restart), and WAL is recycled as without it."""


def keys_conf(key: str, secret: str) -> str:
    """pgBackRest's configuration with the repository's S3 keys, and nothing else."""
    for value in (key, secret):
        if not value or any(c in value for c in "\r\n"):
            raise ValueError("an S3 key is empty or spans lines")
    return f"[global]\nrepo1-s3-key={key}\nrepo1-s3-key-secret={secret}\n"


# --- what `pgbackrest info --output=json` says --------------------------------------------


def _time(epoch: object) -> str | None:
    if not isinstance(epoch, int | float) or isinstance(epoch, bool):
        return None
    return rfc3339.format(datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC))


def _backup(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    stamps = entry.get("timestamp") or {}
    started, finished = _time(stamps.get("start")), _time(stamps.get("stop"))
    if not entry.get("label") or started is None or finished is None or entry.get("error"):
        return None
    info = entry.get("info") or {}
    summary: dict[str, Any] = {
        "label": str(entry["label"]),
        "type": str(entry.get("type", "")),
        "startedAt": started,
        "finishedAt": finished,
    }
    if isinstance(info.get("size"), int):
        summary["sizeBytes"] = info["size"]
    repository = info.get("repository") or {}
    if isinstance(repository.get("delta"), int):
        summary["repositoryBytes"] = repository["delta"]
    return summary


def summarize(info: Sequence[Mapping[str, Any]], stanza: str) -> dict[str, Any]:
    """``status.backups`` (camelCase) from ``pgbackrest info --output=json``: complete backups
    only (one pgBackRest marks as errored does not count), oldest first.

    Raises ValueError when the stanza is missing or pgBackRest reports it unusable."""
    entry = next((s for s in info if isinstance(s, Mapping) and s.get("name") == stanza), None)
    if entry is None:
        raise ValueError(f"pgbackrest info does not list the stanza {stanza!r}")
    status = entry.get("status") or {}
    if status.get("code") not in (0, None):
        raise ValueError(
            f"pgBackRest reports stanza {stanza!r} unusable: {status.get('message', 'no reason')}"
        )
    backups = [b for b in (_backup(e) for e in entry.get("backup") or []) if b is not None]
    backups.sort(key=lambda b: b["finishedAt"])
    result: dict[str, Any] = {
        "count": len(backups),
        "full": sum(1 for b in backups if b["type"] == "full"),
    }
    if backups:
        result["latest"] = backups[-1]
        result["recoverableFrom"] = backups[0]["finishedAt"]
    newest = [a.get("max") for a in entry.get("archive") or [] if a.get("max")]
    if newest:
        result["archivedWal"] = str(max(newest))
    return result


# --- restore -------------------------------------------------------------------------------


def pg_time(stamp: str) -> str:
    """An RFC 3339 timestamp as pgBackRest's ``--target`` for a time wants it, in UTC:
    ``2026-12-02 10:15:00+00`` (fractions kept)."""
    moment = datetime.datetime.fromisoformat(stamp).astimezone(datetime.UTC)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "+00"


def restore_argv(
    *,
    stanza: str,
    path: str,
    data_dir: str,
    target_time: str | None = None,
    restore_point: str | None = None,
) -> list[str]:
    """``pgbackrest restore`` of ``stanza`` at ``path`` into ``data_dir``.

    The restore_command it writes names the source explicitly: the pods' environment points
    pgBackRest at this cluster's own repository, where the new timeline will be archived.
    With a target, recovery stops there and promotes; without one it replays all the WAL
    the source archived (the latest state) and promotes at its end."""
    source = [f"--stanza={stanza}", f"--repo1-path={path}"]
    archive_get = " ".join(["pgbackrest", *source, "archive-get", "%f", '"%p"'])
    argv = [
        "pgbackrest",
        "--log-level-console=info",
        *source,
        f"--pg1-path={data_dir}",
        "restore",
        f"--recovery-option=restore_command={archive_get}",
    ]
    if target_time is not None:
        argv += ["--type=time", f"--target={pg_time(target_time)}", "--target-action=promote"]
    elif restore_point is not None:
        argv += ["--type=name", f"--target={restore_point}", "--target-action=promote"]
    return argv


def stanza_command(
    command: str,
    *,
    timeout: float,
    options: Sequence[str] = (),
    run: Callable[..., Any] = subprocess.run,
) -> str | None:
    """``pgbackrest [options] COMMAND`` (``stanza-create``, ``stanza-upgrade``) in this
    container, where the environment names the stanza and the repository: None once it
    succeeded, else why not, in a line."""
    try:
        result = run(
            ["pgbackrest", *options, command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"pgbackrest {command} did not finish: {type(error).__name__}"
    if result.returncode != 0:
        return f"pgbackrest {command} failed: {str(result.stderr).strip()[-500:]}"
    return None
