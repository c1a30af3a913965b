"""Where the real-node benchmark (bench.nodes) writes its table in docs/benchmarks.md: between
its markers, at the end of its hand-written section when the markers are missing, or as a new
section with its method (the run itself needs root, real nodes and minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench import nodes

pytestmark = pytest.mark.unit


def test_the_table_goes_between_the_markers_at_the_end_of_the_section_or_into_a_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "benchmarks.md"
    monkeypatch.setattr(nodes, "DOC", doc)
    begin, end, section = nodes.BEGIN, nodes.END, nodes.SECTION

    nodes.write_doc("first\n")
    assert doc.read_text() == f"# Benchmarks\n\n{nodes.METHOD}\n{begin}\nfirst\n{end}\n"

    doc.write_text(f"# Benchmarks\n\n{section}\n\nby hand\n\n## Data plane\n\nmore\n")
    nodes.write_doc("second\n")
    assert doc.read_text() == (
        f"# Benchmarks\n\n{section}\n\nby hand\n\n{begin}\nsecond\n{end}\n\n## Data plane\n\nmore\n"
    )

    nodes.write_doc("third\n")
    assert doc.read_text() == (
        f"# Benchmarks\n\n{section}\n\nby hand\n\n{begin}\nthird\n{end}\n\n## Data plane\n\nmore\n"
    )
