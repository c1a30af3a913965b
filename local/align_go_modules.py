"""Align the Go wrapper modules that share Kubernetes' libraries with the kubernetes wrapper.

Go's build cache keys a compiled package by its module's *selected* version (a ``replace``
does not count) and by the keys of everything it imports. Helm, kwok and CoreDNS import
about 1,850 packages the Kubernetes build compiles too (client-go, apimachinery, x/net,
protobuf, ...): with one version of each shared module in every wrapper, each of those
packages is compiled once on a cold machine instead of up to four times.

This raises every module that the kubernetes wrapper and a follower both build to the
highest version any of them requires (``go mod edit -require``, then ``go mod tidy``), until
nothing changes. Nothing is ever lowered: a follower keeps what its release needs, and
Kubernetes takes the newer patch of a shared library instead. Run it after bumping any
wrapper, from the repository root, with network access to the Go module proxy:

    python3 local/align_go_modules.py

``tests/unit/test_local_binaries.py`` fails while a shared module differs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from stateward_local import binaries

TOOLS = binaries.tools_dir()
COMPONENTS = {c.name: c for c in binaries.COMPONENTS}
LEADER = binaries.KUBERNETES.name
FOLLOWERS = tuple(c.name for c in binaries.SHARES_KUBERNETES)


def selected(name: str) -> dict[str, tuple[str, str]]:
    """Every module that provides a package to the wrapper's binaries: its selected version
    (what the cache keys on) and the version whose code is compiled (its replacement's, if
    replaced: the kubernetes wrapper maps its v0.0.0 staging modules to the release)."""
    component = COMPONENTS[name]
    tags = ["-tags", ",".join(component.tags)] if component.tags else []
    out = subprocess.run(
        [
            "go",
            "list",
            "-deps",
            *tags,
            "-f",
            "{{with .Module}}{{.Path}} {{.Version}} {{with .Replace}}{{.Version}}{{end}}{{end}}",
            *component.packages,
        ],
        cwd=TOOLS / component.module_dir,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"},
    ).stdout
    found: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        words = line.split()
        if len(words) >= 2:
            found[words[0]] = (words[1], words[-1])
    return found


def _key(version: str) -> tuple[object, ...]:
    """Semantic-version order (pre-releases and pseudo-versions before their release)."""
    match = re.fullmatch(
        r"v(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?", version
    )
    if match is None:
        raise ValueError(f"not a semantic version: {version}")
    major, minor, patch, pre = match.groups()
    if pre is None:
        release: tuple[object, ...] = (1,)
    else:
        release = (0, *((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")))
    return (int(major), int(minor), int(patch), release)


def align() -> int:
    for round_ in range(1, 10):
        lists = {name: selected(name) for name in (LEADER, *FOLLOWERS)}
        leader = lists[LEADER]
        changes: dict[str, dict[str, str]] = {}
        for follower in FOLLOWERS:
            for module in leader.keys() & lists[follower].keys():
                holders = [n for n in (LEADER, *FOLLOWERS) if module in lists[n]]
                target = max((lists[n][module][1] for n in holders), key=_key)
                for name in holders:
                    if lists[name][module][0] != target:
                        changes.setdefault(name, {})[module] = target
        if not changes:
            print(f"aligned after {round_ - 1} round(s)")
            return 0
        for name, raised in sorted(changes.items()):
            print(
                f"round {round_}: {name}: "
                + ", ".join(f"{m}@{v}" for m, v in sorted(raised.items()))
            )
            subprocess.run(
                ["go", "mod", "edit", *(f"-require={m}@{v}" for m, v in sorted(raised.items()))],
                cwd=TOOLS / COMPONENTS[name].module_dir,
                check=True,
            )
            subprocess.run(
                ["go", "mod", "tidy"], cwd=TOOLS / COMPONENTS[name].module_dir, check=True
            )
    print("no fixed point after 9 rounds", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(align())
