"""CustomResourceDefinitions generated from the pydantic models (``make manifests``).

:func:`structural_schema` turns any of our pydantic models into a Kubernetes *structural*
OpenAPI v3 schema; :func:`crd_for` wraps a resource model into an
``apiextensions.k8s.io/v1`` CustomResourceDefinition; :func:`postgrescluster_crd` is the
PostgresCluster CRD with its admission rules. Everything here is pure: dicts in, dicts out.

The conversion from pydantic's JSON Schema:

* ``$defs``/``$ref`` are inlined (recursive models are refused: not structural);
* ``anyOf [X, null]`` becomes X. Optional fields without a default simply drop null: the API
  server prunes a null it may not store, so ``storageClassName: null`` means "unset" and
  ``has()`` in CEL stays false. Only a field whose default is not None becomes
  ``nullable: true``;
* ``int | str`` becomes ``x-kubernetes-int-or-string``; other unions are refused;
* every node gets a ``type`` (int-or-string nodes are marked as such instead);
  ``properties`` never sit next to ``additionalProperties`` (``extra="forbid"`` is not
  carried over: see unknown fields below); ``dict[str, X]`` is ``{type: object,
  additionalProperties: X}``; ``dict[str, Any]`` keeps unknown fields;
* titles, examples and pydantic-only keywords are dropped; numeric ``exclusiveMinimum``
  (JSON Schema 2020) becomes OpenAPI v3's boolean form; ``set[...]`` becomes a list of
  ``x-kubernetes-list-type: set`` (``uniqueItems`` is not allowed);
* descriptions come from the models' docstrings (``use_attribute_docstrings``), a field's
  own docstring winning over its type's, with single line breaks joined;
* defaults: scalar and object defaults of the spec are kept, so the API server fills them
  in and users see them (``deletionPolicy.finalBackup: true``); an optional object field
  whose children have defaults and which requires nothing gets ``default: {}``, or its
  children's defaults would only apply when the user writes the parent — unless the field is
  ``X | None = None``, whose presence is its meaning (``spec.pooler``). None defaults are
  dropped, and so is every default under ``status`` (the operator writes status; the API
  server should not invent it). ``metadata`` is ``{type: object}``: the API server owns it.

Unknown fields: a structural schema makes the API server *prune* fields it does not know;
it does not refuse them by itself. What the client sees depends on the request's
``fieldValidation``: ``Strict`` refuses the request with an error naming the field
(``strict decoding error: unknown field "spec.storageSise"``; kubectl's ``--validate``
defaults to strict, so ``kubectl apply/create`` refuse typos), ``Warn`` (the API default,
e.g. for client libraries that do not set it) stores the object without the field and
returns a warning naming it, ``Ignore`` drops it silently. Admission webhooks only ever see
the pruned object, so :func:`~stateward.api.validation.validate_spec` cannot catch them
there. A ``null`` in a non-nullable field is dropped the same way (so ``storageClassName:
null`` means unset).

Admission rules (CEL, ``x-kubernetes-validations``) live next to the schema in
:data:`POSTGRESCLUSTER_EXTRAS`; what CEL cannot say is checked by
:func:`stateward.api.validation.validate_spec` in the validating webhook.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pydantic

from stateward.api import v1alpha1
from stateward.api.validation import (
    CRON_MESSAGE,
    CRON_REGEX,
    MANAGED_PARAMETERS,
    PARAMETER_NAME_MESSAGE,
    VERSION_MESSAGE,
    VERSION_REGEX,
)

__all__ = [
    "POSTGRESCLUSTER_EXTRAS",
    "POSTGRESCLUSTER_PRINTER_COLUMNS",
    "PrinterColumn",
    "Rule",
    "SchemaError",
    "apply_extras",
    "crd_for",
    "crd_schema",
    "postgrescluster_crd",
    "structural_schema",
]

Schema = dict[str, Any]

# Keywords carried over from pydantic's JSON Schema as they are.
_KEPT = (
    "description",
    "type",
    "format",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
)
# Formats the API server knows (k8s.io/kube-openapi/pkg/validation/strfmt); others dropped.
_FORMATS = frozenset(
    {
        "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac",
        "uuid", "uuid3", "uuid4", "uuid5", "isbn", "isbn10", "isbn13", "creditcard", "ssn",
        "hexcolor", "rgbcolor", "byte", "password", "date", "duration", "date-time",
        "datetime", "int32", "int64", "float", "double",
    }
)  # fmt: skip
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean"})


class SchemaError(ValueError):
    """The model cannot be expressed as a structural schema."""


# --- pydantic JSON Schema -> structural schema --------------------------------------------


def _describe(text: str) -> str:
    """Join a docstring's wrapped lines; keep blank-line paragraph breaks."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


class _Converter:
    def __init__(self, defs: Mapping[str, Schema], no_defaults_under: Iterable[str]) -> None:
        self.defs = defs
        self.no_defaults_under = tuple(no_defaults_under)

    def _keeps_defaults(self, path: str) -> bool:
        return not any(
            path == p or path.startswith((p + ".", p + "[")) for p in self.no_defaults_under
        )

    def resolve(self, node: Schema, stack: tuple[str, ...]) -> tuple[Schema, tuple[str, ...]]:
        """Inline a $ref (or a one-element allOf): the referenced schema, overridden by the
        keywords next to the reference (a field's description and default)."""
        while True:
            if "$ref" in node:
                name = node["$ref"].rsplit("/", 1)[-1]
                if name in stack:
                    raise SchemaError(f"recursive model {name} cannot be a structural schema")
                siblings = {k: v for k, v in node.items() if k != "$ref"}
                node = {**self.defs[name], **siblings}
                stack = (*stack, name)
            elif "allOf" in node and len(node["allOf"]) == 1:
                siblings = {k: v for k, v in node.items() if k != "allOf"}
                node = {**node["allOf"][0], **siblings}
            else:
                return node, stack

    def convert(self, node: Schema, path: str, stack: tuple[str, ...] = ()) -> Schema:
        node, stack = self.resolve(node, stack)
        nullable = False
        union = node.get("anyOf", node.get("oneOf"))
        if union is not None:
            siblings = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
            variants = [self.resolve(v, stack) for v in union]
            non_null = [(v, s) for v, s in variants if v.get("type") != "null"]
            has_null = len(non_null) < len(variants)
            types = {v.get("type") for v, _ in non_null}
            if len(non_null) == 1:
                variant, stack = non_null[0]
                node = {**variant, **siblings}
                nullable = has_null and siblings.get("default") is not None
            elif types == {"integer", "string"} and len(non_null) == 2:
                out = self._common(siblings, path)
                out["x-kubernetes-int-or-string"] = True
                if has_null and siblings.get("default") is not None:
                    out["nullable"] = True
                return out
            else:
                raise SchemaError(
                    f"{path}: unions other than X | None and int | str are not structural"
                )
        if "allOf" in node or "not" in node or "prefixItems" in node:
            raise SchemaError(f"{path}: allOf/not/tuples are not supported")

        out = self._common(node, path)
        if nullable:
            out["nullable"] = True
        kind = out.get("type")
        if "const" in node:
            out["enum"] = [node["const"]]
            if kind is None:
                kind = out["type"] = _json_type(node["const"], path)
        if kind is None and "enum" in out:
            kinds = {_json_type(v, path) for v in out["enum"]}
            if len(kinds) != 1:
                raise SchemaError(f"{path}: enum mixes types {sorted(kinds)}")
            kind = out["type"] = kinds.pop()
        if kind == "object":
            self._object(node, out, path, stack)
        elif kind == "array":
            if "items" not in node:
                raise SchemaError(f"{path}: a list needs a typed item")
            out["items"] = self.convert(node["items"], f"{path}[]", stack)
            if out.pop("uniqueItems", False) or node.get("uniqueItems"):
                out["x-kubernetes-list-type"] = "set"
        elif kind not in _TYPES:
            raise SchemaError(f"{path}: no structural type for {node!r} (Any is not allowed)")
        if kind in ("integer", "number"):
            for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
                if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
                    out[plain] = node[bound]
                    out[bound] = True
        return out

    def _common(self, node: Schema, path: str) -> Schema:
        out: Schema = {k: copy.deepcopy(node[k]) for k in _KEPT if k in node}
        if "description" in out:
            out["description"] = _describe(out["description"])
        if out.get("format") not in _FORMATS:
            out.pop("format", None)
        if out.get("required") == []:
            del out["required"]
        default = node.get("default")
        if default is not None and self._keeps_defaults(path):
            out["default"] = copy.deepcopy(default)
        return out

    def _object(self, node: Schema, out: Schema, path: str, stack: tuple[str, ...]) -> None:
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if properties:
            out["properties"] = {
                name: self.convert(prop, f"{path}.{name}" if path else name, stack)
                for name, prop in properties.items()
            }
            required = set(out.get("required", ()))
            for name, prop in out["properties"].items():
                if (
                    name not in required
                    and "default" not in prop
                    and not _present_or_none(properties[name])
                    and _wants_empty_default(prop)
                ):
                    prop["default"] = {}
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = self.convert(extra, f"{path}{{}}", stack)
        elif extra is True or extra == {}:
            # dict[str, Any] and friends: a free-form object, kept as it is.
            out["x-kubernetes-preserve-unknown-fields"] = True
        # else: a model without fields: an empty object.


def _json_type(value: object, path: str) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    raise SchemaError(f"{path}: cannot type the constant {value!r}")


def _present_or_none(prop: Schema) -> bool:
    """A field typed ``X | None = None``: its presence is what it says (``spec.pooler``: a
    pooler or none), so it must never be defaulted into existence."""
    union = prop.get("anyOf", prop.get("oneOf")) or []
    return "default" in prop and prop["default"] is None and {"type": "null"} in union


def _wants_empty_default(prop: Schema) -> bool:
    """An optional object with defaulted children and nothing required: default it to {} so
    that the API server fills in the children's defaults even when the object is left out."""
    if prop.get("type") != "object" or prop.get("required") or "properties" not in prop:
        return False
    return any("default" in child for child in prop["properties"].values())


def structural_schema(
    model: type[pydantic.BaseModel], *, no_defaults_under: Iterable[str] = ()
) -> Schema:
    """The structural OpenAPI v3 schema of a pydantic model (camelCase field names).

    ``no_defaults_under`` lists dotted paths ("status") below which defaults are dropped."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    converter = _Converter(raw.get("$defs", {}), no_defaults_under)
    return converter.convert(raw, "")


# --- extras: what pydantic cannot say ----------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (``x-kubernetes-validations`` entry)."""

    rule: str
    message: str
    message_expression: str | None = None
    field_path: str | None = None
    reason: Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired"] | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.message_expression is not None:
            out["messageExpression"] = self.message_expression
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def _node_at(schema: Schema, path: str) -> Schema:
    """The schema node at a dotted path: "spec.storageSize", "status.conditions[]" (the
    items of a list), "spec.postgresql.parameters{}" (the values of a map)."""
    node = schema
    for part in re.findall(r"[^.\[\]{}]+|\[\]|\{\}", path):
        if part == "[]":
            node = node["items"]
        elif part == "{}":
            node = node["additionalProperties"]
        else:
            try:
                node = node["properties"][part]
            except KeyError:
                raise KeyError(f"no field {path!r} in the schema") from None
    return node


def apply_extras(schema: Schema, extras: Mapping[str, Mapping[str, Any]]) -> Schema:
    """Merge extra keywords into the nodes at the given paths (in place; returns schema).
    ``x-kubernetes-validations`` may hold :class:`Rule` objects. A path that does not exist
    raises KeyError, so renaming a field cannot silently drop its rules."""
    for path, keywords in extras.items():
        node = _node_at(schema, path)
        for key, value in keywords.items():
            if key == "x-kubernetes-validations":
                rules = [r.to_dict() if isinstance(r, Rule) else dict(r) for r in value]
                node.setdefault(key, []).extend(rules)
            else:
                node[key] = copy.deepcopy(value)
    return schema


# --- the CRD -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str | None = None
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


_API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers "
    "should convert recognized schemas to the latest internal value, and may reject "
    "unrecognized values."
)
_KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers "
    "may infer this from the endpoint the client submits requests to. In CamelCase."
)


def crd_schema(
    model: type[pydantic.BaseModel], extras: Mapping[str, Mapping[str, Any]] = {}
) -> Schema:
    """The openAPIV3Schema of a resource model with ``metadata``, ``spec`` and ``status``
    (optional) fields: apiVersion/kind/metadata as Kubernetes wants them, no defaults under
    status, ``extras`` merged in."""
    schema = structural_schema(model, no_defaults_under=("status", "apiVersion", "kind"))
    properties = schema.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "description": _API_VERSION_DESCRIPTION}
    properties["kind"] = {"type": "string", "description": _KIND_DESCRIPTION}
    properties["metadata"] = {"type": "object"}
    if "status" in properties:
        properties["status"].pop("default", None)
    schema.pop("x-kubernetes-preserve-unknown-fields", None)
    return apply_extras(schema, extras)


def crd_for(
    model: type[pydantic.BaseModel],
    *,
    group: str,
    version: str,
    kind: str,
    plural: str,
    singular: str,
    short_names: Sequence[str] = (),
    categories: Sequence[str] = (),
    scope: Literal["Namespaced", "Cluster"] = "Namespaced",
    printer_columns: Sequence[PrinterColumn] = (),
    extras: Mapping[str, Mapping[str, Any]] = {},
) -> dict[str, Any]:
    """An ``apiextensions.k8s.io/v1`` CustomResourceDefinition for a resource model: one
    version, served and stored, with the status subresource when the model has ``status``."""
    schema = crd_schema(model, extras)
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": singular,
    }
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    served: dict[str, Any] = {
        "name": version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
    }
    if "status" in schema["properties"]:
        served["subresources"] = {"status": {}}
    if printer_columns:
        served["additionalPrinterColumns"] = [c.to_dict() for c in printer_columns]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "names": names, "scope": scope, "versions": [served]},
    }


# --- PostgresCluster ---------------------------------------------------------------------


def _cel_string(text: str) -> str:
    """A CEL single-quoted string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_NUMERIC_VERSION = _cel_string("^[0-9]+([.][0-9]+)?$")
MAX_PARAMETERS = 256
_MANAGED_LIST = "[" + ", ".join(_cel_string(p) for p in MANAGED_PARAMETERS) + "]"

_DATA_MAJOR = "int(oldSelf.status.version.split('.')[0])"

POSTGRESCLUSTER_EXTRAS: dict[str, dict[str, Any]] = {
    # The object, not the spec: only there does a rule see the status, where the data's
    # version is (status.version). Raising the major starts an in-place upgrade; lowering it
    # below the data's is refused. Back to the data's major (after a refused upgrade) is not a
    # downgrade. A status update leaves the spec as it was, so it always passes.
    "": {
        "x-kubernetes-validations": [
            Rule(
                rule=(
                    "!has(oldSelf.status) || !has(oldSelf.status.version) || "
                    "self.spec.version == oldSelf.spec.version || "
                    f"!self.spec.version.matches({_NUMERIC_VERSION}) || "
                    f"!oldSelf.status.version.matches({_NUMERIC_VERSION}) || "
                    f"int(self.spec.version.split('.')[0]) >= {_DATA_MAJOR}"
                ),
                message=(
                    "spec.version cannot go below the major of the data files"
                    " (status.version): a downgrade is not possible in place"
                ),
                message_expression=(
                    "'spec.version ' + self.spec.version + ' is older than the data files,"
                    " which are PostgreSQL ' + oldSelf.status.version + ': a downgrade is not"
                    " possible in place; restore a backup into a new cluster of version ' + "
                    "self.spec.version + ' instead'"
                ),
                field_path=".spec.version",
                reason="FieldValueForbidden",
            ),
        ]
    },
    "spec": {
        "x-kubernetes-validations": [
            Rule(
                rule=(
                    "!isQuantity(self.storageSize) || !isQuantity(oldSelf.storageSize) || "
                    "quantity(self.storageSize).compareTo(quantity(oldSelf.storageSize)) >= 0"
                ),
                message="spec.storageSize may grow but never shrink",
                message_expression=(
                    "'spec.storageSize may grow but never shrink (from ' + "
                    "oldSelf.storageSize + ' to ' + self.storageSize + ')'"
                ),
                field_path=".storageSize",
                reason="FieldValueForbidden",
            ),
            Rule(
                rule=(
                    "has(self.storageClassName) == has(oldSelf.storageClassName) && "
                    "(!has(self.storageClassName) || "
                    "self.storageClassName == oldSelf.storageClassName)"
                ),
                message=(
                    "spec.storageClassName is immutable: it cannot be set, changed or removed "
                    "after the cluster is created"
                ),
                field_path=".storageClassName",
                reason="FieldValueForbidden",
            ),
            Rule(
                rule="!has(self.bootstrap) || !has(self.bootstrap.restore) || has(self.backup)",
                message=(
                    "spec.bootstrap.restore needs spec.backup.repository: the object store"
                    " that holds the backups to restore"
                ),
                field_path=".bootstrap.restore",
                reason="FieldValueRequired",
            ),
            Rule(
                rule="!has(self.backupSchedule) || has(self.backup)",
                message=(
                    "spec.backupSchedule needs a repository to write to: set"
                    " spec.backup.repository (or remove the schedule)"
                ),
                field_path=".backupSchedule",
                reason="FieldValueRequired",
            ),
            Rule(
                rule=(
                    "!has(self.deletionPolicy) || !has(self.deletionPolicy.finalBackup) || "
                    "!self.deletionPolicy.finalBackup || has(self.backup)"
                ),
                message=(
                    "spec.deletionPolicy.finalBackup needs a repository to write to: set"
                    " spec.backup.repository, or set finalBackup to false"
                ),
                field_path=".deletionPolicy.finalBackup",
                reason="FieldValueRequired",
            ),
            Rule(
                rule=(
                    "!has(self.synchronous) || !has(self.synchronous.mode) || "
                    "self.synchronous.mode != 'Required' || self.replicas > "
                    "(has(self.synchronous.number) ? self.synchronous.number : 1)"
                ),
                message=(
                    "spec.synchronous.mode Required needs spec.replicas greater than"
                    " spec.synchronous.number (no commit could complete without enough"
                    " standbys): add replicas, lower the number, or use mode Preferred"
                ),
                field_path=".synchronous.mode",
                reason="FieldValueInvalid",
            ),
        ]
    },
    "spec.bootstrap": {
        "x-kubernetes-validations": [
            Rule(
                rule="self == oldSelf",
                message=(
                    "spec.bootstrap is immutable: the database and its owner are created once,"
                    " when the cluster is initialized"
                ),
                reason="FieldValueForbidden",
            ),
        ]
    },
    "spec.bootstrap.restore": {
        "x-kubernetes-validations": [
            Rule(
                rule="!has(self.targetTime) || !has(self.restorePoint)",
                message="spec.bootstrap.restore takes targetTime or restorePoint, not both",
            ),
        ]
    },
    "spec.bootstrap.owner": {
        "x-kubernetes-validations": [
            Rule(
                rule=f"!(self in [{', '.join(_cel_string(r) for r in v1alpha1.RESERVED_ROLES)}])",
                message="spec.bootstrap.owner must not be a role the operator uses: "
                + ", ".join(v1alpha1.RESERVED_ROLES),
            ),
        ]
    },
    "spec.bootstrap.database": {
        "x-kubernetes-validations": [
            Rule(
                rule=(
                    f"!(self in [{', '.join(_cel_string(d) for d in v1alpha1.RESERVED_DATABASES)}])"
                ),
                message="spec.bootstrap.database must not be one of PostgreSQL's own databases: "
                + ", ".join(v1alpha1.RESERVED_DATABASES),
            ),
        ]
    },
    "spec.version": {
        "x-kubernetes-validations": [
            Rule(
                rule=f"self.matches({_cel_string(VERSION_REGEX)})",
                message=f"spec.version {VERSION_MESSAGE}",
            )
        ]
    },
    "spec.storageSize": {
        "x-kubernetes-validations": [
            Rule(
                rule="isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
                message='spec.storageSize must be a positive Kubernetes quantity such as "10Gi"',
            )
        ]
    },
    "spec.backupSchedule": {
        "x-kubernetes-validations": [
            Rule(
                rule=f"self.matches({_cel_string(CRON_REGEX)})",
                message=f"spec.backupSchedule {CRON_MESSAGE}",
            )
        ]
    },
    "spec.postgresql.parameters": {
        # Bounds the CEL cost estimate of the rules below (an unbounded map is over budget);
        # a postgresql.conf rarely sets more than a few dozen parameters.
        "maxProperties": MAX_PARAMETERS,
        "x-kubernetes-validations": [
            # The API server enforces both without the operator: a name outside the pattern
            # could write other lines into postgresql.conf.
            Rule(
                rule=f"self.all(p, p.matches({_cel_string(v1alpha1.PARAMETER_NAME_PATTERN)}))",
                message=f"spec.postgresql.parameters names must each be {PARAMETER_NAME_MESSAGE}",
            ),
            Rule(
                # lowerAscii: PostgreSQL's names are case-insensitive, WAL_LEVEL is wal_level.
                rule=f"self.all(p, !(p.lowerAscii() in {_MANAGED_LIST}))",
                message=(
                    "spec.postgresql.parameters must not set parameters the operator manages: "
                    + ", ".join(MANAGED_PARAMETERS)
                ),
                # Names the first offender. (join() would name all, but its estimated cost
                # is far over the CRD budget.)
                message_expression=(
                    "'spec.postgresql.parameters must not set ' + "
                    f"self.filter(p, p.lowerAscii() in {_MANAGED_LIST})[0] + "
                    "': the operator manages it'"
                ),
            ),
        ],
    },
    "status.conditions": {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    },
    "status.replicaPods": {"x-kubernetes-list-type": "atomic"},
    "status.instances": {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
}
"""CRD-only additions to the PostgresCluster schema, by field path: CEL admission rules and
list types for server-side apply."""

POSTGRESCLUSTER_PRINTER_COLUMNS: tuple[PrinterColumn, ...] = (
    PrinterColumn("Version", ".spec.version", description="PostgreSQL version"),
    PrinterColumn("Replicas", ".spec.replicas", "integer", "Instances wanted"),
    PrinterColumn("Ready", ".status.readyReplicas", "integer", "Instances ready"),
    PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
    PrinterColumn("Primary", ".status.primaryPod", description="Pod running the primary"),
    PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
)


def postgrescluster_crd() -> dict[str, Any]:
    """The PostgresCluster CustomResourceDefinition."""
    return crd_for(
        v1alpha1.PostgresCluster,
        group=v1alpha1.GROUP,
        version=v1alpha1.VERSION,
        kind=v1alpha1.KIND,
        plural=v1alpha1.PLURAL,
        singular=v1alpha1.SINGULAR,
        short_names=v1alpha1.SHORT_NAMES,
        categories=("stateward",),
        printer_columns=POSTGRESCLUSTER_PRINTER_COLUMNS,
        extras=POSTGRESCLUSTER_EXTRAS,
    )


# --- Database ----------------------------------------------------------------------------------


def _engine_versions_rule() -> Rule:
    """spec.version against spec.engine's versions (one rule: the pattern depends on the
    engine), naming the supported versions of the engine given."""
    branches = {
        engine: f"self.version.matches({_cel_string(v1alpha1.engine_version_pattern(engine))})"
        for engine in v1alpha1.Engine
    }
    listed = {
        engine: _cel_string(", ".join(v1alpha1.ENGINE_MAJOR_VERSIONS[engine]))
        for engine in v1alpha1.Engine
    }
    postgres, mysql, mariadb = (v1alpha1.Engine.POSTGRES, v1alpha1.Engine.MYSQL,
                                v1alpha1.Engine.MARIADB)  # fmt: skip
    return Rule(
        rule=(
            f"self.engine == 'postgres' ? {branches[postgres]} : "
            f"self.engine == 'mysql' ? {branches[mysql]} : {branches[mariadb]}"
        ),
        message="spec.version is not a supported version of spec.engine",
        message_expression=(
            "'spec.version ' + self.version + ' is not a supported ' + self.engine + "
            f"' version: use one of ' + (self.engine == 'postgres' ? {listed[postgres]} : "
            f"self.engine == 'mysql' ? {listed[mysql]} : {listed[mariadb]}) + "
            "', optionally with a minor or patch level (e.g. 17.2, 8.4.3, 10.11.9)'"
        ),
        field_path=".version",
        reason="FieldValueInvalid",
    )


def _series(version: str) -> str:
    """CEL: the release series of ``version`` (the text before the second dot)."""
    parts = f"{version}.split('.')"
    return f"({parts}.size() > 1 ? {parts}[0] + '.' + {parts}[1] : {version})"


DATABASE_EXTRAS: dict[str, dict[str, Any]] = {
    "spec": {
        "x-kubernetes-validations": [
            Rule(
                rule="self.engine == oldSelf.engine",
                message=(
                    "spec.engine is immutable: create a new Database for another engine and"
                    " move the data"
                ),
                field_path=".engine",
                reason="FieldValueForbidden",
            ),
            _engine_versions_rule(),
            Rule(
                rule="self.engine != 'mysql' || !has(self.tls) || !has(self.tls.caSecretName)",
                message=(
                    "spec.tls.caSecretName: MySQL servers serve no TLS yet; remove it, or use"
                    " engine mariadb or postgres"
                ),
                field_path=".tls.caSecretName",
                reason="FieldValueForbidden",
            ),
            Rule(
                rule="self.engine != 'mysql' || !has(self.tls) || !has(self.tls.serverSecretName)",
                message=(
                    "spec.tls.serverSecretName: MySQL servers serve no TLS yet; remove it, or"
                    " use engine mariadb or postgres"
                ),
                field_path=".tls.serverSecretName",
                reason="FieldValueForbidden",
            ),
            Rule(
                rule=(
                    "self.engine != oldSelf.engine || (self.engine == 'postgres' ? "
                    "self.version.split('.')[0] == oldSelf.version.split('.')[0] : "
                    f"{_series('self.version')} == {_series('oldSelf.version')})"
                ),
                message=(
                    "spec.version cannot change the major version: upgrades are not supported yet"
                ),
                message_expression=(
                    "'spec.version cannot change the major version (from ' + oldSelf.version + "
                    "' to ' + self.version + '): minor updates roll the pods; major upgrades are"
                    " not supported yet'"
                ),
                field_path=".version",
                reason="FieldValueForbidden",
            ),
        ]
    },
    "spec.storage": {
        "x-kubernetes-validations": [
            Rule(
                rule=(
                    "!isQuantity(self.size) || !isQuantity(oldSelf.size) || "
                    "quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0"
                ),
                message="spec.storage.size may grow but never shrink",
                message_expression=(
                    "'spec.storage.size may grow but never shrink (from ' + oldSelf.size + "
                    "' to ' + self.size + ')'"
                ),
                field_path=".size",
                reason="FieldValueForbidden",
            ),
            Rule(
                rule=(
                    "has(self.storageClassName) == has(oldSelf.storageClassName) && "
                    "(!has(self.storageClassName) || "
                    "self.storageClassName == oldSelf.storageClassName)"
                ),
                message=(
                    "spec.storage.storageClassName is immutable: it cannot be set, changed or"
                    " removed after the Database is created"
                ),
                field_path=".storageClassName",
                reason="FieldValueForbidden",
            ),
        ]
    },
    "spec.storage.size": {
        "x-kubernetes-validations": [
            Rule(
                rule="isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
                message='spec.storage.size must be a positive size such as "10Gi"',
            )
        ]
    },
    "status.conditions": {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    },
}
"""CRD-only additions to the Database schema: CEL admission rules and list types."""

DATABASE_PRINTER_COLUMNS: tuple[PrinterColumn, ...] = (
    PrinterColumn("Engine", ".spec.engine", description="postgres, mysql or mariadb"),
    PrinterColumn("Version", ".spec.version", description="Engine version"),
    PrinterColumn("Replicas", ".spec.replicas", "integer", "Servers wanted"),
    PrinterColumn("Ready", ".status.readyReplicas", "integer", "Servers ready"),
    PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
    PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
)


def database_crd() -> dict[str, Any]:
    """The Database CustomResourceDefinition."""
    return crd_for(
        v1alpha1.Database,
        group=v1alpha1.GROUP,
        version=v1alpha1.VERSION,
        kind=v1alpha1.DATABASE_KIND,
        plural=v1alpha1.DATABASE_PLURAL,
        singular=v1alpha1.DATABASE_SINGULAR,
        short_names=v1alpha1.DATABASE_SHORT_NAMES,
        categories=("stateward",),
        printer_columns=DATABASE_PRINTER_COLUMNS,
        extras=DATABASE_EXTRAS,
    )
