"""The TLS benchmark stays runnable without running it (real nodes, minutes): its flags, its
connections, the certificate cost it measures, its table and where it writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench import dataplane, tls

pytestmark = pytest.mark.unit


def test_the_flags() -> None:
    args = tls.parse([])
    assert (args.runs, args.rounds, args.seconds) == (3, 2, 20)
    with pytest.raises(SystemExit):
        tls.parse(["--rounds", "0"])


def test_the_same_connection_with_tls_and_without() -> None:
    with_tls = tls.connection(["10.244.1.2", "10.244.2.2"], "require")
    without = tls.connection(["10.244.1.2", "10.244.2.2"], "disable")
    assert with_tls == dataplane.dsn(["10.244.1.2", "10.244.2.2"])
    assert without == with_tls.replace("sslmode=require", "sslmode=disable")
    assert "target_session_attrs=read-write" in without


def test_a_clusters_certificates_are_timed_as_the_operator_makes_them() -> None:
    took = tls.issuance_ms(repeats=3)
    assert len(took) == 3 and all(ms > 0 for ms in took)


def result() -> dict[str, Any]:
    def pgbench(tps: float, latency: float) -> dict[str, Any]:
        return {"tps": tps, "latency_ms": latency}

    def writer(downtime: float, gap: float, lost: int = 0) -> dict[str, Any]:
        return {
            "downtime_s": downtime, "insert_gap_before_s": gap, "lost": lost,
            "acknowledged": 100,
        }  # fmt: skip

    return {
        "rounds": 2, "seconds": 20, "runs": 2, "issuance_ms": [2.0, 1.0, 3.0],
        "ready": {"ready_s": 31.26},
        "persistent": {
            "require": [pgbench(900, 4.4), pgbench(900, 4.4)],
            "disable": [pgbench(1000, 4.0), pgbench(1000, 4.0)],
        },
        "connect": {
            "require": [pgbench(100, 40.0), pgbench(140, 40.0)],
            "disable": [pgbench(200, 20.0), pgbench(200, 20.0)],
        },
        "switchover": [
            {"to": "tls-1", "require": writer(1.5, 0.03), "disable": writer(1.3, 0.02)},
            {"to": "tls-0", "require": writer(2.5, 0.03), "disable": writer(1.7, 0.02, lost=1)},
        ],
    }  # fmt: skip


def test_the_table_sets_tls_beside_plaintext_and_says_what_it_costs() -> None:
    text = tls.markdown(result(), {"date": "2026-12-05", "machine": "2 CPUs"})
    assert "| **pgbench, persistent connections: tps** | **900** | **1000** | -10.0 % |" in text
    assert "| **pgbench, a connection per transaction: tps** | **120** | **200** | -40.0 % |" in (
        text
    )
    assert "| pgbench, a connection per transaction: average latency | 40.00 ms | 20.00 ms |" in (
        text
    )
    assert "| **switchover: write downtime** (median) | 2.00 s | 1.50 s | +33.3 % |" in text
    assert "| switchover: acknowledged rows lost, 2 runs | 0 of 200 | 1 of 200 | |" in text
    assert "31.3 s for this cluster" in text and "2.0 ms of CPU (median of 3" in text


def test_the_table_goes_after_the_data_plane_section_then_replaces_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# B\n{dataplane.BEGIN}\nrows\n{dataplane.END}\nhand note\n")
    monkeypatch.setattr(dataplane, "DOC", doc)
    tls.write_doc("first\n")
    tls.write_doc("second\n")
    text = doc.read_text()
    assert text.count(tls.BEGIN) == 1 and "second\n" in text and "first" not in text
    assert text.index(dataplane.END) < text.index(tls.BEGIN) < text.index("hand note")
    assert "### What TLS costs" in text
