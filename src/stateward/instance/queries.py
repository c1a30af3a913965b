"""Custom metric queries of a cluster (``spec.monitoring.customQueriesConfigMap``), served
beside the instance's own metrics on each scrape.

The user's ConfigMaps are mounted under :data:`DIRECTORY`; each file is a YAML mapping in
postgres_exporter's and CloudNativePG's format::

    orders_backlog:                 # the series are stateward_custom_orders_backlog_<column>
      query: "select region, count(*) as open from orders where not shipped group by 1"
      primary: true                 # only on the primary (also: master)
      metrics:
        - region: {usage: LABEL, description: "Sales region"}
        - open:   {usage: GAUGE, description: "Orders not shipped"}

Each query runs as :data:`ROLE`, never as the superuser: a login on the pod's socket that
holds ``pg_monitor`` (statistics, settings, sizes), reads nothing else unless granted, and
whose transactions are read-only and time out. It is made on the primary, once, the first
time a query is configured there (replicas get it by replication). A ConfigMap is edited by
whoever may edit the namespace; what its queries can do is what that role can.

Parsing and the mapping to metric families are pure (:func:`parse`, :func:`families`);
:func:`run` asks ``psql``. A query that fails (a typo, a permission the role lacks, a
timeout) is counted in ``stateward_custom_query_errors_total`` and yields no series: the
other queries and the instance's own metrics are unaffected.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from stateward.instance import localsql

DIRECTORY: Final = "/etc/stateward/queries"
ROLE: Final = "stateward_monitor"
PREFIX: Final = "stateward_custom_"
STATEMENT_TIMEOUT_MS: Final = 4000
USAGES: Final = frozenset({"LABEL", "GAUGE", "COUNTER", "DISCARD"})
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

ENSURE_ROLE: Final = f"""\
do $$ begin
  if not exists (select from pg_roles where rolname = '{ROLE}') then
    create role {ROLE} login in role pg_monitor;
  end if;
  alter role {ROLE} set default_transaction_read_only = on;
  alter role {ROLE} set statement_timeout = {STATEMENT_TIMEOUT_MS};
end $$"""
"""Made on the primary by the superuser: idempotent, so every supervisor may run it once."""


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    usage: str
    description: str


@dataclasses.dataclass(frozen=True)
class Query:
    name: str
    sql: str
    columns: tuple[Column, ...]
    primary_only: bool = False

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.usage == "LABEL")


Problem = tuple[str, str]
"""What is wrong, keyed by the query's name (or the file's, when it did not parse)."""


def parse(text: str, source: str) -> tuple[list[Query], list[Problem]]:
    """The queries of one file and what is wrong with the rest (a bad query is skipped,
    the others kept; each message names the file and the query)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return [], [(source, f"{source}: not YAML ({type(error).__name__})")]
    if document is None:
        return [], []
    if not isinstance(document, dict):
        return [], [(source, f"{source}: a mapping of query names is expected")]
    queries: list[Query] = []
    problems: list[Problem] = []
    for name, body in document.items():
        try:
            queries.append(_query(str(name), body))
        except ValueError as problem:
            problems.append((str(name), f"{source}: {name}: {problem}"))
    return queries, problems


def _query(name: str, body: Any) -> Query:
    if not NAME.match(name):
        raise ValueError("the name must be letters, digits and underscores")
    if not isinstance(body, dict) or not isinstance(body.get("query"), str):
        raise ValueError("needs a query (a string)")
    columns = []
    for entry in body.get("metrics") or []:
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ValueError("each of metrics is one column: {name: {usage: ...}}")
        ((column, spec),) = entry.items()
        spec = spec if isinstance(spec, dict) else {}
        usage = str(spec.get("usage", "")).upper()
        if not NAME.match(str(column)):
            raise ValueError(f"column {column}: letters, digits and underscores only")
        if usage not in USAGES:
            raise ValueError(f"column {column}: usage must be one of {sorted(USAGES)}")
        columns.append(Column(str(column), usage, str(spec.get("description") or column)))
    if not any(c.usage in ("GAUGE", "COUNTER") for c in columns):
        raise ValueError("no column is a GAUGE or a COUNTER")
    primary = bool(body.get("primary") or body.get("master"))
    return Query(name, body["query"].strip().rstrip(";"), tuple(columns), primary)


def load(directory: str = DIRECTORY) -> tuple[list[Query], list[Problem]]:
    """Every query of the mounted files (a query name seen twice: the first file's kept)."""
    queries: list[Query] = []
    problems: list[Problem] = []
    try:
        files = sorted(p for p in Path(directory).iterdir() if not p.name.startswith("."))
    except OSError:
        return [], []
    seen: set[str] = set()
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue  # an optional ConfigMap that does not exist, or a key it lacks
        found, wrong = parse(text, path.name)
        problems += wrong
        for query in found:
            if query.name in seen:
                message = f"{path.name}: {query.name}: defined in an earlier file too"
                problems.append((query.name, message))
                continue
            seen.add(query.name)
            queries.append(query)
    return queries, problems


def wrapped(query: Query) -> str:
    """The query, its rows as one JSON array: one round trip, no parsing of psql's text."""
    return f"select coalesce(json_agg(q), '[]'::json) from ({query.sql}\n) q"  # noqa: S608 - the user's own query, run as ROLE


def run(
    psql: str, query: Query, run_: Callable[..., Any] | None = None
) -> list[Mapping[str, Any]] | None:
    """The rows of ``query``, asked as :data:`ROLE` on the pod's socket; None on any error."""
    timeout = STATEMENT_TIMEOUT_MS / 1000 + 2
    rows = localsql.json_answer(psql, wrapped(query), user=ROLE, timeout=timeout, run=run_)
    return rows if isinstance(rows, list) else None


def ensure_role(psql: str, run_: Callable[..., Any] | None = None) -> bool:
    """:data:`ENSURE_ROLE` as the superuser on the socket (on the primary); True if done."""
    return localsql.answer(psql, ENSURE_ROLE, user="postgres", timeout=10, run=run_) is not None


def families(
    answers: Iterable[tuple[Query, list[Mapping[str, Any]] | None]],
    errors: Mapping[str, int],
) -> Iterator[Metric]:
    """The series of each answered query (``None``: it failed), then the error counter
    (``errors``: failures so far by query name, including files that did not parse)."""
    for query, rows in answers:
        if rows is None:
            continue
        for column in query.columns:
            if column.usage not in ("GAUGE", "COUNTER"):
                continue
            name = f"{PREFIX}{query.name}_{column.name}"
            family: GaugeMetricFamily | CounterMetricFamily = (
                GaugeMetricFamily(name, column.description, labels=query.labels)
                if column.usage == "GAUGE"
                else CounterMetricFamily(name, column.description, labels=query.labels)
            )
            for row in rows:
                value = _number(row.get(column.name))
                if value is None:
                    continue
                family.add_metric([str(row.get(label, "")) for label in query.labels], value)
            yield family
    counter = CounterMetricFamily(
        "stateward_custom_query_errors",
        "Custom queries that failed (or did not parse), by query",
        labels=["query"],
    )
    for query_name, count in sorted(errors.items()):
        counter.add_metric([query_name], count)
    yield counter


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


class Custom:
    """The custom queries of one instance across scrapes: read the files, make the role on
    the primary once, ask each query, count failures."""

    def __init__(self, psql: str, directory: str = DIRECTORY) -> None:
        self.psql, self.directory = psql, directory
        self.errors: dict[str, int] = {}
        self._role_ready = False
        self._said: set[str] = set()

    def collect(self, primary: bool | None) -> Sequence[Metric]:
        """``primary``: the instance's role now (None: PostgreSQL did not answer)."""
        queries, problems = load(self.directory)
        for key, message in problems:
            self.errors[key] = self.errors.get(key, 0) + 1
            if message not in self._said:  # once, not on every scrape
                self._said.add(message)
                print(f"stateward-instance: custom query: {message}", file=sys.stderr)
        if not queries and not problems:
            return []
        answers: list[tuple[Query, list[Mapping[str, Any]] | None]] = []
        if primary is not None:
            if primary and not self._role_ready:
                self._role_ready = ensure_role(self.psql)
            for query in queries:
                if query.primary_only and not primary:
                    continue
                rows = run(self.psql, query)
                if rows is None:
                    self.errors[query.name] = self.errors.get(query.name, 0) + 1
                answers.append((query, rows))
        return list(families(answers, self.errors))
