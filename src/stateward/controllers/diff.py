"""Does an observed object already say everything we want it to say?

Children are written by server-side apply, and the API server adds defaults to what we send.
Comparing whole specs would see those defaults as drift and fight them forever; instead the
desired object must be *contained* in the observed one: every field we set has our value,
and fields we never set are not our business.

Containment cannot see a field we *stopped* setting (cleared resource limits): the observed
object still holds it, and server-side apply removes it only when we apply again. So each
applied object carries the hash of itself in an annotation (``stamped``); a desired object
that lost a field has another hash, the annotation no longer matches, and ``drift`` asks
for the apply that prunes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Final

from stateward.api.validation import parse_quantity
from stateward.specs import meta

HASH_LENGTH: Final = 16
NOT_YET_STAMPED: Final = "no applied hash yet"
"""Drift of an object applied before the annotation existed: one apply records it."""
FIELDS_DROPPED: Final = "fields no longer desired"
"""Drift that containment cannot name: the desired object changed without adding or changing
a value (a field was removed, or a quantity respelled)."""

# Paths under these keys hold quantities, which the API server stores in canonical form
# ("1024Mi" comes back as "1Gi", "1000m" as "1"): compared by value, not spelling.
QUANTITY_PARENTS = (".requests.", ".limits.", ".capacity.")


def _same_scalar(observed: Any, desired: Any, path: str) -> bool:
    if observed == desired:
        return True
    if (
        isinstance(observed, str)
        and isinstance(desired, str)
        and any(parent in path for parent in QUANTITY_PARENTS)
    ):
        have, want = parse_quantity(observed), parse_quantity(desired)
        return have is not None and have == want
    return False


def differences(observed: Any, desired: Any, path: str = "") -> list[str]:
    """Paths where ``observed`` does not contain ``desired`` (empty when it does)."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return [path or "."]
        found: list[str] = []
        for key, value in desired.items():
            found += differences(observed.get(key), value, f"{path}.{key}")
        return found
    if isinstance(desired, list):
        if not isinstance(observed, list):
            return [path or "."]
        key = _merge_key(desired)
        if key is not None:
            return _keyed_differences(observed, desired, key, path)
        if len(observed) != len(desired):
            return [path or "."]
        found = []
        for index, (have, want) in enumerate(zip(observed, desired, strict=True)):
            found += differences(have, want, f"{path}[{index}]")
        return found
    return [] if _same_scalar(observed, desired, path) else [path or "."]


MERGE_KEYS: Final = ("mountPath", "containerPort", "port", "name")
"""The keys by which server-side apply merges the lists we write (volumeMounts by mountPath,
container ports by containerPort, Service ports by port; containers, env, volumes and the
like by name), most specific first: an item carries its list's key and maybe ``name`` too."""


def _merge_key(items: list[Any]) -> str | None:
    """The key a list of ours is merged by, or None for an atomic list (args, RBAC rules)."""
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in MERGE_KEYS:
        values = [item.get(key) for item in items]
        if all(value is not None for value in values) and len(set(map(str, values))) == len(values):
            return key
    return None


def _keyed_differences(observed: list[Any], desired: list[Any], key: str, path: str) -> list[str]:
    """Each desired item is contained in the observed item with its key; items another field
    manager added (a sidecar, an injected variable) are not ours to judge, as server-side
    apply leaves them too."""
    have = {str(item.get(key)): item for item in observed if isinstance(item, dict)}
    found: list[str] = []
    for want in desired:
        name = str(want[key])
        where = f"{path}[{key}={name}]"
        found += differences(have[name], want, where) if name in have else [where]
    return found


def applied_hash(desired: dict[str, Any], *, exclude: Iterable[str] = ()) -> str:
    """Short sha256 of ``desired`` in canonical JSON (key order does not matter).

    The hash annotation itself is left out, and so is every dotted path in ``exclude``
    (".spec.volumeClaimTemplates"): fields the API server refuses to change, where a removal
    would make every apply fail; a change there is found by containment and made by
    recreating the object.
    """
    document = _without_hash(desired)
    for path in exclude:
        document = _without(document, path.lstrip(".").split("."))
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:HASH_LENGTH]


def stamped(
    desired: dict[str, Any], *, exclude: Iterable[str] = (), known: str | None = None
) -> dict[str, Any]:
    """``desired`` carrying its ``applied_hash`` in an annotation, to apply (``known``: that
    hash, computed already).

    A new object that shares everything but its metadata with ``desired``.
    """
    metadata = desired.get("metadata") or {}
    annotations = {
        **(metadata.get("annotations") or {}),
        meta.APPLIED_HASH_ANNOTATION: known or applied_hash(desired, exclude=exclude),
    }
    return {**desired, "metadata": {**metadata, "annotations": annotations}}


def drift(observed: dict[str, Any], desired: dict[str, Any]) -> list[str]:
    """Why ``observed`` needs an apply of ``desired`` (a ``stamped`` object); empty if not.

    The sorted paths where ``observed`` does not contain our values; when there are none
    but the hashes differ, which no path can name, ``FIELDS_DROPPED``, or ``NOT_YET_STAMPED``
    for an object without a hash (applied before the annotation existed: one apply, once).
    """
    found = sorted(set(differences(observed, _without_hash(desired))))
    have, want = _hash_of(observed), _hash_of(desired)
    if found or want is None or have == want:  # an unstamped object: containment only
        return found
    return [NOT_YET_STAMPED if have is None else FIELDS_DROPPED]


def _hash_of(body: dict[str, Any]) -> str | None:
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(meta.APPLIED_HASH_ANNOTATION)
    return value if isinstance(value, str) else None


def _without_hash(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the hash annotation, nor an annotations map that only held it."""
    body = _without(body, ["metadata", "annotations", meta.APPLIED_HASH_ANNOTATION])
    if (body.get("metadata") or {}).get("annotations") == {}:
        body = _without(body, ["metadata", "annotations"])
    return body


def _without(body: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """``body`` without the field at ``keys``; copies only the maps along that path."""
    head, *rest = keys
    if head not in body:
        return body
    if not rest:
        return {k: v for k, v in body.items() if k != head}
    child = body[head]
    if not isinstance(child, dict):
        return body
    return {**body, head: _without(child, rest)}
