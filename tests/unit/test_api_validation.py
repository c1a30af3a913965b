"""The pure validators behind the webhook, and the cron grammar the CRD shares with them."""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal
from typing import Any

import pytest
from lightkube.utils import quantity as lightkube_quantity

from stateward.api import validation
from stateward.api.crd import postgrescluster_crd
from stateward.api.v1alpha1 import VERSION_PATTERN
from stateward.api.validation import (
    CRON_FIELDS,
    CRON_REGEX,
    MANAGED_PARAMETERS,
    VERSION_REGEX,
    parse_quantity,
    validate_cron,
    validate_spec,
)
from stateward.specs.postgres import config as config_spec
from stateward_local.services import provisioner as prov
from tests.support import clusters

pytestmark = pytest.mark.unit

CRON = re.compile(CRON_REGEX)


def spec(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"version": "16", "replicas": 3, "storageSize": "1Gi"}
    base.update(fields)
    return base


# --- cron --------------------------------------------------------------------------------

VALID_CRONS = [
    "0 3 * * *",
    "* * * * *",
    "*/5 * * * *",
    "0 */2 * * *",
    "0-59/15 * * * *",
    "5,35 * * * *",
    "0 8-18 * * MON-FRI",
    "0 8-18/2 * * mon-fri",
    "0 0 1 * *",
    "0 0 1 1 *",
    "0 0 1 JAN *",
    "0 0 1 jan,Jul *",
    "0 0 1 JAN-DEC/3 *",
    "0 0 * * SUN",
    "0 0 * * 0",
    "0 0 * * 6",
    "0 0 * * SUN-SAT",
    "0 0 * * 0,6",
    "59 23 31 12 6",
    "00 03 01 01 00",
    "0 0 29 2 *",  # fires in leap years
    "0 0 31 * *",
    "0 0 31 1-12 *",
    "0 0 30 2 1",  # day-of-week is restricted too: runs on Mondays in February
    "0 0 31 4,6,9,11 MON",
    "0 0 31 2 */2",  # "*/2" is not "*": OR semantics, runs on Sun/Tue/Thu/Sat
    "0  3  *  *  *",  # several spaces between fields
    "*/59 */23 */31 */12 */6",
    "1-5,10-15/5,*/30 * * * *",
]


@pytest.mark.parametrize("expr", VALID_CRONS)
def test_valid_cron(expr: str) -> None:
    assert validate_cron(expr) == []
    assert CRON.search(expr), "the CRD's CEL regex must accept it too"


INVALID_CRONS = [
    # (expression, part of the one message expected)
    ("61 * * * *", "minute: 61 is out of range 0-59"),
    ("60 * * * *", "minute: 60 is out of range 0-59"),
    ("0 24 * * *", "hour: 24 is out of range 0-23"),
    ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
    ("0 0 32 * *", "day-of-month: 32 is out of range 1-31"),
    ("0 0 * 0 *", "month: 0 is out of range 1-12"),
    ("0 0 * 13 *", "month: 13 is out of range 1-12"),
    ("0 0 * * 7", "day-of-week: 7 is out of range 0-6 (Sunday is 0 or SUN)"),
    ("0 0 * * 8", "day-of-week: 8 is out of range 0-6"),
    ("0 0 * JANUARY *", 'month: "JANUARY" is not a number 1-12 or a name JAN-DEC'),
    ("0 0 * * FOO", 'day-of-week: "FOO" is not a number 0-6 or a name SUN-SAT'),
    ("0 0 * * MON-SUNDAY", 'day-of-week: "SUNDAY" is not'),
    ("000 * * * *", 'minute: "000" is not a number 0-59'),
    ("-1 * * * *", 'minute: "" is not a number 0-59'),
    ("*/0 * * * *", 'minute: step "0" in "*/0" must be a number 1-59'),
    ("*/60 * * * *", 'minute: step "60" in "*/60" must be a number 1-59'),
    ("0 */24 * * *", 'hour: step "24" in "*/24" must be a number 1-23'),
    ("0 0 * * */7", 'day-of-week: step "7" in "*/7" must be a number 1-6'),
    ("0 0 * * 1-5/x", 'day-of-week: step "x" in "1-5/x" must be a number 1-6'),
    ("5/15 * * * *", 'minute: "5/15" has a step but no range; write "*/15" or "5-59/15"'),
    ("1/2/3 * * * *", 'minute: "1/2/3" has more than one "/"'),
    ("1-2-3 * * * *", 'minute: "2-3" is not a number 0-59'),
    ("1,,2 * * * *", 'minute: empty list element in "1,,2"'),
    ("1, * * * *", 'minute: empty list element in "1,"'),
    ("0 20-10 * * *", 'hour: range "20-10" is reversed (20 > 10)'),
    ("0 0 * * FRI-MON", 'day-of-week: range "FRI-MON" is reversed (5 > 1)'),
    ("0 0 * DEC-JAN *", 'month: range "DEC-JAN" is reversed (12 > 1)'),
    ("0 0 ? * *", 'day-of-month: "?" is not supported; use "*"'),
    ("0 0 L * *", 'day-of-month: "L" is not a number 1-31'),
    ("* * *", "must be a 5-field cron expression (minute hour day-of-month month day-of-week)"),
    ("* * *", "got 3 fields"),
    ("* * * * * *", "got 6 fields"),
    ("0", "got 1 field"),
    ("@every 5m", 'descriptors such as "@daily" or "@every 5m" are not supported'),
    ("@daily", "descriptors"),
    ("TZ=UTC 0 3 * * *", "time-zone prefixes are not supported"),
    ("CRON_TZ=UTC 0 3 * * *", "time-zone prefixes are not supported"),
    ("", "must not be empty"),
    ("   ", "must not be empty"),
    (" 0 3 * * *", "must not start or end with a space"),
    ("0 3 * * * ", "must not start or end with a space"),
    ("0\t3 * * *", "must not contain tabs or line breaks"),
    ("0 3 * * *\n", "must not contain tabs or line breaks"),
    ("0 0 30 2 *", "never fires: day-of-month 30 does not occur in February"),
    ("0 0 31 2 *", "never fires: day-of-month 31 does not occur in February"),
    ("0 0 30,31 FEB *", "never fires: days-of-month 30, 31 do not occur in February"),
    (
        "0 0 31 4,6,9,11 *",
        "never fires: day-of-month 31 does not occur in April, June, September or November",
    ),
    ("0 0 31 APR-JUN/2 *", "day-of-month 31 does not occur in April or June"),
    ("0 0 31 2 */1", "never fires"),  # "*/1" is "*"
    ("0 0 31 2 1-5,*", "never fires"),  # a list containing "*" is "*"
]


@pytest.mark.parametrize(("expr", "message"), INVALID_CRONS)
def test_invalid_cron(expr: str, message: str) -> None:
    errors = validate_cron(expr)
    assert errors, f"{expr!r} must be refused"
    assert any(message in e for e in errors), errors


def test_cron_reports_every_bad_field() -> None:
    errors = validate_cron("61 24 32 13 7")
    assert [e.split(":")[0] for e in errors] == [
        "minute",
        "hour",
        "day-of-month",
        "month",
        "day-of-week",
    ]


def test_cron_refuses_non_strings() -> None:
    assert validate_cron(5) == ['must be a string, e.g. "0 3 * * *"']  # type: ignore[arg-type]


def _semantic(message: str) -> bool:
    """Errors only validate_cron can find; the regex (and so CEL) lets them through."""
    return message.startswith("never fires") or "is reversed" in message


FIELD_TOKENS = [
    ["*", "*/5", "*/59", "*/60", "0", "00", "07", "59", "60", "0-59", "10-40/15", "45-15"],
    ["*", "*/23", "*/24", "0", "09", "23", "24", "8-18/2", "18-8", "1,13"],
    ["*", "*/31", "*/32", "0", "1", "01", "29", "30", "31", "32", "15-31/5", "31-1", "?"],
    ["*", "*/12", "*/13", "0", "2", "02", "12", "13", "JAN", "feb", "DEC-JAN", "4,6,9,11"],
    ["*", "*/6", "*/7", "0", "6", "7", "SUN", "sat", "Mon-Fri", "MON-FRI/2", "FRI-MON"],
]
ODD_TOKENS = ["", "5/15", "1,,2", "1-2-3", "a", "-1", "1-", "/5", "**", "@", "L", "1/2/3"]


def _cron_corpus() -> list[str]:
    rng = random.Random(20240601)
    corpus = [" ".join(c) for c in itertools.islice(itertools.product(*FIELD_TOKENS), 0, None, 97)]
    for _ in range(3000):
        fields = [
            rng.choice(tokens) if rng.random() < 0.9 else rng.choice(ODD_TOKENS)
            for tokens in FIELD_TOKENS
        ]
        if rng.random() < 0.05:
            fields = fields[: rng.choice([3, 4])] if rng.random() < 0.5 else [*fields, "*"]
        corpus.append(" ".join(fields))
    return corpus


def test_cel_regex_and_validator_agree() -> None:
    """The regex (evaluated by CEL at admission) and validate_cron accept the same grammar:
    whatever the regex refuses, validate_cron refuses with a message; whatever the regex
    accepts, validate_cron accepts or refuses only for reasons a regex cannot see."""
    corpus = _cron_corpus()
    accepted = 0
    for expr in corpus:
        errors = validate_cron(expr)
        if CRON.search(expr):
            assert all(_semantic(e) for e in errors), (expr, errors)
            accepted += not errors
        else:
            assert errors, expr
            assert not all(_semantic(e) for e in errors), (expr, errors)
    assert accepted > 100  # the corpus exercises both sides


def _cel_schedule_regex() -> re.Pattern[str]:
    """The regex as the CRD carries it: ``self.matches('...')`` on spec.backupSchedule."""
    schema = postgrescluster_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["backupSchedule"]
    (rule,) = (r["rule"] for r in field["x-kubernetes-validations"])
    match = re.fullmatch(r"self\.matches\('(.*)'\)", rule)
    assert match, rule
    return re.compile(match[1])


SCHEDULE_TABLE = [
    # (schedule, accepted) - what is accepted today; the two checks must keep agreeing
    ("0 3 * * *", True),
    ("*/15 * * * *", True),
    ("0 8-18/2 * * mon-fri", True),
    ("0 0 1 JAN-DEC/3 *", True),
    ("00 03 01 01 00", True),
    ("1-5,10-15/5,*/30 * * * *", True),
    ("0  3  *  *  *", True),
    ("61 * * * *", False),
    ("0 24 * * *", False),
    ("0 0 * * 7", False),
    ("*/0 * * * *", False),
    ("5/15 * * * *", False),
    ("1,,2 * * * *", False),
    ("* * *", False),
    ("* * * * * *", False),
    ("@every 5m", False),
    ("@daily", False),
    ("TZ=UTC 0 3 * * *", False),
    ("0 0 ? * *", False),
    (" 0 3 * * *", False),
    ("0\t3 * * *", False),
    ("0 3 * * *\n", False),
]


@pytest.mark.parametrize(("expr", "accepted"), SCHEDULE_TABLE)
def test_the_crds_cel_regex_and_validate_cron_agree(expr: str, accepted: bool) -> None:
    assert bool(_cel_schedule_regex().fullmatch(expr)) == accepted
    assert (validate_cron(expr) == []) == accepted


@pytest.mark.parametrize("field", CRON_FIELDS, ids=lambda f: f.name)
def test_validate_cron_parses_with_the_cel_fields_own_pattern(field: Any) -> None:
    """The pattern validate_cron parses a list element with is the CEL regex's element
    pattern with named groups: both come from one builder, and match the same strings."""
    plain = field.item_regex()
    assert f"(?:{plain}(?:,{plain})*)" in CRON_REGEX
    named = re.compile(field.item_regex(capture=True))
    tokens = [*itertools.chain.from_iterable(FIELD_TOKENS), *ODD_TOKENS, "1-2/3", "Jan-mar/2"]
    for token in tokens:
        assert bool(named.fullmatch(token)) == bool(re.fullmatch(plain, token)), token


def test_cron_regex_uses_the_re2_python_common_subset() -> None:
    # No escapes, lookarounds, backreferences, possessive or lazy quantifiers, named groups:
    # the same text means the same in RE2 (CEL's matches()) and in Python's re. No single
    # quotes: it sits in a CEL single-quoted string.
    for regex in (CRON_REGEX, VERSION_REGEX):
        assert "\\" not in regex
        assert "'" not in regex
        assert not re.search(r"\(\?[=!<P]", regex)
        assert not re.search(r"[*+?}][+?]", regex.replace("(?:", "(").replace("(?i:", "("))
        assert regex.startswith("^")
        assert regex.endswith("$")


@pytest.mark.parametrize("field", CRON_FIELDS, ids=lambda f: f.name)
def test_cron_field_number_regex_is_exact(field: Any) -> None:
    """Every string of digits: the field's value regex matches it iff it is a one- or
    two-digit number in the field's range."""
    value = re.compile(field.value_regex())
    step = re.compile(field.step_regex())
    for digits in range(1, 4):
        for number in itertools.product("0123456789", repeat=digits):
            text = "".join(number)
            in_range = digits <= 2 and field.low <= int(text) <= field.high
            assert bool(value.fullmatch(text)) == in_range, text
            assert bool(step.fullmatch(text)) == (digits <= 2 and 1 <= int(text) <= field.high)


def test_cron_field_names_are_case_insensitive() -> None:
    month = re.compile(CRON_FIELDS[3].value_regex())
    assert all(month.fullmatch(n) for n in ("JAN", "jan", "Jan", "dEc"))
    assert not month.fullmatch("JANUARY")
    weekday = re.compile(CRON_FIELDS[4].value_regex())
    assert all(weekday.fullmatch(n) for n in ("SUN", "sat", "Mon"))
    assert not weekday.fullmatch("SUNDAY")


# --- versions ----------------------------------------------------------------------------


def test_version_regex_agrees_with_the_model_pattern() -> None:
    samples = [f"{major}{minor}" for major in range(0, 25) for minor in ("", ".0", ".4", ".10")]
    samples += ["16.", "16.123", "v16", "16.4.1", "016", "1 6", "", "16 "]
    for sample in samples:
        assert bool(re.search(VERSION_REGEX, sample)) == bool(re.search(VERSION_PATTERN, sample))


# --- quantities --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", Decimal(2**30)),
        ("1024Mi", Decimal(2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),
        ("10G", Decimal(10**10)),
        ("500m", Decimal("0.5")),
        ("1e3", Decimal(1000)),
        ("1E", Decimal(10**18)),
        ("+1k", Decimal(1000)),
        ("-1Ki", Decimal(-1024)),
        (".5", Decimal("0.5")),
        ("0", Decimal(0)),
    ],
)
def test_parse_quantity(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text", ["", "Gi", "1GB", "1gi", "1K", "1 Gi", " 1Gi", "1e", "1.2.3", "ten"]
)
def test_parse_quantity_refuses(text: str) -> None:
    assert parse_quantity(text) is None


def test_parse_quantity_is_lightkubes_with_none_for_invalid() -> None:
    """One quantity grammar, lightkube's (also where it departs from Kubernetes': no "u" or
    "E3"), for the webhook, the drift check and volume expansion alike."""
    for text in ["1Gi", "1024Mi", "0.5", "100u", "1E3", "1Zi", "1e3Gi", "1GB", "", "1 Gi"]:
        try:
            expected = lightkube_quantity.parse_quantity(text)
        except ValueError:
            expected = None
        assert parse_quantity(text) == expected, text
        assert prov.parse_quantity(text) == expected, text
    assert parse_quantity(None) is None  # JSON may hold anything
    assert parse_quantity(5) is None


def test_a_quantity_compares_by_value_across_spellings() -> None:
    assert parse_quantity("1024Mi") == parse_quantity("1Gi") == parse_quantity("1073741824")
    assert parse_quantity("1000m") == parse_quantity("1")
    assert parse_quantity("2Gi") > parse_quantity("2G")  # type: ignore[operator]


# --- parameters --------------------------------------------------------------------------


def test_managed_parameters() -> None:
    assert len(set(MANAGED_PARAMETERS)) == len(MANAGED_PARAMETERS)
    assert all(p == p.lower() for p in MANAGED_PARAMETERS)
    for required in (
        "listen_addresses",
        "port",
        "wal_level",
        "hot_standby",
        "archive_mode",
        "archive_command",
        "restore_command",
        "primary_conninfo",
        "primary_slot_name",
        "synchronous_standby_names",
        "data_directory",
        "hba_file",
        "ident_file",
        "unix_socket_directories",
    ):
        assert required in MANAGED_PARAMETERS
    # tuning users need stays theirs
    for allowed in ("max_connections", "shared_buffers", "work_mem", "shared_preload_libraries"):
        assert allowed not in MANAGED_PARAMETERS


@pytest.mark.parametrize("key", ["port", "PORT", "Wal_Level", "archive_command"])
def test_managed_parameters_are_refused_in_any_case(key: str) -> None:
    errors = validate_spec(spec(postgresql={"parameters": {"max_connections": "200", key: "x"}}))
    assert len(errors) == 1
    assert errors[0].startswith(f'spec.postgresql.parameters["{key}"]: the operator manages ')
    assert key.lower() in errors[0]


def test_every_parameter_the_instance_overrides_is_refused_at_admission() -> None:
    """A parameter the instance configuration would silently override must be refused when
    the user sets it, not admitted and then ignored (these sets are the one definition)."""

    overridden = set(config_spec.OPERATOR_PARAMETERS) | set(config_spec.PATRONI_OWNED_PARAMETERS)
    assert overridden <= set(MANAGED_PARAMETERS)
    for name in sorted(overridden):
        errors = validate_spec(spec(postgresql={"parameters": {name: "1"}}))
        assert len(errors) == 1 and "the operator manages" in errors[0], name


@pytest.mark.parametrize(
    "name", ["max_wal_senders", "wal_keep_size", "max_replication_slots", "password_encryption"]
)
def test_parameters_the_operator_sets_are_refused(name: str) -> None:
    errors = validate_spec(spec(postgresql={"parameters": {name: "1"}}))
    assert errors == [
        f'spec.postgresql.parameters["{name}"]: the operator manages {name} and it cannot be'
        f" set here (managed parameters: {', '.join(MANAGED_PARAMETERS)})"
    ]


def test_parameter_names_and_values() -> None:
    errors = validate_spec(
        spec(
            postgresql={
                "parameters": {
                    "pg_stat_statements.max": "1000",
                    "bad name": "1",
                    "work_mem": 64,
                }
            }
        )
    )
    assert errors == [
        'spec.postgresql.parameters["bad name"]: must be a PostgreSQL parameter name: letters,'
        " digits and underscores, starting with a letter or underscore, with at most one dot"
        " for an extension's parameter (max_connections, pg_stat_statements.max)",
        'spec.postgresql.parameters["work_mem"]: must be a string (got 64)',
    ]


def test_allowed_parameters_pass() -> None:
    params = {"max_connections": "200", "shared_buffers": "1GB", "pg_stat_statements.max": "5"}
    assert validate_spec(spec(postgresql={"parameters": params})) == []


# --- the spec ----------------------------------------------------------------------------


def test_valid_spec() -> None:
    assert validate_spec(spec(backupSchedule="0 3 * * *", backup=clusters.BACKUP)) == []
    full = spec(
        version="17.2",
        replicas=16,
        storageSize="100Gi",
        storageClassName="fast-ssd",
        backupSchedule="*/30 * * * *",
        backup={
            "repository": {
                "s3": {
                    "endpoint": "minio.storage.svc:9000",
                    "bucket": "db.backups",
                    "region": "eu-west-1",
                    "path": "/prod/orders",
                    "credentialsSecret": "s3",
                    "caKey": "ca.crt",
                    "uriStyle": "Host",
                }
            },
            "retention": {"full": 4},
        },
        image="registry.example/pg:17",
        resources={"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        postgresql={"parameters": {"max_connections": "200"}},
        deletionPolicy={"finalBackup": False, "persistentVolumeClaims": "Retain"},
    )
    assert validate_spec(full) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"version": "12"}, "spec.version: must be a supported PostgreSQL major version (13, "),
        ({"version": "19"}, "14, 15, 16, 17 or 18), optionally with a minor version"),
        ({"version": 16}, "spec.version: must be a supported"),
        ({"version": "16.x"}, '(got "16.x")'),
        ({"replicas": 0}, "spec.replicas: must be between 1 and 16 (got 0)"),
        ({"replicas": 17}, "spec.replicas: must be between 1 and 16 (got 17)"),
        ({"replicas": "3"}, 'spec.replicas: must be an integer (got "3")'),
        ({"replicas": True}, "spec.replicas: must be an integer (got true)"),
        ({"storageSize": "1GB"}, "spec.storageSize: must be a positive Kubernetes quantity such"),
        ({"storageSize": "0"}, "spec.storageSize: must be a positive"),
        ({"storageSize": "-1Gi"}, "spec.storageSize: must be a positive"),
        ({"storageClassName": "Fast_SSD"}, "spec.storageClassName: must be a StorageClass name"),
        (
            {"backupSchedule": "61 * * * *", "backup": clusters.BACKUP},
            "spec.backupSchedule: minute: 61 is out of range",
        ),
        (
            {"backupSchedule": "* * *", "backup": clusters.BACKUP},
            "spec.backupSchedule: must be a 5-field cron expression",
        ),
        (
            {"backupSchedule": "0 0 30 2 *", "backup": clusters.BACKUP},
            "spec.backupSchedule: never fires",
        ),
        (
            {"backupSchedule": "0 3 * * *"},
            "spec.backupSchedule: needs a repository to write to: set spec.backup.repository",
        ),
        (
            {"deletionPolicy": {"finalBackup": True}},
            "spec.deletionPolicy.finalBackup: needs a repository to write to: set"
            " spec.backup.repository, or set finalBackup to false",
        ),
        ({"backup": {}}, "spec.backup.repository: is required"),
        (
            {"bootstrap": {"restore": {"cluster": "orders"}}},
            "spec.bootstrap.restore: needs spec.backup.repository",
        ),
        (
            {
                "backup": clusters.BACKUP,
                "bootstrap": {
                    "restore": {
                        "cluster": "orders",
                        "targetTime": "2026-12-02T10:15:00Z",
                        "restorePoint": "rp",
                    }
                },
            },
            "spec.bootstrap.restore: takes targetTime or restorePoint, not both",
        ),
        (
            {
                "backup": clusters.BACKUP,
                "bootstrap": {"restore": {"cluster": "orders", "targetTime": "yesterday"}},
            },
            "spec.bootstrap.restore.targetTime: ",
        ),
        (
            {"backup": clusters.BACKUP, "bootstrap": {"restore": {"cluster": "Orders"}}},
            "spec.bootstrap.restore.cluster: ",
        ),
        ({"backup": {"repository": {}}}, "spec.backup.repository.s3: is required"),
        (
            {"backup": {"repository": {"s3": {"endpoint": "s3.example.com", "bucket": "bkp"}}}},
            "spec.backup.repository.s3.credentialsSecret: is required",
        ),
        (
            {"backup": {"repository": {"s3": {**clusters.REPOSITORY["s3"], "bucket": "B"}}}},
            "spec.backup.repository.s3.bucket: ",
        ),
        (
            {
                "backup": {
                    "repository": {
                        "s3": {**clusters.REPOSITORY["s3"], "endpoint": "https://s3.example.com"}
                    }
                }
            },
            "spec.backup.repository.s3.endpoint: ",
        ),
        (
            {"backup": {"repository": {"s3": {**clusters.REPOSITORY["s3"], "path": "relative"}}}},
            "spec.backup.repository.s3.path: ",
        ),
        (
            {"backup": {**clusters.BACKUP, "retention": {"full": 0}}},
            "spec.backup.retention.full: ",
        ),
        (
            {"resources": {"requests": {"cpu": "lots"}}},
            'spec.resources.requests.cpu: must be a Kubernetes quantity such as "500m" or "1Gi"',
        ),
        ({"deletionPolicy": {"persistentVolumeClaims": "Keep"}}, "spec.deletionPolicy."),
        ({"deletionPolicy": {"finalBackup": "maybe"}}, "spec.deletionPolicy.finalBackup: "),
        ({"storageSise": "1Gi"}, "spec.storageSise: unknown field"),
        ({"image": 5}, "spec.image: "),
    ],
)
def test_invalid_spec(fields: dict[str, Any], message: str) -> None:
    errors = validate_spec(spec(**fields))
    assert len(errors) == 1, errors
    assert message in errors[0]


def test_missing_required_fields() -> None:
    assert validate_spec({}) == [
        "spec.version: is required",
        "spec.replicas: is required",
        "spec.storageSize: is required",
    ]


def test_not_an_object() -> None:
    assert validate_spec([]) == ["spec: must be an object"]  # type: ignore[arg-type]


def test_every_message_starts_with_the_field_path() -> None:
    errors = validate_spec(
        {
            "version": "9",
            "replicas": -1,
            "storageSize": "big",
            "storageClassName": "X",
            "backupSchedule": "@hourly",
            "postgresql": {"parameters": {"port": "1"}},
            "resources": {"limits": {"memory": "2GB"}},
            "deletionPolicy": {"finalBackup": "no"},
            "extra": 1,
        },
        {"version": "16", "replicas": 1, "storageSize": "1Gi"},
    )
    assert len(errors) >= 9
    assert all(re.match(r"spec(\.[A-Za-z]+|\[\"[^\"]+\"\])+: ", e) for e in errors), errors


# --- updates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ({"storageSize": "2Gi"}, {"storageSize": "1Gi"}, "may grow but never shrink (from 2Gi"),
        ({"storageSize": "1Gi"}, {"storageSize": "1000Mi"}, "spec.storageSize: may grow but"),
        ({}, {"storageClassName": "fast"}, 'it cannot be set after creation (to "fast")'),
        ({"storageClassName": "fast"}, {}, 'it cannot be removed after creation (was "fast")'),
        (
            {"storageClassName": "fast"},
            {"storageClassName": "slow"},
            'spec.storageClassName: is immutable: it cannot change from "fast" to "slow"',
        ),
    ],
)
def test_refused_updates(old: dict[str, Any], new: dict[str, Any], message: str) -> None:
    errors = validate_spec(spec(**new), spec(**old))
    assert len(errors) == 1, errors
    assert message in errors[0]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"storageSize": "1Gi"}, {"storageSize": "2Gi"}),
        ({"storageSize": "1Gi"}, {"storageSize": "1024Mi"}),  # equal, other unit
        ({"storageSize": "not-a-quantity"}, {"storageSize": "1Gi"}),  # a bad old value
        ({"version": "16.4"}, {"version": "16.1"}),  # minor versions may go back
        ({"version": "16"}, {"version": "16.5"}),
        ({"version": "garbage"}, {"version": "15"}),
        ({"version": "15"}, {"version": "17"}),  # an in-place upgrade
        ({"version": "17"}, {"version": "15"}),  # back after a refused one: the CRD's rule decides
        ({"storageClassName": "fast"}, {"storageClassName": "fast"}),
        ({}, {}),
        ({"backupSchedule": "0 3 * * *"}, {}),
    ],
)
def test_allowed_updates(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert validate_spec(spec(**new), spec(**old)) == []


@pytest.mark.parametrize(
    ("value", "fenced"),
    [
        (None, []),
        ("", []),
        ("[]", []),
        ('["pg-1"]', ["pg-1"]),
        ('["pg-1", "pg-0", "pg-1"]', ["pg-0", "pg-1"]),
        ('["*"]', ["*"]),
    ],
)
def test_the_fencing_annotation_names_pods_or_all(value: str | None, fenced: list[str]) -> None:
    annotations = {} if value is None else {"stateward.io/fenced-instances": value}
    assert validation.fenced_instances(annotations) == fenced
    assert validation.validate_annotations(annotations) == []


@pytest.mark.parametrize("value", ["pg-1", '"pg-1"', '{"pg-1": 1}', "[1]", '["PG_1"]', "[", '[""]'])
def test_an_unreadable_fencing_annotation_is_refused_naming_it_and_the_form(value: str) -> None:
    (problem,) = validation.validate_annotations({"stateward.io/fenced-instances": value})
    assert problem.startswith('metadata.annotations["stateward.io/fenced-instances"]: must be')
    assert '["*"]' in problem
