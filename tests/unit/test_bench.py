"""The benchmark driver stays readable and runnable without running it (``make bench`` is
long): it imports, parses its flags, and no function of it is a wall of statements."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"
MAX_STATEMENTS = 60


def _statements(function: ast.AST) -> int:
    """Statements in ``function``, not counting those of functions nested in it."""
    count = 0
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        count += isinstance(node, ast.stmt)
        stack.extend(ast.iter_child_nodes(node))
    return count


@pytest.mark.parametrize("module", ["run", "probes", "scale_report"])
def test_no_benchmark_function_is_a_wall_of_statements(module: str) -> None:
    tree = ast.parse((BENCH / f"{module}.py").read_text())
    sizes = {
        node.name: _statements(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert {name: n for name, n in sizes.items() if n > MAX_STATEMENTS} == {}


def test_the_benchmark_imports_and_parses_its_flags() -> None:
    from bench import run

    args = run.parse(["--clusters", "10:1", "--no-doc"])
    assert args.clusters == [(10, 1)]
    assert args.no_doc
    with pytest.raises(SystemExit) as exit_info:
        run.parse(["--help"])
    assert exit_info.value.code == 0


def test_the_results_go_between_their_markers_or_are_appended_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import scale_report
    from bench.scale_report import BEGIN, END, write_doc

    doc = tmp_path / "docs" / "benchmarks.md"
    monkeypatch.setattr(scale_report, "DOC", doc)
    write_doc("first\n")  # no file, not even its directory: made, with no method
    assert doc.read_text() == f"# Benchmarks\n\n{BEGIN}\nfirst\n{END}\n"
    doc.write_text(f"# Benchmarks\n\nby hand\n\n{BEGIN}\nfirst\n{END}\n\n## Real nodes\n")
    write_doc("second\n")
    assert doc.read_text() == (
        f"# Benchmarks\n\nby hand\n\n{BEGIN}\nsecond\n{END}\n\n## Real nodes\n"
    )


def test_repeated_runs_report_the_median_of_their_paired_ratios() -> None:
    from bench.scale_report import _heading, medians

    def run(clusters: int, replicas: int, operator: float, bare: float) -> dict[str, object]:
        return {
            "clusters": clusters,
            "replicas": replicas,
            "last_write_seconds": operator,
            "bare_last_write_seconds": bare,
            "statefulsets_ready_seconds": 2 * operator,
            "bare_statefulsets_ready_seconds": 2 * bare,
        }

    # Each run's ratio pairs its own operator and bare client: 1.5, 1.0, 1.1 -> 1.10.
    results = [run(100, 3, 15, 10), run(100, 3, 20, 20), run(100, 3, 11, 10), run(1000, 1, 9, 3)]
    text = medians(results)
    assert text.count("median of 3 runs") == 1 and "N = 100 x 3" in text
    assert "last converging write **1.10** (1.50, 1.00, 1.10)" in text
    assert "every StatefulSet ready **1.10**" in text
    assert "1000" not in text  # run once: its one ratio is in the table
    assert medians(results[-1:]) == ""
    assert [_heading(r, results) for r in results] == [
        "N = 100, run 1",
        "N = 100, run 2",
        "N = 100, run 3",
        "N = 1000",
    ]
