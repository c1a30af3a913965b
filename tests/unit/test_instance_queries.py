"""Custom metric queries (``spec.monitoring.customQueriesConfigMap``): the file format, the
series they become, who runs them, and that one bad query harms nothing else."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric

from stateward.instance import metrics, queries
from stateward.specs.postgres import statefulset
from tests.support.clusters import make_cluster
from tests.unit.test_instance_metrics import PRIMARY

pytestmark = pytest.mark.unit

BACKLOG = """\
orders_backlog:
  query: "select region, count(*) as open, 3 as shipped from orders group by 1;"
  primary: true
  metrics:
    - region: {usage: LABEL, description: "Sales region"}
    - open: {usage: GAUGE, description: "Orders not shipped"}
    - shipped: {usage: COUNTER, description: "Orders shipped"}
"""


def samples(families: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_a_query_file_in_postgres_exporters_format_is_read() -> None:
    (query,), problems = queries.parse(BACKLOG, "0-shop.yaml")
    assert problems == []
    assert query.name == "orders_backlog" and query.primary_only
    assert query.labels == ("region",)
    assert query.sql.endswith("group by 1")  # the trailing semicolon goes: it is wrapped
    assert [c.usage for c in query.columns] == ["LABEL", "GAUGE", "COUNTER"]
    # CloudNativePG's older spelling of primary-only.
    (old,), _ = queries.parse(BACKLOG.replace("primary: true", "master: true"), "f")
    assert old.primary_only


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("x: [unclosed", "not YAML"),
        ("- a list", "a mapping of query names"),
        ("bad-name:\n  query: select 1 as n\n  metrics: [{n: {usage: GAUGE}}]", "letters"),
        ("q:\n  metrics: [{n: {usage: GAUGE}}]", "needs a query"),
        ("q:\n  query: select 1 as n\n  metrics: [{n: {usage: HISTOGRAM}}]", "usage must be"),
        ("q:\n  query: select 1 as n\n  metrics: [{n: {usage: LABEL}}]", "no column is a GAUGE"),
        ("q:\n  query: select 1 as n\n  metrics: [{n: {}, m: {}}]", "one column"),
    ],
)
def test_a_bad_query_is_named_with_what_is_wrong(text: str, says: str) -> None:
    found, problems = queries.parse(text, "0-shop.yaml")
    assert found == []
    ((_, message),) = problems
    assert message.startswith("0-shop.yaml") and says in message


def test_one_bad_query_does_not_take_the_others_with_it() -> None:
    text = BACKLOG + "broken:\n  query: select 1\n"
    found, problems = queries.parse(text, "f.yaml")
    assert [q.name for q in found] == ["orders_backlog"]
    assert [key for key, _ in problems] == ["broken"]


def test_the_files_of_every_configmap_are_read_and_a_name_counts_once(tmp_path: Path) -> None:
    (tmp_path / "0-shop.yaml").write_text(BACKLOG)
    (tmp_path / "1-more.yaml").write_text(BACKLOG)
    (tmp_path / ".hidden").write_text("not: read")
    found, problems = queries.load(str(tmp_path))
    assert [q.name for q in found] == ["orders_backlog"]
    assert problems == [
        ("orders_backlog", "1-more.yaml: orders_backlog: defined in an earlier file too")
    ]
    assert queries.load(str(tmp_path / "absent")) == ([], [])


def test_rows_become_series_labelled_by_the_label_columns() -> None:
    (query,), _ = queries.parse(BACKLOG, "f")
    rows = [{"region": "eu", "open": 4, "shipped": 10}, {"region": "us", "open": "2.5"}]
    found = samples(list(queries.families([(query, rows)], {})))
    assert found == {
        ("stateward_custom_orders_backlog_open", (("region", "eu"),)): 4.0,
        ("stateward_custom_orders_backlog_open", (("region", "us"),)): 2.5,
        ("stateward_custom_orders_backlog_shipped_total", (("region", "eu"),)): 10.0,
    }


def test_a_failed_query_serves_no_series_and_its_errors_are_counted() -> None:
    (query,), _ = queries.parse(BACKLOG, "f")
    found = samples(list(queries.families([(query, None)], {"orders_backlog": 3})))
    assert found == {("stateward_custom_query_errors_total", (("query", "orders_backlog"),)): 3.0}


class Psql:
    """psql as the collector calls it: answers by the role and the statement."""

    def __init__(self, rows: Any = None, role_fails: bool = False) -> None:
        self.calls: list[tuple[str, str]] = []
        self.rows, self.role_fails = rows, role_fails

    def __call__(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        role, statement = argv[argv.index("-U") + 1], argv[-1]
        self.calls.append((role, statement))
        if statement == queries.ENSURE_ROLE:
            return subprocess.CompletedProcess(argv, 1 if self.role_fails else 0, "", "")
        if self.rows is None:
            return subprocess.CompletedProcess(argv, 1, "", "ERROR: permission denied")
        return subprocess.CompletedProcess(argv, 0, json.dumps(self.rows), "")


def test_a_query_runs_as_the_monitoring_role_wrapped_into_one_json_answer() -> None:
    (query,), _ = queries.parse(BACKLOG, "f")
    psql = Psql(rows=[{"region": "eu", "open": 1}])
    assert queries.run("psql", query, psql) == [{"region": "eu", "open": 1}]
    ((role, statement),) = psql.calls
    assert role == queries.ROLE != "postgres"
    assert statement.startswith("select coalesce(json_agg(q), '[]'::json) from (select region")
    assert queries.run("psql", query, Psql(rows=None)) is None


def test_the_role_holds_pg_monitor_only_and_its_transactions_are_read_only() -> None:
    sql = queries.ENSURE_ROLE
    assert "create role stateward_monitor login in role pg_monitor" in sql
    assert "superuser" not in sql.lower()
    assert "default_transaction_read_only = on" in sql and "statement_timeout" in sql
    assert "if not exists" in sql  # idempotent: every supervisor may run it


def test_the_collector_makes_the_role_on_the_primary_once_and_asks_replicas_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "0-shop.yaml").write_text(
        BACKLOG + "everywhere:\n  query: select 1 as n\n  metrics: [{n: {usage: GAUGE}}]\n"
    )
    psql = Psql(rows=[{"n": 1, "region": "eu", "open": 1}])
    monkeypatch.setattr(subprocess, "run", psql)
    custom = queries.Custom("psql", str(tmp_path))
    custom.collect(primary=True)
    custom.collect(primary=True)
    made = [call for call in psql.calls if call[1] == queries.ENSURE_ROLE]
    assert made == [("postgres", queries.ENSURE_ROLE)]  # once, as the superuser
    psql.calls.clear()
    names = {f.name for f in custom.collect(primary=False)}
    # A replica skips the primary-only query and never makes the role.
    assert names == {"stateward_custom_everywhere_n", "stateward_custom_query_errors"}
    assert all(role == queries.ROLE for role, _ in psql.calls) and len(psql.calls) == 1
    # PostgreSQL not answering: no query is asked.
    psql.calls.clear()
    custom.collect(primary=None)
    assert psql.calls == []


def test_without_queries_nothing_is_asked_or_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    psql = Psql()
    monkeypatch.setattr(subprocess, "run", psql)
    assert queries.Custom("psql", str(tmp_path / "absent")).collect(primary=True) == []
    assert psql.calls == []


def test_a_bad_file_is_said_once_and_counted_on_every_scrape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "0-shop.yaml").write_text("x: [unclosed")
    custom = queries.Custom("psql", str(tmp_path))
    custom.collect(primary=None)
    found = samples(list(custom.collect(primary=None)))
    assert found == {("stateward_custom_query_errors_total", (("query", "0-shop.yaml"),)): 2.0}
    assert capsys.readouterr().err.count("0-shop.yaml: not YAML") == 1


def test_the_instance_collector_serves_custom_series_beside_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "0-shop.yaml").write_text(BACKLOG)
    monkeypatch.setattr(metrics, "ask", lambda psql: PRIMARY)
    monkeypatch.setattr(subprocess, "run", Psql(rows=[{"region": "eu", "open": 7}]))
    collector = metrics.InstanceCollector("psql", str(tmp_path), str(tmp_path))
    found = samples(list(collector.collect()))
    assert found[("stateward_custom_orders_backlog_open", (("region", "eu"),))] == 7.0
    assert found[("stateward_postgres_up", ())] == 1.0


def test_the_instances_mount_the_configmaps_optionally_and_only_when_asked() -> None:
    def pod(**spec: Any) -> dict[str, Any]:
        body = statefulset.statefulset(make_cluster(**spec), config_hash="h")
        return dict(body["spec"]["template"]["spec"])

    plain = pod()
    assert "custom-queries" not in {v["name"] for v in plain["volumes"]}
    configmaps = [{"name": "shop"}, {"name": "more", "key": "q.yaml"}]
    asked = pod(monitoring={"customQueriesConfigMap": configmaps})
    (volume,) = [v for v in asked["volumes"] if v["name"] == "custom-queries"]
    assert volume["projected"]["sources"] == [
        {"configMap": {"name": "shop", "optional": True,
                       "items": [{"key": "queries.yaml", "path": "0-shop.yaml"}]}},
        {"configMap": {"name": "more", "optional": True,
                       "items": [{"key": "q.yaml", "path": "1-more.yaml"}]}},
    ]  # fmt: skip
    mounts = asked["containers"][0]["volumeMounts"]
    assert {"name": "custom-queries", "mountPath": queries.DIRECTORY, "readOnly": True} in mounts


def test_a_configmap_reference_must_be_a_configmap_name_and_key() -> None:
    with pytest.raises(ValueError, match="name"):
        make_cluster(monitoring={"customQueriesConfigMap": [{"name": "Not_Valid"}]})
    with pytest.raises(ValueError, match="key"):
        make_cluster(monitoring={"customQueriesConfigMap": [{"name": "ok", "key": "a/b"}]})
