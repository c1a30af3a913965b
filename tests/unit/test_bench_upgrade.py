"""The upgrade benchmark stays runnable without running it (real nodes, minutes): its flags,
its sizing, its table, and where it writes it in docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench import dataplane, upgrade

pytestmark = pytest.mark.unit


def test_the_flags() -> None:
    assert upgrade.parse([]).sizes == [100, 1024]
    assert upgrade.parse(["--sizes", "10", "--no-doc"]).sizes == [10]
    with pytest.raises(SystemExit):
        upgrade.parse(["--sizes", "0"])


def test_sizes_become_rows_and_a_volume_with_room() -> None:
    assert upgrade.rows_for(100) == 104857
    assert upgrade.storage_for(100) == "1Gi"
    assert upgrade.storage_for(1024) == "5Gi"  # data, WAL and the new catalog


def test_the_table_names_downtime_time_losses_and_the_data_check() -> None:
    run = {
        "megabytes": 100, "database_mb": 112, "downtime_s": 19.84, "upgrade_s": 41.2,
        "lost": 0, "acknowledged": 380, "same_data": True, "server_version_num": "170012",
    }  # fmt: skip
    text = upgrade.markdown([run], {"date": "2026-12-05", "machine": "2 CPUs"})
    assert "| 100 MB | 112 MB | **19.8 s** | 41.2 s | 0 of 380 | yes | 170012 |" in text
    assert "**no**" in upgrade.markdown(
        [{**run, "same_data": False}], {"date": "d", "machine": "m"}
    )


def test_the_table_goes_after_the_data_plane_section_then_replaces_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n{dataplane.BEGIN}\nrows\n{dataplane.END}\nhand note\n## Failures\n")
    monkeypatch.setattr(dataplane, "DOC", doc)
    upgrade.write_doc("first\n")
    upgrade.write_doc("second\n")
    text = doc.read_text()
    assert text.count(upgrade.BEGIN) == 1 and "second\n" in text and "first" not in text
    assert text.index(dataplane.END) < text.index(upgrade.BEGIN) < text.index("hand note")
