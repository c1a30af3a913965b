"""The wheel works installed: built from the sources, installed into a fresh virtualenv, and
run from a directory that is not the checkout. Needs PyPI (or pip's warm cache) for the
dependencies; no cluster, no binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stateward.local import binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CRD = Path("config/crd/bases/stateward.io_postgresclusters.yaml")


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory outside the checkout."""
    return tmp_path_factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bin/`` of a fresh virtualenv with the stateward wheel (and its dependencies) in it."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy, so that setuptools leaves no build/ or egg-info in the checkout.
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(
        ROOT / "src",
        project / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    pip = ["-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [sys.executable, *pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(project)],
        check=True,
    )
    (wheel,) = (tmp / "dist").glob("stateward-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
    bin_dir = tmp / "venv" / "bin"
    subprocess.run([str(bin_dir / "python"), *pip, "install", str(wheel)], check=True)
    return bin_dir


def run(
    venv_bin: Path, cwd: Path, *argv: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env = {k: v for k, v in env.items() if not k.startswith("STATEWARD_")}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        [str(venv_bin / argv[0]), *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done


def test_the_installed_commands_start(venv_bin: Path, elsewhere: Path) -> None:
    where = run(venv_bin, elsewhere, "python", "-c", "import stateward; print(stateward.__file__)")
    assert where.stdout.startswith(str(venv_bin.parent)), "imported from the venv, not the checkout"
    assert "operator" in run(venv_bin, elsewhere, "stateward", "--help").stdout
    assert run(venv_bin, elsewhere, "stateward-instance", "--help").stdout
    assert "switchover" in run(venv_bin, elsewhere, "kubectl-stateward", "--help").stdout


def test_the_installed_manifests_are_the_committed_ones(venv_bin: Path, elsewhere: Path) -> None:
    root = elsewhere / "repo"
    assert run(venv_bin, elsewhere, "stateward", "manifests", "--check", "--root", str(root),
               check=False).returncode == 1  # fmt: skip
    run(venv_bin, elsewhere, "stateward", "manifests", "--root", str(root))
    run(venv_bin, elsewhere, "stateward", "manifests", "--check", "--root", str(root))
    assert (root / CRD).read_text() == (ROOT / CRD).read_text()


def test_the_wheel_carries_the_go_wrapper_modules(venv_bin: Path, elsewhere: Path) -> None:
    listed = run(
        venv_bin,
        elsewhere,
        "python",
        "-c",
        "from stateward.local import binaries as b\n"
        "for c in b.COMPONENTS: print(c.module_dir, b.tools_dir() / c.module_dir)",
    )
    found = dict(line.split(" ", 1) for line in listed.stdout.splitlines())
    assert sorted(found) == sorted(c.module_dir for c in binaries.COMPONENTS)
    for module_dir, installed in found.items():
        assert installed.startswith(str(venv_bin.parent)), installed
        for name in ("go.mod", "go.sum"):
            shipped = (Path(installed) / name).read_text()
            assert shipped == (binaries.tools_dir() / module_dir / name).read_text()


def test_what_needs_a_checkout_works_or_says_so_in_one_line(
    venv_bin: Path, elsewhere: Path
) -> None:
    sample = run(
        venv_bin,
        elsewhere,
        "python",
        "-c",
        "from stateward.cli import run; print(run.sample_cluster()['kind'])",
    )
    assert sample.stdout.strip() == "PostgresCluster"  # generated: no config/samples here
    images = run(
        venv_bin,
        elsewhere,
        "python",
        "-c",
        "from stateward.local import images\n"
        "try:\n    images.images_dir()\nexcept Exception as e:\n    print(e)",
    )
    (line,) = images.stdout.splitlines()
    assert "source checkout" in line
    assert "STATEWARD_SOURCE_DIR" in line
