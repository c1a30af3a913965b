"""An in-place major upgrade of one data directory: ``stateward-instance upgrade``.

Run on a cleanly shut-down primary's volume, in an image that has both majors' servers
(the 17 image carries 15's, ``local/images.py``). The steps, each safe to repeat after a
crash (the operator's Job may run it again):

1. the data directory's ``PG_VERSION`` says where it is: already the new major (a finished
   run) is success; a half-swapped pair of directories is completed;
2. enough free space on the volume (:data:`MIN_FREE_BYTES`), or refused;
3. ``initdb`` of the new major beside the old one (``pgdata-NEW``), with the old one's
   superuser, encoding and checksum setting;
4. ``pg_upgrade --check``: refused, and the new directory removed, if it finds a problem;
5. ``pg_upgrade --link``: hard links, no copy, so it takes seconds and no space for the
   data files; a failure before its link step leaves the old cluster as it was (refused),
   after it the old cluster can no longer start (failed);
6. the new directory takes the old one's place, and the old one is removed (its files live
   on in the new one through the links).

The old server runs under pg_upgrade with what Patroni's configuration would need and the
Job does not have switched off (TLS, archiving, JIT) and a trust-only ``pg_hba`` on the
socket; Patroni writes its own configuration files into the new directory when it starts.

Exit codes: 0 upgraded (or already), :data:`REFUSED` nothing changed, 1 failed after the
link step. The last line of output (``/dev/termination-log`` too) says what happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from stateward.instance import localsql, patroni, pgbackrest

REFUSED: Final = 3
"""The exit code of an upgrade that changed nothing: the old data is as it was."""
FAILED: Final = 1
MIN_FREE_BYTES: Final = 128 * 1024 * 1024
"""The new major's catalog (initdb, about 40 MB) and pg_upgrade's schema dump and logs."""
TERMINATION_LOG: Final = "/dev/termination-log"
OLD_SERVER_OPTIONS: Final = "-c ssl=off -c archive_mode=off -c jit=off"
"""Patroni's settings name certificate files and an archive command the Job has not; the
old image's JIT library (LLVM) is not carried beside the new major."""
SUPERUSER: Final = patroni.SUPERUSER_USERNAME
MARKER_NAME: Final = "stateward-upgraded-from"
STANZA_INTERVAL: Final = 5.0
STANZA_TIMEOUT: Final = 120.0

Run = Callable[..., "subprocess.CompletedProcess[str]"]


class UpgradeRefused(Exception):
    """Nothing was changed: the old data directory is as it was."""


class UpgradeFailed(Exception):
    """Failed after pg_upgrade's link step: the old directory cannot start any more."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the directories are on the data volume."""

    old: int
    new: int
    data_dir: str = patroni.DATA_DIR

    @property
    def volume(self) -> str:
        return str(Path(self.data_dir).parent)

    @property
    def new_dir(self) -> str:
        return f"{self.volume}/pgdata-{self.new}"

    @property
    def old_dir(self) -> str:
        """Where the old directory goes while the new one takes its place."""
        return f"{self.volume}/pgdata-{self.old}.old"

    @property
    def marker(self) -> str:
        return marker_path(self.data_dir)

    @property
    def work_dir(self) -> str:
        """pg_upgrade's socket, the trust-only pg_hba for the old server."""
        return f"{self.volume}/upgrade-{self.new}"


def marker_path(data_dir: str) -> str:
    """Left on the volume by a finished upgrade, outside the data directory (a clone of it
    does not carry it): the primary then upgrades pgBackRest's stanza
    (:func:`upgrade_stanza_once`) and removes it."""
    return str(Path(data_dir).parent / MARKER_NAME)


def major_of(data_dir: str) -> int | None:
    """The major in ``PG_VERSION``, None if the directory holds no cluster."""
    try:
        return int(Path(data_dir, "PG_VERSION").read_text().strip())
    except (OSError, ValueError):
        return None


def controldata_value(controldata: str, key: str) -> str:
    """One value of ``pg_controldata``'s output (``Key:   value`` lines)."""
    for line in controldata.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    raise UpgradeRefused(f"pg_controldata does not say {key!r}")


def initdb_command(layout: Layout, *, checksums: bool) -> list[str]:
    """The new major's initdb, with the settings Patroni's bootstrap gave the old one."""
    command = [
        f"{patroni.bin_dir(layout.new)}/initdb",
        f"--pgdata={layout.new_dir}",
        f"--username={SUPERUSER}",
        "--encoding=UTF8",
        # pg_upgrade's own connections, on the socket; Patroni writes its pg_hba at start.
        "--auth-local=trust",
        "--auth-host=reject",
    ]
    return command + (["--data-checksums"] if checksums else [])


def pg_upgrade_command(layout: Layout, *, check: bool) -> list[str]:
    hba = f"{layout.work_dir}/pg_hba.conf"
    return [
        f"{patroni.bin_dir(layout.new)}/pg_upgrade",
        *(["--check"] if check else ["--link", "--jobs=2"]),
        f"--old-bindir={patroni.bin_dir(layout.old)}",
        f"--new-bindir={patroni.bin_dir(layout.new)}",
        f"--old-datadir={layout.data_dir}",
        f"--new-datadir={layout.new_dir}",
        f"--username={SUPERUSER}",
        f"--socketdir={layout.work_dir}",
        f"--old-options={OLD_SERVER_OPTIONS} -c hba_file={hba}",
        f"--new-options=-c hba_file={hba}",
    ]


def _tail(result: subprocess.CompletedProcess[str], lines: int = 12) -> str:
    """The last ``lines`` non-empty lines of a command's output, as one line."""
    text = "\n".join(part for part in (result.stdout, result.stderr) if part)
    kept = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return " / ".join(kept[-lines:])


def explain(result: subprocess.CompletedProcess[str]) -> str:
    """What pg_upgrade found, as one line: its output from the first check that failed (the
    checks that passed left out), and the first lines of any file it lists the problem
    objects in (which goes with the new directory)."""
    text = result.stdout + "\n" + result.stderr
    lines = [" ".join(line.split()) for line in text.splitlines()]
    lines = [line for line in lines if line and line != "Failure, exiting"]
    start = next(
        (i for i, line in enumerate(lines) if line.endswith("fatal") or "failed" in line), 0
    )
    found: list[str] = []
    for line in lines[start:]:
        listing = Path(line)
        if listing.is_absolute() and listing.suffix == ".txt" and listing.is_file():
            found += [" ".join(x.split()) for x in listing.read_text().splitlines()[:5]]
        elif not line.endswith(" ok"):
            found.append(line)
    return " ".join(found[-20:])


@dataclasses.dataclass
class Upgrade:
    """One run over one volume; ``run`` and ``free_bytes`` are the outside world."""

    layout: Layout
    run: Run = subprocess.run
    free_bytes: Callable[[str], int] = lambda path: shutil.disk_usage(path).free
    say: Callable[[str], None] = print

    def _run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.say("$ " + " ".join(argv))
        return self.run(
            list(argv), capture_output=True, text=True, check=False, cwd=self.layout.work_dir,
            **kwargs,
        )  # fmt: skip

    def resume_swap(self) -> bool:
        """Finish a swap a crash interrupted; True if the data directory is the new major."""
        layout = self.layout
        if major_of(layout.data_dir) == layout.new:
            return True
        if not Path(layout.data_dir).exists() and major_of(layout.new_dir) == layout.new:
            os.rename(layout.new_dir, layout.data_dir)
            return True
        return False

    def execute(self) -> str:
        """Upgrade; what was done. Raises :class:`UpgradeRefused` or :class:`UpgradeFailed`."""
        layout = self.layout
        if self.resume_swap():
            shutil.rmtree(layout.old_dir, ignore_errors=True)
            self._mark()
            return f"the data directory is PostgreSQL {layout.new}: upgraded"
        found = major_of(layout.data_dir)
        if found != layout.old:
            raise UpgradeRefused(
                f"{layout.data_dir} holds PostgreSQL {found or 'nothing'}, not {layout.old}"
            )
        free = self.free_bytes(layout.volume)
        if free < MIN_FREE_BYTES:
            raise UpgradeRefused(
                f"the volume has {free // 2**20} MiB free; the upgrade needs"
                f" {MIN_FREE_BYTES // 2**20} MiB: grow spec.storageSize first"
            )
        shutil.rmtree(layout.new_dir, ignore_errors=True)  # a run that stopped early
        shutil.rmtree(layout.work_dir, ignore_errors=True)
        os.makedirs(layout.work_dir, mode=0o700)
        Path(layout.work_dir, "pg_hba.conf").write_text(f"local all {SUPERUSER} trust\n")
        controldata = self._run([f"{patroni.bin_dir(layout.old)}/pg_controldata", layout.data_dir])
        if controldata.returncode != 0:
            raise UpgradeRefused(f"pg_controldata failed: {_tail(controldata)}")
        state = controldata_value(controldata.stdout, "Database cluster state")
        if state != "shut down":
            raise UpgradeRefused(f"PostgreSQL was not shut down cleanly (state: {state})")
        checksums = controldata_value(controldata.stdout, "Data page checksum version") != "0"
        initdb = self._run(initdb_command(layout, checksums=checksums))
        if initdb.returncode != 0:
            raise UpgradeRefused(f"initdb of PostgreSQL {layout.new} failed: {_tail(initdb)}")
        check = self._run(pg_upgrade_command(layout, check=True))
        if check.returncode != 0:
            problem = explain(check)
            self._discard_new()
            raise UpgradeRefused(f"pg_upgrade --check found a problem: {problem}")
        self.say(_tail(check, 3))
        link = self._run(pg_upgrade_command(layout, check=False))
        if link.returncode != 0:
            if Path(layout.data_dir, "global", "pg_control").exists():
                problem = explain(link)
                self._discard_new()  # the link step was not reached: the old cluster is intact
                raise UpgradeRefused(f"pg_upgrade failed before linking: {problem}")
            raise UpgradeFailed(f"pg_upgrade failed after linking: {explain(link)}")
        self._mark()
        os.rename(layout.data_dir, layout.old_dir)
        os.rename(layout.new_dir, layout.data_dir)
        shutil.rmtree(layout.old_dir, ignore_errors=True)
        shutil.rmtree(layout.work_dir, ignore_errors=True)
        return f"upgraded the data directory from PostgreSQL {layout.old} to {layout.new}"

    def _mark(self) -> None:
        Path(self.layout.marker).write_text(f"{self.layout.old}\n")

    def _discard_new(self) -> None:
        shutil.rmtree(self.layout.new_dir, ignore_errors=True)
        shutil.rmtree(self.layout.work_dir, ignore_errors=True)


def main(old: int, new: int, *, data_dir: str = patroni.DATA_DIR) -> int:
    """``stateward-instance upgrade``: the outcome on the last line and in the termination
    log, which the operator reads."""
    if new <= old:
        outcome, code = f"refused: {new} is not newer than {old}", REFUSED
    else:
        try:
            outcome, code = Upgrade(Layout(old, new, data_dir)).execute(), 0
        except UpgradeRefused as error:
            outcome, code = f"refused: {error}", REFUSED
        except UpgradeFailed as error:
            outcome, code = f"failed: {error}", FAILED
    print(outcome, flush=True)
    with contextlib.suppress(OSError):  # not in a pod
        Path(TERMINATION_LOG).write_text(outcome[-4000:])
    return code


IS_PRIMARY: Final = "select not pg_catalog.pg_is_in_recovery()"


def upgrade_stanza_once(
    psql: str,
    data_dir: str = patroni.DATA_DIR,
    *,
    env: Mapping[str, str] | None = None,
    run: Run = subprocess.run,
) -> bool:
    """After an upgrade (its marker on this volume), once this instance is the primary:
    ``pgbackrest stanza-upgrade``, so WAL archiving, which refuses a stanza of the old major,
    goes on. True once there is nothing (more) to do; False to try again later."""
    marker = Path(marker_path(data_dir))
    if not marker.exists():
        return True
    if not (os.environ if env is None else env).get("PGBACKREST_STANZA"):
        marker.unlink(missing_ok=True)  # no repository: nothing to upgrade
        return True
    if localsql.answer(psql, IS_PRIMARY, user=SUPERUSER, timeout=10, run=run) != "t\n":
        return False
    problem = pgbackrest.stanza_command(
        "stanza-upgrade", timeout=STANZA_TIMEOUT, options=["--log-level-console=info"], run=run
    )
    if problem is not None:
        print(f"stateward-instance: {problem}")
        return False
    marker.unlink(missing_ok=True)
    print("stateward-instance: upgraded the pgBackRest stanza to this major", flush=True)
    return True


def upgrade_stanza_in_background(
    psql: str, data_dir: str, stop: threading.Event, interval: float = STANZA_INTERVAL
) -> threading.Thread:
    """:func:`upgrade_stanza_once` now and every ``interval`` seconds until it is done."""

    def loop() -> None:
        while not upgrade_stanza_once(psql, data_dir):
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, daemon=True, name="stanza-upgrade")
    thread.start()
    return thread
