"""Hash-locked pip requirements for the images' Python venvs.

Every package an image's venv takes from PyPI comes from lock files committed beside the
image's Containerfile (``images/<name>/``): one version each, with the sha256 of every file
PyPI has for that version, so that the image build runs pip in hash-checking mode
(``--require-hashes``), wheels only (``--only-binary :all:``) but for the few packages PyPI
has only as source. A lock is made for one Debian suite, whose Python version and glibc
decide which wheels install there (:data:`SUITES`):

* ``requirements-SUITE.txt``: stateward's dependencies (``pyproject.toml``) and the image's
  own requirements (Patroni), with every transitive dependency;
* ``build-requirements-SUITE.txt``: what builds the stateward wheel in the image
  (``pyproject.toml``'s ``build-system.requires``) and the source-only packages, installed
  first; those builds run without build isolation, so that nothing unlocked is fetched.

``make lock`` (``stateward local lock``) writes them with uv, which resolves for a Python
version other than its own. Each file's header records the suite and the inputs it was
resolved from (:func:`header`); :func:`check` tells a lock that no longer matches them, and
the image build refuses one (run ``make lock``). This module is pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Suite:
    """What a Debian suite's ``python3`` installs: its version and uv's ``--python-platform``
    for the suite's glibc (manylinux, x86_64, the only architecture the images are built for)."""

    python: str
    platform: str


SUITES: Mapping[str, Suite] = {
    "bookworm": Suite(python="3.11", platform="x86_64-manylinux_2_36"),  # glibc 2.36
    # glibc 2.41; uv names manylinux tags up to 2_40. Each pin lists the hashes of all its
    # files, so pip there may still pick a newer-tagged wheel of the locked version.
    "trixie": Suite(python="3.13", platform="x86_64-manylinux_2_40"),
}

HASH_ALGORITHM = "sha256"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """What one image's venv takes from PyPI on one Debian suite: stateward's dependencies
    (read from ``pyproject.toml`` when locking and building, not stored here) and
    ``requirements``. ``from_source`` names the packages PyPI has only as source: the build
    lock's tools build them in the image."""

    suite: str
    requirements: tuple[str, ...] = ()
    from_source: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            known = ", ".join(SUITES)
            raise ValueError(f"no pip lock target for suite {self.suite!r} (known: {known})")

    @property
    def python(self) -> str:
        return SUITES[self.suite].python

    @property
    def platform(self) -> str:
        return SUITES[self.suite].platform

    @property
    def lock_name(self) -> str:
        return f"requirements-{self.suite}.txt"

    @property
    def build_lock_name(self) -> str:
        return f"build-requirements-{self.suite}.txt"

    @property
    def files(self) -> tuple[str, str]:
        """The lock files, build lock first (the order they install in)."""
        return (self.build_lock_name, self.lock_name)


# --------------------------------------------------------------------------------------------
# Reading a lock


@dataclasses.dataclass(frozen=True)
class Pin:
    """One locked package: its normalized name, exact version and sha256 digests."""

    name: str
    version: str
    hashes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Lock:
    """A parsed lock: its header fields (``# key: value`` lines before the first package,
    each key's values in order), its pins by name, and what is wrong with its lines."""

    fields: Mapping[str, tuple[str, ...]]
    pins: Mapping[str, Pin]
    problems: tuple[str, ...]

    def field(self, key: str) -> str | None:
        """The one value of a header field; None when absent."""
        values = self.fields.get(key, ())
        return values[0] if len(values) == 1 else None


_NAME = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_FIELD = re.compile(r"#\s*([a-z][a-z-]*):\s*(.*?)\s*$")
_HASH = re.compile(r"--hash[=\s]\s*([^\s]+)")
_PINNED = re.compile(
    r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?"
    r"\s*===?\s*(?P<version>[A-Za-z0-9][A-Za-z0-9.!+_-]*)\s*(?:;.*)?"
)
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def normalize(name: str) -> str:
    """A project name as PyPI compares them (PEP 503): case, runs of ``-_.`` folded."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The normalized project name a requirement (``patroni[kubernetes]==4.1.5``) names."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return normalize(match.group(1))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with backslash continuations joined and comments dropped, numbered by their
    first physical line; comment-only lines come through whole (for the header)."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
            if raw.lstrip().startswith("#"):
                lines.append((number, raw.strip()))
                continue
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(part.strip() for part in pending).strip()
        pending = []
        if joined:
            lines.append((start, joined))
    if pending and (joined := " ".join(part.strip() for part in pending).strip()):
        lines.append((start, joined))
    return lines


def parse(text: str) -> Lock:
    """Read a lock file: header fields, pins, and a sentence for each line that is not
    ``name==version`` with sha256 hashes (options, URLs, ranges, a missing or odd hash, a
    package named twice)."""
    fields: dict[str, list[str]] = {}
    pins: dict[str, Pin] = {}
    problems: list[str] = []
    for number, line in _logical_lines(text):
        if line.startswith("#"):
            field = _FIELD.fullmatch(line)
            if field is not None and not pins:
                fields.setdefault(field.group(1), []).append(field.group(2))
            continue
        hashes = _HASH.findall(line)
        requirement = _HASH.sub("", line).strip()
        pinned = _PINNED.fullmatch(requirement)
        if pinned is None or "*" in requirement:
            problems.append(
                f"line {number}: {requirement!r} is not a package pinned to one version"
                " (name==version)"
            )
            continue
        name = normalize(pinned.group("name"))
        if name in pins:
            problems.append(f"line {number}: {name} is locked twice")
            continue
        digests: list[str] = []
        for value in hashes:
            algorithm, _, digest = value.partition(":")
            if algorithm != HASH_ALGORITHM or not _HEX_DIGEST.fullmatch(digest):
                problems.append(f"line {number}: {name} has a hash that is not a sha256: {value}")
            else:
                digests.append(digest)
        if not hashes:
            problems.append(f"line {number}: {name} has no --hash")
        pins[name] = Pin(name=name, version=pinned.group("version"), hashes=tuple(digests))
    return Lock(
        fields={key: tuple(values) for key, values in fields.items()},
        pins=pins,
        problems=tuple(problems),
    )


# --------------------------------------------------------------------------------------------
# Writing and checking a lock


def _squeeze(requirement: str) -> str:
    return "".join(requirement.split())


def header(
    *, title: str, target: Target, inputs: Sequence[str], from_source: Sequence[str] = ()
) -> str:
    """The comment block a lock file starts with: what it is, how to remake it, and the
    fields :func:`check` compares (suite, python, platform, from-source, input)."""
    lines = [
        f"# {title}",
        "# Hash-locked by `make lock` (stateward local lock, with uv): do not edit. The image",
        "# build installs it with pip --require-hashes --only-binary :all:, so every package",
        "# must come at this version with one of these sha256 digests. To change it, change the",
        "# inputs (pyproject.toml, stateward_local/images/catalog.py) and run `make lock`;",
        "# `make lock LOCK_FLAGS=--upgrade` moves every package to its newest version.",
        f"# suite: {target.suite}",
        f"# python: {target.python}",
        f"# platform: {target.platform}",
        *(f"# from-source: {normalize(name)}" for name in from_source),
        *(f"# input: {_squeeze(requirement)}" for requirement in inputs),
    ]
    return "\n".join(lines) + "\n"


def _difference(found: Sequence[str], wanted: Sequence[str]) -> str:
    added = sorted(set(wanted) - set(found))
    removed = sorted(set(found) - set(wanted))
    parts = [*(f"+{item}" for item in added), *(f"-{item}" for item in removed)]
    return ", ".join(parts)


def check(
    text: str, *, target: Target, inputs: Sequence[str], from_source: Sequence[str] = ()
) -> list[str]:
    """What is wrong with a lock for ``target`` made from ``inputs`` (requirements, order
    and spaces aside) with ``from_source`` built from source: a sentence each, none when it
    is current and every line is a pin with hashes."""
    lock = parse(text)
    problems = list(lock.problems)
    for key, wanted in (
        ("suite", target.suite),
        ("python", target.python),
        ("platform", target.platform),
    ):
        if lock.field(key) != wanted:
            problems.append(f"made for {key} {lock.field(key)}, not {wanted}")
    found_inputs = sorted(_squeeze(value) for value in lock.fields.get("input", ()))
    wanted_inputs = sorted(_squeeze(value) for value in inputs)
    if found_inputs != wanted_inputs:
        problems.append(f"made from other inputs ({_difference(found_inputs, wanted_inputs)})")
    found_sources = sorted(lock.fields.get("from-source", ()))
    wanted_sources = sorted(normalize(name) for name in from_source)
    if found_sources != wanted_sources:
        problems.append(
            f"made with other packages from source ({_difference(found_sources, wanted_sources)})"
        )
    if not lock.pins:
        problems.append("locks no package")
    for name in sorted({*map(requirement_name, inputs), *wanted_sources}):
        if name not in lock.pins:
            problems.append(f"does not lock {name}")
    return problems


# --------------------------------------------------------------------------------------------
# Commands


def compile_command(
    uv: Sequence[str],
    *,
    target: Target,
    source: str,
    output: str,
    from_source: Sequence[str] = (),
    upgrade: bool = False,
) -> list[str]:
    """``uv pip compile`` of the requirements file ``source`` into ``output`` for ``target``'s
    Python and platform, wheels only but ``from_source``, with every file's hash. uv keeps
    the versions already in ``output`` that still fit, unless ``upgrade``."""
    return [
        *uv, "pip", "compile", "--quiet", "--generate-hashes", "--no-header",
        "--python-version", target.python, "--python-platform", target.platform,
        *_binary_options(from_source),
        *(["--upgrade"] if upgrade else []),
        "--output-file", output, source,
    ]  # fmt: skip


def _binary_options(from_source: Sequence[str]) -> list[str]:
    # pip clears the --no-binary names on --only-binary :all:, so that comes first.
    return [
        "--only-binary",
        ":all:",
        *(arg for name in from_source for arg in ("--no-binary", name)),
    ]


def install_commands(
    target: Target, *, pip: str, folder: str, project: str, options: Sequence[str] = ()
) -> list[tuple[list[str], str]]:
    """The pip commands, with a label each, that fill a venv whose ``pip`` is given from
    ``target``'s lock files in ``folder`` and the stateward source tree ``project``, in
    order: the build lock; the lock, source-only packages built into wheels without
    isolation by the build lock's tools; stateward from its tree with no index, no
    dependencies and no isolation (so nothing but the locks comes from PyPI); ``pip
    check``, which fails when the lock lacks something stateward or Patroni requires.
    ``options`` (``--cert``) go to the commands that reach PyPI."""
    install = [pip, "install", "--no-cache-dir", "--disable-pip-version-check"]
    # --no-deps: a lock is the whole closure, so pip resolves nothing. Left to resolve, pip
    # 23 takes a dependency with extras (lightkube's ``httpx2[http2,ws]>=0.28.1``) for a
    # requirement of its own, picks PyPI's newest release for it and refuses it as unpinned:
    # a new upstream release broke every image build. ``pip check`` below still fails when
    # the lock lacks something a package requires.
    hashed = [*install, "--require-hashes", "--no-deps"]
    # A wheel built by the locked setuptools in this venv (pip 23 would otherwise run the
    # legacy `setup.py install` for a --no-binary project without a pyproject.toml).
    isolation = ["--no-build-isolation", "--use-pep517"] if target.from_source else []
    build_lock = [*hashed, *_binary_options(()), *options]
    lock = [*hashed, *_binary_options(target.from_source), *isolation, *options]
    return [
        (
            [*build_lock, "-r", f"{folder}/{target.build_lock_name}"],
            f"pip install --require-hashes --no-deps -r {target.build_lock_name}",
        ),
        (
            [*lock, "-r", f"{folder}/{target.lock_name}"],
            f"pip install --require-hashes --no-deps -r {target.lock_name}",
        ),
        (
            [*install, "--no-index", "--no-deps", "--no-build-isolation", project],
            "pip install --no-deps stateward",
        ),
        ([pip, "check"], "pip check"),
    ]
