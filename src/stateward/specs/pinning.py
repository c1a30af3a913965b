"""Images pinned by digest: what the operator runs instead of a tag.

A tag is a name anyone with push rights may point elsewhere; a digest names the bytes. The
operator is given pins (``--pin-image REPOSITORY:TAG@sha256:DIGEST``, the chart's
``pinnedImages``), and every container, init container and Job it makes that would run
``REPOSITORY:TAG`` runs ``REPOSITORY:TAG@sha256:DIGEST`` instead: the runtime fetches and
checks the digest, and the tag stays beside it for the humans reading the pod. Applied to
the built children before they are compared with what runs, so a reconcile that changes
nothing still writes nothing, and a new pin rolls the pods as any image change does.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

Pins = Mapping[str, str]
"""``REPOSITORY:TAG`` to ``sha256:DIGEST``."""

FLAG: Final = "--pin-image"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_REFERENCE = re.compile(
    r"^(?P<repository>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)"
    r":(?P<tag>[\w][\w.-]{0,127})$"
)


def parse_pin(text: str) -> tuple[str, str]:
    """``REPOSITORY:TAG@sha256:DIGEST`` as (``REPOSITORY:TAG``, ``sha256:DIGEST``); a
    ValueError naming the flag and what to fix otherwise."""
    reference, at, digest = text.partition("@")
    if not at or not _DIGEST.match(digest):
        raise ValueError(
            f"{FLAG} {text!r}: give REPOSITORY:TAG@sha256:DIGEST, the digest 64 lowercase"
            " hex digits (`crane digest REPOSITORY:TAG` or your registry prints it)"
        )
    if not _REFERENCE.match(reference):
        raise ValueError(
            f"{FLAG} {text!r}: {reference!r} is not REPOSITORY:TAG; pin the tag the operator"
            " would run, such as ghcr.io/stateward/postgres-instance:17"
        )
    return reference, digest


def parse_pins(texts: list[str]) -> dict[str, str]:
    """Every ``--pin-image``; one tag pinned to two digests is refused."""
    pins: dict[str, str] = {}
    for text in texts:
        reference, digest = parse_pin(text)
        if pins.get(reference, digest) != digest:
            raise ValueError(f"{FLAG}: {reference} is pinned to two digests; keep one")
        pins[reference] = digest
    return pins


def pinned(image: str, pins: Pins) -> str:
    """``image`` with its pin's digest, if it has one (an image that names a digest already,
    or that no pin names, is left as it is)."""
    digest = pins.get(image)
    return f"{image}@{digest}" if digest else image


def without_digest(image: str) -> str:
    """The image as named before it was pinned."""
    return image.partition("@")[0]


def _pod_specs(obj: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kind, spec = obj.get("kind"), obj.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind in ("StatefulSet", "Deployment", "Job", "DaemonSet", "ReplicaSet"):
        yield (spec.get("template") or {}).get("spec") or {}
    elif kind == "CronJob":
        job = (spec.get("jobTemplate") or {}).get("spec") or {}
        yield (job.get("template") or {}).get("spec") or {}


def pin_images(obj: dict[str, Any], pins: Pins) -> dict[str, Any]:
    """``obj`` (a workload or a pod) with every container's image pinned; ``obj`` itself
    when nothing changes."""
    if not pins or not any(
        container.get("image") in pins
        for spec in _pod_specs(obj)
        for key in ("initContainers", "containers")
        for container in spec.get(key) or []
    ):
        return obj
    result = copy.deepcopy(obj)
    for spec in _pod_specs(result):
        for key in ("initContainers", "containers"):
            for container in spec.get(key) or []:
                if "image" in container:
                    container["image"] = pinned(container["image"], pins)
    return result
