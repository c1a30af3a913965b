"""Kubernetes resource quantities ("10Gi", "500M", "1.5") as exact numbers."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_PATTERN = re.compile(
    r"^([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:[eE]([+-]?[0-9]+))?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)


def parse(text: str) -> Fraction:
    """The exact value of a quantity; raises ValueError naming the accepted forms."""
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a Kubernetes quantity (a number with an optional suffix such as"
            " Mi, Gi, Ti, k, M, G)"
        )
    number, exponent, suffix = match.groups()
    if exponent and suffix:
        raise ValueError(f"{text!r} combines an exponent with a suffix")
    value = Fraction(number) * _SUFFIXES[suffix or ""]
    if exponent:
        value *= Fraction(10) ** int(exponent)
    return value
