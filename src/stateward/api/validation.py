"""Pure validation of PostgresCluster specs: what the CRD's CEL rules cannot say.

The CRD (``stateward.api.crd``) refuses most invalid specs at admission with CEL rules; the
validating webhook calls :func:`validate_spec` for the rest:

* cron schedules whose fields are well-formed but still wrong: reversed ranges (``20-10``)
  and schedules that can never fire (``0 0 30 2 *``, ``0 0 31 4,6,9,11 *``);
* postgresql.conf parameters the operator manages, compared case-insensitively (PostgreSQL
  parameter names are case-insensitive; the CEL rule only sees exact lowercase keys);
* resource quantities and the StorageClass name format.

:func:`validate_spec` also repeats every rule the CRD already enforces, so that it can be
used on its own (dry runs, objects admitted before a rule existed) and gives the same answer.
Every message starts with the field path, e.g. ``spec.backupSchedule: ...``.

The cron grammar accepted here is exactly the one of :data:`CRON_REGEX` (which the CRD
evaluates in CEL) and a subset of what Kubernetes CronJobs accept (robfig/cron
``ParseStandard``): five fields separated by spaces, each a comma-separated list of ``*``,
``*/n``, ``a``, ``a-b`` or ``a-b/n``; months may be ``JAN``-``DEC`` and days of the week
``SUN``-``SAT`` (any case). Day-of-week is 0-6 because CronJobs refuse 7. Descriptors
(``@daily``, ``@every 5m``), ``?``, ``a/n`` and time-zone prefixes are refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pydantic
from lightkube.utils import quantity as lightkube_quantity

from stateward.api.v1alpha1 import (
    FENCED_INSTANCES_ANNOTATION,
    MAX_REPLICAS,
    PARAMETER_NAME_PATTERN,
    SUPPORTED_MAJOR_VERSIONS,
    VERSION_PATTERN,
    PostgresClusterSpec,
)
from stateward.instance import patroni

__all__ = [
    "CRON_EXAMPLE",
    "CRON_FIELDS",
    "CRON_REGEX",
    "DEFAULT_PARAMETERS",
    "FENCE_ALL",
    "FOREIGN_REPOSITORY_PATHS_FLAG",
    "MANAGED_PARAMETERS",
    "OPERATOR_PARAMETERS",
    "PATRONI_OWNED_PARAMETERS",
    "VERSION_REGEX",
    "CronField",
    "fenced_instances",
    "parse_quantity",
    "repository_path_problems",
    "validate_annotations",
    "validate_cron",
    "validate_spec",
]

# --- postgresql.conf parameters ----------------------------------------------------------

# The socket and certificate (``NAME-tls``) paths are facts of the pod (``instance.patroni``,
# a leaf below every layer), which the fixed parameters below must name.

OPERATOR_PARAMETERS: Mapping[str, str] = {
    "wal_level": "replica",
    "hot_standby": "on",
    # Every possible replica plus room for base backups; constant so that scaling needs no
    # restart (replicas must have at least the primary's value).
    "max_wal_senders": str(MAX_REPLICAS + 4),
    "max_replication_slots": str(MAX_REPLICAS + 4),
    "wal_keep_size": "128MB",
    "wal_log_hints": "on",
    "password_encryption": "scram-sha-256",
    "unix_socket_directories": patroni.SOCKET_DIR,
    # On in every cluster, so that configuring backups later needs no restart; the
    # archive_command (instance.pgbackrest) archives to the repository, or discards WAL as
    # a cluster without archiving would.
    "archive_mode": "on",
    # TLS by default: the cluster's certificate, TLS 1.3 only (every client libpq of
    # PostgreSQL 12 or later speaks it). PostgreSQL re-reads the files on a reload.
    "ssl": "on",
    "ssl_cert_file": f"{patroni.TLS_DIR}/tls.crt",
    "ssl_key_file": f"{patroni.TLS_DIR}/tls.key",
    # Client certificates (the certificate-only roles) are accepted from the cluster's CA
    # alone, not from the root of a serving certificate the user brings (``ca.crt``).
    "ssl_ca_file": f"{patroni.TLS_DIR}/client-ca.crt",
    "ssl_min_protocol_version": "TLSv1.3",
}
"""Parameters the operator sets to fixed values in every instance's configuration."""

DEFAULT_PARAMETERS: Mapping[str, str] = {
    # A synchronous standby that vanishes without closing its connection (power loss, a
    # partition) holds every commit until its walsender times out: 60 s by default. 5 s, as
    # CloudNativePG sets, lets Patroni name another standby within seconds; a replica
    # likewise notices a dead primary connection in 5 s.
    "wal_sender_timeout": "5s",
    "wal_receiver_timeout": "5s",
    # A commit held for a lost synchronous standby is released when the standby Patroni
    # names instead next reports its flush position, which an idle one does only every
    # wal_receiver_status_interval (10 s by default) or when the walsender asks (every
    # wal_sender_timeout / 2). Every second, one small message per standby.
    "wal_receiver_status_interval": "1s",
}
"""Parameters the operator sets unless the spec sets them (``spec.postgresql.parameters``)."""

PATRONI_OWNED_PARAMETERS: frozenset[str] = frozenset(
    {
        "listen_addresses",
        "port",
        "cluster_name",
        "data_directory",
        "config_file",
        "hba_file",
        "ident_file",
    }
)
"""Parameters Patroni sets from its own configuration."""

_RESERVED_PARAMETERS: frozenset[str] = frozenset(
    {
        # fixed by the pod layout
        "external_pid_file",
        # replication and failover: Patroni's job
        "primary_conninfo",
        "primary_slot_name",
        "promote_trigger_file",
        "synchronous_standby_names",
        # shell commands PostgreSQL would run as the server's user: a spec must not be a
        # way into the pod
        "archive_cleanup_command",
        "recovery_end_command",
        "ssl_passphrase_command",
        # WAL archiving, backups and restore: the operator's job
        "archive_mode",
        "archive_command",
        "archive_library",
        "restore_command",
        "recovery_target",
        "recovery_target_action",
        "recovery_target_inclusive",
        "recovery_target_lsn",
        "recovery_target_name",
        "recovery_target_time",
        "recovery_target_timeline",
        "recovery_target_xid",
    }
)

MANAGED_PARAMETERS: tuple[str, ...] = tuple(
    sorted(OPERATOR_PARAMETERS.keys() | PATRONI_OWNED_PARAMETERS | _RESERVED_PARAMETERS)
)
"""postgresql.conf parameters the operator (or Patroni on its behalf) sets itself; users may
not set them in ``spec.postgresql.parameters``. All lowercase. Derived from the sets above, so
what admission refuses is exactly what the instance configuration overrides."""

_PARAMETER_NAME = re.compile(PARAMETER_NAME_PATTERN)
PARAMETER_NAME_MESSAGE = (
    "a PostgreSQL parameter name: letters, digits and underscores, starting with a letter or"
    " underscore, with at most one dot for an extension's parameter (max_connections,"
    " pg_stat_statements.max)"
)

# --- versions ----------------------------------------------------------------------------

VERSION_REGEX = VERSION_PATTERN
"""The version rule (defined once, in ``v1alpha1``)."""

_SUPPORTED_TEXT = ", ".join(str(m) for m in SUPPORTED_MAJOR_VERSIONS[:-1]) + (
    f" or {SUPPORTED_MAJOR_VERSIONS[-1]}"
)
VERSION_MESSAGE = (
    f"must be a supported PostgreSQL major version ({_SUPPORTED_TEXT}), optionally with a "
    'minor version, e.g. "16" or "16.4"'
)

# --- cron --------------------------------------------------------------------------------

CRON_EXAMPLE = "0 3 * * *"
CRON_FIELD_NAMES = "minute hour day-of-month month day-of-week"
CRON_MESSAGE = f'must be a 5-field cron expression ({CRON_FIELD_NAMES}), e.g. "{CRON_EXAMPLE}"'

_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_MONTH_LONG = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
# Longest each month can be (February: 29, as leap years exist).
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


@dataclass(frozen=True)
class CronField:
    """One field of a 5-field cron expression."""

    name: str
    low: int
    high: int
    names: Mapping[str, int] = field(default_factory=dict)
    """Upper-case names accepted for values, e.g. JAN -> 1."""

    def value_regex(self) -> str:
        """A number in low..high (one or two digits), or one of the names (any case)."""
        alternatives = [_int_regex(self.low, self.high)]
        if self.names:
            alternatives.append("(?i:" + "|".join(self.names) + ")")
        return "(?:" + "|".join(alternatives) + ")"

    def step_regex(self) -> str:
        return "(?:" + _int_regex(1, self.high) + ")"

    def item_regex(self, *, capture: bool = False) -> str:
        """One list element: ``*`` or ``a-b``, either with ``/n``, or ``a``. With ``capture``
        the same pattern, group for group, with the parts named (``star``, ``low``, ``high``,
        ``step``, ``value``): what :func:`validate_cron` parses with."""

        def part(name: str, pattern: str) -> str:
            return f"(?P<{name}>{pattern})" if capture else pattern

        value = self.value_regex()
        ranged = f"{part('star', '[*]')}|{part('low', value)}-{part('high', value)}"
        return f"(?:(?:{ranged})(?:/{part('step', self.step_regex())})?|{part('value', value)})"

    def regex(self) -> str:
        """The whole field: a comma-separated list of :meth:`item_regex`."""
        item = self.item_regex()
        return f"{item}(?:,{item})*"

    def number(self, token: str) -> int:
        """The value of a token :meth:`value_regex` matched: a number or a name."""
        return int(token) if token.isdigit() else self.names[token.upper()]

    def describe(self) -> str:
        text = f"a number {self.low}-{self.high}"
        if self.names:
            first, last = next(iter(self.names)), list(self.names)[-1]
            text += f" or a name {first}-{last}"
        return text


CRON_FIELDS: tuple[CronField, ...] = (
    CronField("minute", 0, 59),
    CronField("hour", 0, 23),
    CronField("day-of-month", 1, 31),
    CronField("month", 1, 12, {n: i + 1 for i, n in enumerate(_MONTH_NAMES)}),
    CronField("day-of-week", 0, 6, {n: i for i, n in enumerate(_DAY_NAMES)}),
)


def _int_regex(low: int, high: int) -> str:
    """Regex alternatives for the integers low..high written with one or two digits (a
    single digit may carry one leading zero, as "05"). Only RE2/Python common syntax."""
    if not 0 <= low <= high <= 99:
        raise ValueError(f"unsupported range {low}-{high}")

    def span(a: int, b: int) -> str:
        return str(a) if a == b else f"[{a}-{b}]"

    alternatives: list[str] = []
    if low <= 9:
        alternatives.append("0?" + span(low, min(high, 9)))
    full_tens: list[int] = []
    for tens in range(max(low // 10, 1), high // 10 + 1):
        units_low, units_high = max(low - 10 * tens, 0), min(high - 10 * tens, 9)
        if (units_low, units_high) == (0, 9):
            full_tens.append(tens)
            continue
        if full_tens:
            alternatives.append(span(full_tens[0], full_tens[-1]) + "[0-9]")
            full_tens = []
        alternatives.append(f"{tens}{span(units_low, units_high)}")
    if full_tens:
        alternatives.append(span(full_tens[0], full_tens[-1]) + "[0-9]")
    return "|".join(alternatives)


CRON_REGEX = "^" + " +".join(f"(?:{f.regex()})" for f in CRON_FIELDS) + "$"
"""The cron grammar as one regular expression, evaluated by the CRD in CEL (RE2). It checks
syntax and per-field ranges; :func:`validate_cron` parses with the same patterns (named
groups added) and also checks reversed ranges and schedules that never fire. No backslashes
and no single quotes, so it embeds in a CEL string as is."""

_CRON = re.compile(CRON_REGEX)
_CRON_ITEMS = {f.name: re.compile(f.item_regex(capture=True)) for f in CRON_FIELDS}


@dataclass
class _ParsedField:
    values: set[int]
    star: bool
    """True when the field is unrestricted in cron's sense ("*" or "*/1"): the day fields
    are then combined with AND, otherwise with OR."""


_NUMBER = re.compile(r"[0-9]{1,2}")


def _explain_value(token: str, spec: CronField) -> list[str]:
    if _NUMBER.fullmatch(token):
        value = int(token)
        if spec.low <= value <= spec.high:
            return []
        hint = " (Sunday is 0 or SUN)" if spec.name == "day-of-week" and value == 7 else ""
        return [f"{spec.name}: {token} is out of range {spec.low}-{spec.high}{hint}"]
    if token.upper() in spec.names:
        return []
    if token == "?":  # noqa: S105 - not a password
        return [f'{spec.name}: "?" is not supported; use "*"']
    return [f'{spec.name}: "{token}" is not {spec.describe()}']


def _explain_item(item: str, text: str, spec: CronField) -> list[str]:
    """Why the field's item pattern refuses ``item`` (of field ``text``), for the user. Only
    explains: what is accepted is decided by the pattern alone."""
    if not item:
        return [f'{spec.name}: empty list element in "{text}"']
    base, slash, step_text = item.partition("/")
    if slash:
        if "/" in step_text:
            return [f'{spec.name}: "{item}" has more than one "/"']
        if not _NUMBER.fullmatch(step_text) or not 1 <= int(step_text) <= spec.high:
            return [f'{spec.name}: step "{step_text}" in "{item}" must be a number 1-{spec.high}']
    if base == "*":
        explained = []
    else:
        low_text, dash, high_text = base.partition("-")
        if slash and not dash:
            return [
                f'{spec.name}: "{item}" has a step but no range; write "*/{step_text}" or '
                f'"{low_text}-{spec.high}/{step_text}"'
            ]
        explained = _explain_value(low_text, spec)
        if dash:
            explained += _explain_value(high_text, spec)
    return explained or [f'{spec.name}: "{item}" is not valid']


def _parse_field(text: str, spec: CronField, errors: list[str]) -> _ParsedField | None:
    before = len(errors)
    parsed = _ParsedField(values=set(), star=False)
    for item in text.split(","):
        match = _CRON_ITEMS[spec.name].fullmatch(item)
        if match is None:
            errors.extend(_explain_item(item, text, spec))
            continue
        step = int(match["step"] or 1)
        if match["star"]:
            low, high = spec.low, spec.high
            parsed.star = parsed.star or step == 1
        elif match["value"]:
            low = high = spec.number(match["value"])
        else:
            low, high = spec.number(match["low"]), spec.number(match["high"])
            if low > high:
                errors.append(
                    f'{spec.name}: range "{item.partition("/")[0]}" is reversed ({low} > {high});'
                    " ranges do not wrap around, use a list instead"
                )
                continue
        parsed.values.update(range(low, high + 1, step))
    return parsed if len(errors) == before else None


def _join_or(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def validate_cron(expr: str) -> list[str]:
    """Problems with a 5-field cron expression, as user-facing messages (empty: valid).

    Accepts exactly what :data:`CRON_REGEX` matches (each list element is parsed with its
    field's pattern from the same :class:`CronField` table), minus reversed ranges and
    schedules that can never fire; the checks before the fields, and ``_explain_item``, only
    choose the message for what the pattern refuses."""
    if not isinstance(expr, str):
        return [f'must be a string, e.g. "{CRON_EXAMPLE}"']
    if not expr.strip():
        return [f"must not be empty; {CRON_MESSAGE}"]
    if expr.startswith("@"):
        return [f'{CRON_MESSAGE}; descriptors such as "@daily" or "@every 5m" are not supported']
    if expr.startswith(("TZ=", "CRON_TZ=")):
        return ["time-zone prefixes are not supported; schedules are always in UTC"]
    if re.search(r"[^\S ]", expr):
        return ["must not contain tabs or line breaks; separate the fields with spaces"]
    if expr != expr.strip(" "):
        return ["must not start or end with a space"]
    texts = expr.split()
    if len(texts) != len(CRON_FIELDS):
        return [f"{CRON_MESSAGE}; got {len(texts)} field{'s' if len(texts) > 1 else ''}"]

    errors: list[str] = []
    parsed = [
        _parse_field(text, spec, errors) for text, spec in zip(texts, CRON_FIELDS, strict=True)
    ]
    if errors:
        return errors
    if not _CRON.fullmatch(expr):  # pragma: no cover - every element matched its field's pattern
        return [CRON_MESSAGE]
    days, months, weekdays = (p for p in parsed[2:] if p is not None)
    # Cron runs on a day when day-of-month AND day-of-week match if either is "*", and when
    # either matches otherwise; only in the first case can day-of-month rule out every day.
    if (
        weekdays.star
        and not days.star
        and not any(min(days.values) <= _MONTH_DAYS[m - 1] for m in months.values)
    ):
        day_list = ", ".join(str(d) for d in sorted(days.values))
        month_list = _join_or([_MONTH_LONG[m - 1] for m in sorted(months.values)])
        what = (
            f"day-of-month {day_list} does not"
            if len(days.values) == 1
            else f"days-of-month {day_list} do not"
        )
        errors.append(f"never fires: {what} occur in {month_list}")
    return errors


# --- quantities --------------------------------------------------------------------------


def parse_quantity(value: object) -> Decimal | None:
    """The value of a Kubernetes quantity ("10Gi", "500m", "1e3"), or None if it is not one.

    lightkube's parser (``lightkube.utils.quantity``), which raises where callers here want
    None. Its grammar is Kubernetes' except at the edges: it lacks the ``n``/``u`` suffixes
    and the upper-case ``E`` exponent, has ``Z``/``Y``/``Zi``/``Yi``, and rounds up to
    thousandths."""
    if not isinstance(value, str):
        return None
    try:
        return lightkube_quantity.parse_quantity(value)
    except ValueError:
        return None


# --- the spec ----------------------------------------------------------------------------

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _quote(value: object) -> str:
    """A value as JSON, as the user wrote it: "16" for a string, 16 for a number."""
    return json.dumps(value, default=str)


def _major(version: object) -> int | None:
    if isinstance(version, str) and re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3})?", version):
        return int(version.split(".")[0])
    return None


# Fields, and maps whose entries, the checks above already cover.
_CHECKED_FIELDS = {"version", "replicas", "storageSize", "storageClassName", "backupSchedule"}
_CHECKED_MAPS = {("postgresql", "parameters"), ("resources", "requests"), ("resources", "limits")}


def _model_errors(spec: Mapping[str, Any]) -> list[str]:
    """Everything the pydantic model refuses that the checks above do not cover: unknown
    fields, wrong types, deletionPolicy and whatever fields come next."""
    try:
        PostgresClusterSpec.model_validate(dict(spec))
    except pydantic.ValidationError as exc:
        messages = []
        for error in exc.errors():
            loc = error["loc"]
            if (loc and loc[0] in _CHECKED_FIELDS) or (len(loc) > 2 and loc[:2] in _CHECKED_MAPS):
                continue
            path = "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
            message = {
                "missing": "is required",
                "extra_forbidden": "unknown field",
            }.get(error["type"], error["msg"])
            messages.append(f"{path}: {message}")
        return messages
    return []


def _check_version(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    if "version" not in spec:
        return ["spec.version: is required"]
    version = spec["version"]
    if not isinstance(version, str) or not re.fullmatch(VERSION_REGEX, version):
        return [f"spec.version: {VERSION_MESSAGE} (got {_quote(version)})"]
    # A new major upgrades in place; one below the data's is refused by the CRD's rule on
    # status.version (the data's major is in the status, which this does not see).
    return []


def _check_replicas(spec: Mapping[str, Any]) -> list[str]:
    if "replicas" not in spec:
        return ["spec.replicas: is required"]
    replicas = spec["replicas"]
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        return [f"spec.replicas: must be an integer (got {_quote(replicas)})"]
    if not 1 <= replicas <= MAX_REPLICAS:
        return [f"spec.replicas: must be between 1 and {MAX_REPLICAS} (got {replicas})"]
    return []


def _check_storage(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    errors: list[str] = []
    if "storageSize" not in spec:
        errors.append("spec.storageSize: is required")
    else:
        size = parse_quantity(spec["storageSize"])
        if size is None or size <= 0:
            errors.append(
                'spec.storageSize: must be a positive Kubernetes quantity such as "10Gi" '
                f"(got {_quote(spec['storageSize'])})"
            )
        elif old is not None:
            old_size = parse_quantity(old.get("storageSize", ""))
            if old_size is not None and size < old_size:
                errors.append(
                    f"spec.storageSize: may grow but never shrink (from {old['storageSize']} "
                    f"to {spec['storageSize']})"
                )
    name = spec.get("storageClassName")
    if name is not None and (
        not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name)
    ):
        errors.append(
            "spec.storageClassName: must be a StorageClass name (lowercase letters, digits, "
            f"'-' and '.', at most 253 characters) (got {_quote(name)})"
        )
    if old is not None:
        old_name = old.get("storageClassName")
        if old_name != name:
            if old_name is None:
                change = f"cannot be set after creation (to {_quote(name)})"
            elif name is None:
                change = f"cannot be removed after creation (was {_quote(old_name)})"
            else:
                change = f"cannot change from {_quote(old_name)} to {_quote(name)}"
            errors.append(f"spec.storageClassName: is immutable: it {change}")
    return errors


def _check_schedule(spec: Mapping[str, Any]) -> list[str]:
    schedule = spec.get("backupSchedule")
    if schedule is None:
        return []
    return [f"spec.backupSchedule: {message}" for message in validate_cron(schedule)]


def _check_backup(spec: Mapping[str, Any]) -> list[str]:
    """What needs a repository: scheduled backups, an explicit final backup, a restore."""
    errors = []
    bootstrap = spec.get("bootstrap")
    restore = bootstrap.get("restore") if isinstance(bootstrap, Mapping) else None
    if isinstance(restore, Mapping) and {"targetTime", "restorePoint"} <= restore.keys():
        errors.append("spec.bootstrap.restore: takes targetTime or restorePoint, not both")
    if spec.get("backup") is not None:
        return errors
    if restore is not None:
        errors.append(
            "spec.bootstrap.restore: needs spec.backup.repository: the object store that"
            " holds the backups to restore"
        )
    if spec.get("backupSchedule") is not None:
        errors.append(
            "spec.backupSchedule: needs a repository to write to: set spec.backup.repository"
            " (or remove the schedule)"
        )
    policy = spec.get("deletionPolicy")
    if isinstance(policy, Mapping) and policy.get("finalBackup") is True:
        errors.append(
            "spec.deletionPolicy.finalBackup: needs a repository to write to: set"
            " spec.backup.repository, or set finalBackup to false"
        )
    return errors


FOREIGN_REPOSITORY_PATHS_FLAG = "--allow-foreign-repository-paths"
"""The operator's flag (the chart's ``allowForeignRepositoryPaths``) that lets repository paths
leave their namespace's prefix: for a platform whose namespaces share one bucket on purpose."""


def repository_path_problems(namespace: str, spec: Mapping[str, Any]) -> list[str]:
    """Repository paths outside the namespace's own prefix ``/NAMESPACE/``.

    One bucket often serves every namespace, with the same credentials. A cluster whose
    ``spec.backup.repository.s3.path`` or ``spec.bootstrap.restore.path`` named another
    namespace's repository could restore that namespace's data (read it), or write WAL and
    expire backups in it. Only the operator's administrator may allow that
    (:data:`FOREIGN_REPOSITORY_PATHS_FLAG`); the defaults (``/NAMESPACE/NAME``) always pass."""
    prefix = f"/{namespace}"
    backup = spec.get("backup")
    repository = backup.get("repository") if isinstance(backup, Mapping) else None
    s3 = repository.get("s3") if isinstance(repository, Mapping) else None
    bootstrap = spec.get("bootstrap")
    restore = bootstrap.get("restore") if isinstance(bootstrap, Mapping) else None
    problems = []
    for where, holder in (
        ("spec.backup.repository.s3.path", s3),
        ("spec.bootstrap.restore.path", restore),
    ):
        path = holder.get("path") if isinstance(holder, Mapping) else None
        if not isinstance(path, str) or path == prefix or path.startswith(f"{prefix}/"):
            continue
        problems.append(
            f"{where}: {path} is outside this namespace's prefix {prefix}/, where another"
            " namespace's backups could be read or overwritten; use a path under"
            f" {prefix}/ (or leave it unset), or ask the operator's administrator to start"
            f" it with {FOREIGN_REPOSITORY_PATHS_FLAG}"
        )
    return problems


def _check_parameters(spec: Mapping[str, Any]) -> list[str]:
    postgresql = spec.get("postgresql")
    if not isinstance(postgresql, Mapping):
        return []
    parameters = postgresql.get("parameters")
    if not isinstance(parameters, Mapping):
        return []
    errors: list[str] = []
    for key, value in parameters.items():
        path = f"spec.postgresql.parameters[{_quote(key)}]"
        if not isinstance(key, str) or not _PARAMETER_NAME.fullmatch(key):
            errors.append(f"{path}: must be {PARAMETER_NAME_MESSAGE}")
        elif key.lower() in MANAGED_PARAMETERS:
            errors.append(
                f"{path}: the operator manages {key.lower()} and it cannot be set here "
                f"(managed parameters: {', '.join(MANAGED_PARAMETERS)})"
            )
        if not isinstance(value, str):
            errors.append(f"{path}: must be a string (got {_quote(value)})")
    return errors


def _check_resources(spec: Mapping[str, Any]) -> list[str]:
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return []
    errors: list[str] = []
    for kind in ("requests", "limits"):
        amounts = resources.get(kind)
        if not isinstance(amounts, Mapping):
            continue
        for name, amount in amounts.items():
            if parse_quantity(amount) is None:
                errors.append(
                    f"spec.resources.{kind}.{name}: must be a Kubernetes quantity such as "
                    f'"500m" or "1Gi" (got {_quote(amount)})'
                )
    return errors


def validate_spec(new: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Problems with a PostgresCluster ``spec`` (camelCase, as on the wire), or with the
    change from ``old`` on an update, as messages that each start with the field path.

    An empty list means the spec is valid. ``old`` is the previous spec (None on create)."""
    if not isinstance(new, Mapping):
        return ["spec: must be an object"]
    if old is not None and not isinstance(old, Mapping):
        old = None
    errors = [
        *_check_version(new, old),
        *_check_replicas(new),
        *_check_storage(new, old),
        *_check_schedule(new),
        *_check_backup(new),
        *_check_parameters(new),
        *_check_resources(new),
    ]
    errors.extend(_model_errors(new))
    return errors


FENCE_ALL = "*"


def fenced_instances(annotations: Mapping[str, Any] | None) -> list[str]:
    """The instances the ``stateward.io/fenced-instances`` annotation fences, sorted (``["*"]``
    for all; empty when it is absent). Raises ValueError with a message naming the
    annotation and the expected form when the value is not a JSON list of pod names."""
    raw = (annotations or {}).get(FENCED_INSTANCES_ANNOTATION)
    if raw is None or raw == "":
        return []
    expected = (
        f'metadata.annotations["{FENCED_INSTANCES_ANNOTATION}"]: must be a JSON list of pod'
        f""" names such as '["NAME-1"]', or '["*"]' for every instance (got {_quote(raw)})"""
    )
    try:
        names = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        raise ValueError(expected) from None
    if not isinstance(names, list) or not all(
        isinstance(n, str) and (n == FENCE_ALL or re.fullmatch(POD_NAME_PATTERN, n)) for n in names
    ):
        raise ValueError(expected)
    return sorted(set(names))


POD_NAME_PATTERN = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"


def validate_annotations(annotations: Mapping[str, Any] | None) -> list[str]:
    """Problems with the annotations the operator reads as requests."""
    try:
        fenced_instances(annotations)
    except ValueError as error:
        return [str(error)]
    return []
