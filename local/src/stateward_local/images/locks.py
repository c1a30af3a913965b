"""The pip lock files of the images that hold a Python venv: what ``make lock`` resolves (with
uv, for the image's Python) and what a build checks its inputs against.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateward_local import errors
from stateward_local.images import piplock
from stateward_local.images.rootfs import _NO_CHECKOUT, _stderr, images_dir, source_dir

if TYPE_CHECKING:
    from stateward_local.images.catalog import ImageSpec
    from stateward_local.images.rootfs import Progress

UV_REQUIREMENT = "uv>=0.13,<0.14"
"""What ``make lock`` resolves with (the dev extra): uv resolves for another Python version
than the one it runs on, which the trixie image's lock needs."""


def _pyproject() -> dict[str, Any]:
    path = source_dir() / "pyproject.toml"
    try:
        with open(path, "rb") as pyproject:
            return tomllib.load(pyproject)
    except OSError as error:
        raise errors.LocalClusterError(_NO_CHECKOUT.format(root=source_dir())) from error


@dataclasses.dataclass(frozen=True)
class LockFile:
    """One pip lock file of an image and what it is resolved from: ``inputs`` (requirements)
    with ``from_source`` built from source, for ``spec.pip_lock``'s suite."""

    spec: ImageSpec
    name: str
    title: str
    inputs: tuple[str, ...]
    from_source: tuple[str, ...] = ()

    @property
    def target(self) -> piplock.Target:
        assert self.spec.pip_lock is not None
        return self.spec.pip_lock

    @property
    def path(self) -> Path:
        return images_dir() / self.spec.name / self.name

    @property
    def shown(self) -> str:
        """The path as the repository names it."""
        return f"images/{self.spec.name}/{self.name}"

    def header(self) -> str:
        return piplock.header(
            title=self.title, target=self.target, inputs=self.inputs, from_source=self.from_source
        )

    def check(self, text: str) -> list[str]:
        """What is wrong with ``text`` as this lock (:func:`piplock.check`); none when current."""
        return piplock.check(
            text, target=self.target, inputs=self.inputs, from_source=self.from_source
        )

    def problems(self) -> list[str]:
        """What is wrong with the committed file, each sentence prefixed with its path."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return [f"{self.shown}: missing"]
        return [f"{self.shown}: {problem}" for problem in self.check(text)]


def lock_files(catalog: Sequence[ImageSpec]) -> list[LockFile]:
    """The lock files of the images with a ``pip_lock``, build lock first for each, once
    each: the build lock's inputs are ``pyproject.toml``'s ``build-system.requires`` (which
    also build ``from_source``), the lock's its ``dependencies`` and the target's own."""
    project = _pyproject()
    build_requires = tuple(project["build-system"]["requires"])
    dependencies = tuple(project["project"]["dependencies"])
    found: dict[tuple[str, str], LockFile] = {}
    for spec in catalog:
        target = spec.pip_lock
        if target is None:
            continue
        python = f"Python {target.python} of Debian {target.suite}"
        built = " and ".join(("stateward", *target.from_source))
        for lock in (
            LockFile(
                spec=spec,
                name=target.build_lock_name,
                title=f"What builds {built} in the {spec.name} image ({python}).",
                inputs=build_requires,
            ),
            LockFile(
                spec=spec,
                name=target.lock_name,
                title=f"What the {spec.name} image's venv takes from PyPI ({python}).",
                inputs=(*dependencies, *target.requirements),
                from_source=target.from_source,
            ),
        ):
            found.setdefault((spec.name, lock.name), lock)
    return list(found.values())


def _uv() -> list[str]:
    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    found = shutil.which("uv")
    if found is None:
        raise errors.LocalClusterError(
            f"locking needs uv: `make lock` installs it (the dev extra), or pip install"
            f" '{UV_REQUIREMENT}'"
        )
    return [found]


def write_locks(
    *,
    upgrade: bool = False,
    progress: Progress = _stderr,
    catalog: Sequence[ImageSpec],
    uv: Sequence[str] | None = None,
) -> list[Path]:
    """Resolve every lock file of ``catalog`` with ``uv pip compile`` and write the changed
    ones; return those. uv keeps the versions a file already has while they fit its inputs,
    unless ``upgrade``. A lock is replaced only once uv succeeded and the result checks."""
    command = list(uv) if uv is not None else _uv()
    written: list[Path] = []
    for lock in lock_files(catalog):
        with tempfile.TemporaryDirectory(prefix="stateward-lock-") as scratch:
            folder = Path(scratch)
            (folder / "requirements.in").write_text("".join(f"{r}\n" for r in lock.inputs))
            output = folder / lock.name
            if lock.path.is_file():
                shutil.copyfile(lock.path, output)  # its versions are uv's preferences
            argv = piplock.compile_command(
                command,
                target=lock.target,
                source="requirements.in",
                output=lock.name,
                from_source=lock.from_source,
                upgrade=upgrade,
            )
            progress(f"Locking {lock.shown}: uv {' '.join(argv[len(command) :])}")
            done = subprocess.run(argv, cwd=folder, capture_output=True, text=True)
            if done.returncode != 0:
                reason = " ".join(done.stderr.split()) or "no output"
                raise errors.LocalClusterError(
                    f"uv pip compile for {lock.shown} failed (exit {done.returncode}): {reason}"
                )
            text = lock.header() + output.read_text()
        problems = lock.check(text)
        if problems:
            raise errors.LocalClusterError(
                f"uv pip compile gave {lock.shown} that does not check: {'; '.join(problems)}"
            )
        pins = len(piplock.parse(text).pins)
        if lock.path.is_file() and lock.path.read_text() == text:
            progress(f"  {lock.shown}: unchanged, {pins} packages")
            continue
        lock.path.parent.mkdir(parents=True, exist_ok=True)
        partial = lock.path.with_name(lock.path.name + ".partial")
        partial.write_text(text)
        partial.rename(lock.path)
        written.append(lock.path)
        progress(f"  {lock.shown}: written, {pins} packages")
    return written
