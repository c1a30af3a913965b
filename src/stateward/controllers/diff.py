"""Does an observed object already say everything we want it to say?

Children are written by server-side apply, and the API server adds defaults to what we send.
Comparing whole specs would see those defaults as drift and fight them forever; instead the
desired object must be *contained* in the observed one: every field we set has our value,
and fields we never set are not our business.
"""

from __future__ import annotations

from typing import Any

from stateward.api.validation import parse_quantity

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
        if not isinstance(observed, list) or len(observed) != len(desired):
            return [path or "."]
        found = []
        for index, (have, want) in enumerate(zip(observed, desired, strict=True)):
            found += differences(have, want, f"{path}[{index}]")
        return found
    return [] if _same_scalar(observed, desired, path) else [path or "."]
