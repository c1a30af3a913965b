"""The wheels work installed: the operator's (stateward) and the local cluster's
(stateward-local, local/) built from the sources, installed into a fresh virtualenv, and run
from a directory that is not the checkout. Needs PyPI (or pip's warm cache) for the
dependencies; no cluster, no binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from stateward_local import binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CRD = Path("config/crd/bases/stateward.io_postgresclusters.yaml")


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory outside the checkout."""
    return tmp_path_factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The operator's wheel and the local cluster's, built from a copy of the sources (so that
    setuptools leaves no build/ or egg-info in the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, project / name)
    for folder in ("src", "local"):
        shutil.copytree(
            ROOT / folder,
            project / folder,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
        )
    for source in (project, project / "local"):
        subprocess.run(
            [sys.executable, *PIP, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(source)],
            check=True,
        )
    (operator,) = (tmp / "dist").glob("stateward-*.whl")
    (local,) = (tmp / "dist").glob("stateward_local-*.whl")
    return operator, local


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory, wheels: tuple[Path, Path]) -> Path:
    """``bin/`` of a fresh virtualenv with both wheels (and their dependencies) in it."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    subprocess.run([str(bin_dir / "python"), *PIP, "install", *map(str, wheels)], check=True)
    return bin_dir


PIP = ("-m", "pip", "--disable-pip-version-check", "--quiet")


def test_the_operator_wheel_carries_no_local_cluster(wheels: tuple[Path, Path]) -> None:
    operator, local = wheels
    with zipfile.ZipFile(operator) as archive:
        shipped = archive.namelist()
    assert any(name.startswith("stateward/runtime/") for name in shipped)
    assert not [name for name in shipped if "local" in name.split("/")[0] or "/local/" in name]
    with zipfile.ZipFile(local) as archive:
        assert "stateward_local/cluster.py" in archive.namelist()


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
    assert "down" in run(venv_bin, elsewhere, "stateward", "local", "--help").stdout
    assert run(venv_bin, elsewhere, "stateward-instance", "--help").stdout
    assert "switchover" in run(venv_bin, elsewhere, "kubectl-stateward", "--help").stdout


def test_the_installed_manifests_are_the_committed_ones(venv_bin: Path, elsewhere: Path) -> None:
    root = elsewhere / "repo"
    assert run(venv_bin, elsewhere, "stateward", "manifests", "--check", "--root", str(root),
               check=False).returncode == 1  # fmt: skip
    run(venv_bin, elsewhere, "stateward", "manifests", "--root", str(root))
    run(venv_bin, elsewhere, "stateward", "manifests", "--check", "--root", str(root))
    assert (root / CRD).read_text() == (ROOT / CRD).read_text()


def test_the_local_wheel_carries_the_go_wrapper_modules(venv_bin: Path, elsewhere: Path) -> None:
    listed = run(
        venv_bin,
        elsewhere,
        "python",
        "-c",
        "from stateward_local import binaries as b\n"
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
        "from stateward_local import run; print(run.sample_cluster()['kind'])",
    )
    assert sample.stdout.strip() == "PostgresCluster"  # generated: no config/samples here
    images = run(
        venv_bin,
        elsewhere,
        "python",
        "-c",
        "from stateward_local.images import rootfs\n"
        "try:\n    rootfs.images_dir()\nexcept Exception as e:\n    print(e)",
    )
    (line,) = images.stdout.splitlines()
    assert "source checkout" in line
    assert "STATEWARD_SOURCE_DIR" in line
