"""The backup command's choice of pod."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stateward.instance import backup

pytestmark = pytest.mark.unit


def pod(name: str, phase: str = "Running", *, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    return {"metadata": metadata, "status": {"phase": phase}}


def test_the_running_primary_is_chosen() -> None:
    pods = {"items": [pod("demo-0", deleting=True), pod("demo-1"), pod("demo-2", "Pending")]}
    assert backup.primary_pod(pods) == "demo-1"


def test_no_primary_says_what_was_looked_for() -> None:
    with pytest.raises(backup.BackupError, match=r"stateward\.io/role=primary"):
        backup.primary_pod({"items": [pod("demo-0", "Failed")]})


def test_two_primaries_are_refused() -> None:
    with pytest.raises(backup.BackupError, match="demo-0, demo-1"):
        backup.primary_pod({"items": [pod("demo-0"), pod("demo-1")]})


def test_selector_names_the_cluster_and_the_role() -> None:
    assert backup.selector("demo") == "stateward.io/cluster=demo,stateward.io/role=primary"


def test_the_report_stays_json_within_the_kubelets_limit(tmp_path: Any) -> None:
    path = tmp_path / "termination-log"
    backup._report(path, {"error": "x" * 10000})
    assert len(path.read_text()) <= 4096
    assert json.loads(path.read_text())["error"].startswith("xxx")
