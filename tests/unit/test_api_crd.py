"""The CRD generated from the pydantic models: structural, complete, and committed."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest
import yaml
from pydantic import Field

from stateward.api import v1alpha1
from stateward.api.crd import (
    POSTGRESCLUSTER_EXTRAS,
    SchemaError,
    apply_extras,
    crd_for,
    postgrescluster_crd,
    structural_schema,
)
from stateward.api.manifests import HEADER, SAMPLE_PATH, crd_path, main, render, sample_yaml
from stateward.api.validation import (
    CRON_REGEX,
    MANAGED_PARAMETERS,
    VERSION_REGEX,
    validate_cron,
    validate_spec,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "config/crd/bases/stateward.io_postgresclusters.yaml"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return postgrescluster_crd()


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return result


def at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from nodes(node["additionalProperties"], f"{path}{{}}")


def rules(node: dict[str, Any]) -> list[dict[str, str]]:
    return list(node.get("x-kubernetes-validations", []))


def rule_containing(node: dict[str, Any], text: str) -> dict[str, str]:
    found = [r for r in rules(node) if text in r["rule"]]
    assert len(found) == 1, (text, rules(node))
    return found[0]


# --- the resource ------------------------------------------------------------------------


def test_names_scope_version(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"] == {"name": "postgresclusters.stateward.io"}
    spec = crd["spec"]
    assert spec["group"] == "stateward.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "PostgresCluster",
        "listKind": "PostgresClusterList",
        "plural": "postgresclusters",
        "singular": "postgrescluster",
        "shortNames": ["pgc"],
        "categories": ["stateward"],
    }
    [version] = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["served"] is True
    assert version["storage"] is True
    assert version["subresources"] == {"status": {}}


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == [
        ("Version", "string", ".spec.version"),
        ("Replicas", "integer", ".spec.replicas"),
        ("Ready", "integer", ".status.readyReplicas"),
        ("Phase", "string", ".status.phase"),
        ("Primary", "string", ".status.primaryPod"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]


# --- structural schema -------------------------------------------------------------------


def test_no_json_schema_leftovers(schema: dict[str, Any]) -> None:
    text = yaml.safe_dump(schema)
    for word in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "uniqueItems", "const"):
        assert word not in text


def test_every_node_is_typed(schema: dict[str, Any]) -> None:
    for path, node in nodes(schema):
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, (
            path
        )
        if node["type"] == "array":
            assert "items" in node, path


def test_properties_never_next_to_additional_properties(schema: dict[str, Any]) -> None:
    for path, node in nodes(schema):
        assert not ("properties" in node and "additionalProperties" in node), path
        assert node.get("additionalProperties") is not False, path


def test_no_null_anywhere(schema: dict[str, Any]) -> None:
    for path, node in nodes(schema):
        assert "nullable" not in node, path  # our optional fields all default to None
        assert node.get("default", "") is not None, path


def test_root(schema: dict[str, Any]) -> None:
    assert schema["type"] == "object"
    assert schema["required"] == ["spec"]
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert schema["properties"]["apiVersion"]["type"] == "string"
    assert schema["properties"]["kind"]["type"] == "string"
    assert "default" not in schema["properties"]["apiVersion"]
    assert schema["description"] == "A primary-replica PostgreSQL cluster managed by Stateward."


def test_spec_fields(schema: dict[str, Any]) -> None:
    spec = at(schema, "spec")
    assert spec["required"] == ["version", "replicas", "storageSize"]
    assert set(spec["properties"]) == {
        v1alpha1.PostgresClusterSpec.model_fields[name].alias or name
        for name in v1alpha1.PostgresClusterSpec.model_fields
    }
    replicas = at(schema, "spec.replicas")
    assert replicas["type"] == "integer"
    assert (replicas["minimum"], replicas["maximum"]) == (1, v1alpha1.MAX_REPLICAS)
    version = at(schema, "spec.version")
    assert version["pattern"] == v1alpha1.VERSION_PATTERN
    assert version["maxLength"] == 5
    assert at(schema, "spec.storageSize")["maxLength"] == 32
    assert at(schema, "spec.storageClassName") == {
        "type": "string",
        "maxLength": 253,
        "description": "StorageClass of the data volumes; the cluster's default when unset. "
        "Immutable.",
    }
    assert at(schema, "spec.backupSchedule")["maxLength"] == 100


def test_descriptions_come_from_docstrings(schema: dict[str, Any]) -> None:
    storage = at(schema, "spec.storageSize")["description"]
    assert storage == (
        'Size of each instance\'s data volume, a Kubernetes quantity such as "10Gi". It may '
        "grow (volumes are expanded in place) but never shrink."
    )
    assert at(schema, "spec")["description"] == "The desired state of a PostgreSQL cluster."
    assert at(schema, "spec.postgresql")["description"] == "PostgreSQL server settings."
    assert at(schema, "spec.deletionPolicy")["description"] == "What deletion does with the data."
    assert at(schema, "status.primaryPod")["description"] == (
        "The pod that currently runs the primary."
    )


def test_string_maps(schema: dict[str, Any]) -> None:
    for path in ("spec.postgresql.parameters", "spec.resources.requests", "spec.resources.limits"):
        node = at(schema, path)
        assert node["type"] == "object"
        assert node["additionalProperties"] == {"type": "string"}
        assert "properties" not in node


def test_enums(schema: dict[str, Any]) -> None:
    assert at(schema, "spec.deletionPolicy.persistentVolumeClaims")["enum"] == [
        "Delete",
        "Retain",
    ]
    assert at(schema, "status.phase") == {
        "type": "string",
        "enum": [p.value for p in v1alpha1.Phase],
        "description": "Creating, Ready, Updating, Failing or Deleting.",
    }
    assert at(schema, "status.conditions.[].status")["enum"] == ["True", "False", "Unknown"]


def test_spec_defaults_are_kept_so_users_see_them(schema: dict[str, Any]) -> None:
    policy = at(schema, "spec.deletionPolicy")
    # {} makes the API server fill in the children's defaults when the user omits it
    assert policy["default"] == {}
    # Unset means "when there is a repository": no default to show.
    assert "default" not in policy["properties"]["finalBackup"]
    assert policy["properties"]["persistentVolumeClaims"]["default"] == "Delete"
    for path in ("spec.resources", "spec.postgresql", "spec.storageClassName", "spec.image"):
        assert "default" not in at(schema, path), path


def test_no_defaults_under_status(schema: dict[str, Any]) -> None:
    for path, node in nodes(at(schema, "status"), "status"):
        assert "default" not in node, path


def test_status_is_complete(schema: dict[str, Any]) -> None:
    status = at(schema, "status")
    assert set(status["properties"]) == {
        "phase",
        "primaryPod",
        "replicaPods",
        "readyReplicas",
        "conditions",
        "lastBackupTime",
        "backups",
        "onDemandBackup",
        "observedGeneration",
        "finalBackupAttempts",
        "pendingRestart",
        "instances",
        "switchover",
        "lastFailover",
        "rollingRestart",
        "pooler",
        "version",
        "upgrade",
    }
    assert "required" not in status
    condition = at(schema, "status.conditions.[]")
    assert condition["required"] == ["type", "status", "reason", "lastTransitionTime"]
    assert at(schema, "status.conditions.[].observedGeneration") == {"type": "integer"}


def test_list_types(schema: dict[str, Any]) -> None:
    conditions = at(schema, "status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    # map keys must be required (or defaulted) in the items
    assert "type" in conditions["items"]["required"]
    assert at(schema, "status.replicaPods")["x-kubernetes-list-type"] == "atomic"


# --- CEL rules ---------------------------------------------------------------------------


def test_every_rule_has_a_message_naming_its_field(schema: dict[str, Any]) -> None:
    found = 0
    for path, node in nodes(schema):
        for rule in rules(node):
            found += 1
            field = (path.lstrip(".") + rule.get("fieldPath", "")).lstrip(".")
            assert rule["message"].startswith(field + " "), (field, rule["message"])
            if "messageExpression" in rule:
                assert rule["messageExpression"].startswith(f"'{field} "), rule
            assert rule.get("reason", "FieldValueInvalid") in {
                "FieldValueInvalid",
                "FieldValueForbidden",
                "FieldValueRequired",
            }
    assert found == 16


def test_storage_size_rules(schema: dict[str, Any]) -> None:
    field = rule_containing(at(schema, "spec.storageSize"), "isQuantity(self)")
    assert field["rule"] == "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))"
    shrink = rule_containing(at(schema, "spec"), "compareTo")
    assert shrink["rule"] == (
        "!isQuantity(self.storageSize) || !isQuantity(oldSelf.storageSize) || "
        "quantity(self.storageSize).compareTo(quantity(oldSelf.storageSize)) >= 0"
    )
    assert shrink["fieldPath"] == ".storageSize"
    assert shrink["reason"] == "FieldValueForbidden"
    assert shrink["message"] == "spec.storageSize may grow but never shrink"


def test_storage_class_is_immutable_including_set_and_unset(schema: dict[str, Any]) -> None:
    rule = rule_containing(at(schema, "spec"), "storageClassName")
    assert rule["rule"] == (
        "has(self.storageClassName) == has(oldSelf.storageClassName) && "
        "(!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)"
    )
    assert rule["fieldPath"] == ".storageClassName"
    assert "immutable" in rule["message"]


def test_version_rules(schema: dict[str, Any]) -> None:
    field = rule_containing(at(schema, "spec.version"), "matches")
    assert field["rule"] == f"self.matches('{VERSION_REGEX}')"
    assert "13, 14, 15, 16, 17 or 18" in field["message"]
    # A new major is an in-place upgrade; below the data's (status.version) is refused: a
    # rule on the object, the only place that sees the status.
    assert not [r for r in rules(at(schema, "spec")) if "version.split" in r["rule"]]
    downgrade = rule_containing(schema, "oldSelf.status.version")
    assert downgrade["rule"].endswith(
        "int(self.spec.version.split('.')[0]) >= int(oldSelf.status.version.split('.')[0])"
    )
    # an unrecorded data version, a status update (the spec as it was) and malformed values
    # cannot make it refuse or fail
    for guard in (
        "!has(oldSelf.status) || !has(oldSelf.status.version) || ",
        "self.spec.version == oldSelf.spec.version || ",
        "!self.spec.version.matches(",
        "!oldSelf.status.version.matches(",
    ):
        assert guard in downgrade["rule"], guard
    assert downgrade["fieldPath"] == ".spec.version"
    assert downgrade["reason"] == "FieldValueForbidden"


def test_backup_schedule_rule(schema: dict[str, Any]) -> None:
    rule = rule_containing(at(schema, "spec.backupSchedule"), "matches")
    assert rule["rule"] == f"self.matches('{CRON_REGEX}')"
    assert rule["message"] == (
        "spec.backupSchedule must be a 5-field cron expression (minute hour day-of-month "
        'month day-of-week), e.g. "0 3 * * *"'
    )
    regex = re.compile(re.fullmatch(r"self\.matches\('(.*)'\)", rule["rule"])[1])  # type: ignore[index]
    for good in ("0 3 * * *", "*/15 0-23/2 1,15 JAN-DEC/3 MON-FRI", "59 23 31 12 6"):
        assert regex.search(good), good
    for bad in ("61 * * * *", "* * *", "@every 5m", "0 0 * * 7", "0 24 * * *", "* * * * * *"):
        assert not regex.search(bad), bad


def test_managed_parameters_rule(schema: dict[str, Any]) -> None:
    rule = rule_containing(at(schema, "spec.postgresql.parameters"), "p.lowerAscii() in [")
    listed = re.findall(r"'([a-z_]+)'", rule["rule"].split(" in [")[1])
    assert tuple(listed) == MANAGED_PARAMETERS
    assert rule["message"].startswith("spec.postgresql.parameters must not set parameters")
    assert all(p in rule["message"] for p in MANAGED_PARAMETERS)
    assert ".filter(p, p.lowerAscii() in [" in rule["messageExpression"]


def test_parameter_names_rule_is_the_one_pattern(schema: dict[str, Any]) -> None:
    rule = rule_containing(at(schema, "spec.postgresql.parameters"), "p.matches(")
    assert v1alpha1.PARAMETER_NAME_PATTERN in rule["rule"]
    assert rule["message"].startswith("spec.postgresql.parameters names must each be")


def test_rules_are_cheap_enough(schema: dict[str, Any]) -> None:
    # every string a rule reads is bounded, so the CEL cost estimate stays in budget
    for path in ("spec.version", "spec.storageSize", "spec.backupSchedule"):
        assert at(schema, path)["maxLength"] <= 100, path
    assert at(schema, "spec.storageClassName")["maxLength"] == 253


def test_rules_only_use_kubernetes_cel_functions(schema: dict[str, Any]) -> None:
    known = {
        "self", "oldSelf", "has", "isQuantity", "quantity", "compareTo", "isGreaterThan",
        "matches", "int", "split", "all", "filter", "p", "in", "lowerAscii",
    }  # fmt: skip
    for _, node in nodes(schema):
        for rule in rules(node):
            for expr in (rule["rule"], rule.get("messageExpression", "")):
                without_strings = re.sub(r"'(?:[^'\\]|\\.)*'", "''", expr)
                words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", without_strings))
                fields = {
                    "spec",
                    "status",
                    "storageSize",
                    "storageClassName",
                    "version",
                    "synchronous",
                    "mode",
                    "number",
                    "replicas",
                    "backupSchedule",
                    "backup",
                    "deletionPolicy",
                    "finalBackup",
                    "bootstrap",
                    "restore",
                    "targetTime",
                    "restorePoint",
                }
                assert words - fields <= known, words - fields - known


# --- the converter on other models ------------------------------------------------------


class Color(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


class Inner(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", use_attribute_docstrings=True)

    size: int = 3
    """How big."""


class Toy(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", use_attribute_docstrings=True)

    port: int | str
    tags: set[str] = Field(default_factory=set)
    anything: dict[str, Any] = Field(default_factory=dict)
    mode: Literal["fast"] = "fast"
    ratio: float = Field(default=0.5, gt=0, lt=1)
    color: Color | None = None
    limit: int | None = 5
    inner: Inner = Field(default_factory=Inner)
    inners: list[Inner] = Field(default_factory=list)
    nested: dict[str, Inner] = Field(default_factory=dict)
    """Several
    lines.

    Two paragraphs."""


def test_converter_handles_other_models() -> None:
    schema = structural_schema(Toy)
    props = schema["properties"]
    assert props["port"] == {"x-kubernetes-int-or-string": True}
    assert props["tags"] == {
        "type": "array",
        "items": {"type": "string"},
        "x-kubernetes-list-type": "set",
    }
    assert props["anything"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert props["mode"] == {"type": "string", "enum": ["fast"], "default": "fast"}
    assert props["ratio"] == {
        "type": "number",
        "default": 0.5,
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "exclusiveMaximum": True,
    }
    assert props["color"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["limit"] == {"type": "integer", "default": 5, "nullable": True}
    assert props["inner"]["default"] == {}
    assert props["inner"]["properties"]["size"] == {
        "type": "integer",
        "default": 3,
        "description": "How big.",
    }
    assert "default" not in props["inners"]["items"]
    assert props["nested"]["additionalProperties"]["properties"]["size"]["default"] == 3
    assert props["nested"]["description"] == "Several lines.\n\nTwo paragraphs."
    assert schema["required"] == ["port"]


def test_converter_drops_defaults_where_asked() -> None:
    schema = structural_schema(Toy, no_defaults_under=("inner", "ratio"))
    assert "default" not in schema["properties"]["inner"]
    assert "default" not in schema["properties"]["inner"]["properties"]["size"]
    assert "default" not in schema["properties"]["ratio"]
    assert schema["properties"]["limit"]["default"] == 5


class Tree(pydantic.BaseModel):
    children: list[Tree] = Field(default_factory=list)


class Either(pydantic.BaseModel):
    value: int | bool


def test_converter_refuses_what_is_not_structural() -> None:
    with pytest.raises(SchemaError, match="recursive"):
        structural_schema(Tree)
    with pytest.raises(SchemaError, match="unions"):
        structural_schema(Either)


def test_extras_on_a_missing_path_fail_loudly() -> None:
    schema = structural_schema(Toy)
    with pytest.raises(KeyError, match=r"spec\.nope"):
        apply_extras(schema, {"spec.nope": {"maxLength": 1}})
    apply_extras(schema, {"inners[].size": {"maximum": 9}, "nested{}.size": {"minimum": 1}})
    assert schema["properties"]["inners"]["items"]["properties"]["size"]["maximum"] == 9
    assert (
        schema["properties"]["nested"]["additionalProperties"]["properties"]["size"]["minimum"] == 1
    )


def test_crd_for_is_generic() -> None:
    class ThingSpec(pydantic.BaseModel):
        size: int

    class Thing(pydantic.BaseModel):
        metadata: dict[str, Any] = Field(default_factory=dict)
        spec: ThingSpec

    crd = crd_for(
        Thing, group="x.io", version="v1", kind="Thing", plural="things", singular="thing"
    )
    [version] = crd["spec"]["versions"]
    assert crd["metadata"]["name"] == "things.x.io"
    assert "subresources" not in version  # no status field, no status subresource
    assert version["schema"]["openAPIV3Schema"]["properties"]["metadata"] == {"type": "object"}
    assert "shortNames" not in crd["spec"]["names"]


def test_extras_table_targets_existing_fields() -> None:
    schema = structural_schema(v1alpha1.PostgresCluster)
    apply_extras(schema, POSTGRESCLUSTER_EXTRAS)  # raises KeyError on a stale path


# --- the committed manifests -------------------------------------------------------------


def test_committed_crd_is_not_stale(crd: dict[str, Any]) -> None:
    assert crd_path(crd) == Path("config/crd/bases/stateward.io_postgresclusters.yaml")
    committed = CRD_FILE.read_text(encoding="utf-8")
    assert committed == render(crd), "run `make manifests` and commit the result"
    assert committed.startswith("# generated by make manifests; do not edit")
    assert yaml.safe_load(committed) == crd


def test_check_mode_passes_on_this_checkout() -> None:
    assert main(["--check", "--root", str(REPO)]) == 0


def test_check_mode_reports_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "config/crd/bases/stateward.io_postgresclusters.yaml: missing" in err
    assert "make manifests" in err
    assert not (tmp_path / "config").exists()  # --check writes nothing

    assert main(["--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0
    target = tmp_path / "config/crd/bases/stateward.io_postgresclusters.yaml"
    target.write_text(target.read_text().replace("maxLength: 100", "maxLength: 99"))
    capsys.readouterr()
    assert main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "-                maxLength: 99" in err
    assert "stale: config/crd/bases/stateward.io_postgresclusters.yaml" in err


def test_sample_is_written_only_when_missing(tmp_path: Path) -> None:
    assert main(["--root", str(tmp_path)]) == 0
    sample = tmp_path / SAMPLE_PATH
    assert sample.read_text() == sample_yaml()
    sample.write_text("# mine\n")
    assert main(["--root", str(tmp_path)]) == 0
    assert sample.read_text() == "# mine\n"


def test_render_is_stable(crd: dict[str, Any]) -> None:
    assert render(postgrescluster_crd()) == render(crd)
    assert render(crd).startswith(HEADER + "---\n")


def test_committed_sample_is_valid() -> None:
    sample = yaml.safe_load((REPO / SAMPLE_PATH).read_text())
    assert sample["metadata"]["name"] == "sample"
    assert sample["spec"] == {
        "version": "15",
        "replicas": 3,
        "storageSize": "1Gi",
        "backupSchedule": "0 3 * * *",
        "backup": {
            "repository": {
                "s3": {
                    "endpoint": "stateward-objectstore.kube-system.svc",
                    "bucket": "stateward",
                    "credentialsSecret": "stateward-objectstore",
                    "caKey": "ca.crt",
                }
            }
        },
    }
    cluster = v1alpha1.PostgresCluster.model_validate(sample)
    assert cluster.spec.replicas == 3
    assert validate_spec(sample["spec"]) == []
    assert validate_cron(sample["spec"]["backupSchedule"]) == []


def test_an_optional_object_whose_presence_means_something_is_never_defaulted(
    schema: dict[str, Any],
) -> None:
    """``spec.pooler`` unset means no pooler: a ``default: {}`` would give every cluster one."""
    pooler = at(schema, "spec.pooler")
    assert "default" not in pooler and "nullable" not in pooler
    assert pooler["properties"]["instances"]["default"] == 2
