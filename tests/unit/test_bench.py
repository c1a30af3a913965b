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


def test_no_benchmark_function_is_a_wall_of_statements() -> None:
    tree = ast.parse((BENCH / "run.py").read_text())
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
