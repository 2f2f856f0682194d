"""Kubernetes resource quantities: parse them and print them the way kubectl does.

Node status reports ``rdma/hca`` as a quantity string. The kubelet writes device counts in
decimal SI form, so 1000 slots print as ``1k``; users compare what ``doctor`` prints with what
``kubectl get node -o yaml`` prints, so the canonical form must match kubectl's exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Loaded where a quantity is parsed (fractions brings decimal, about 0.4 MiB): a node
    # daemon given none of its settings as a quantity never loads it.
    from fractions import Fraction


class QuantityError(ValueError):
    """A quantity string that Kubernetes would reject."""


class QuantityFormat(Enum):
    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL_BY_EXPONENT = {exp: suffix for suffix, exp in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_POWER = {power: suffix for suffix, power in _BINARY_SUFFIXES.items()}

_NUMBER = re.compile(r"^([+-]?)(\d+\.?\d*|\.\d+)(.*)$")
_EXPONENT = re.compile(r"^[eE]([+-]?\d+)$")

# Kubernetes keeps nine decimal places and rounds anything finer up, so "1.0000000001"
# is stored (and printed) as "1000000001n".
_NANO = 10**9


@dataclass(frozen=True, slots=True)
class Quantity:
    """An exact value plus the format its text used, which decides how it prints."""

    value: Fraction
    format: QuantityFormat

    def __str__(self) -> str:
        return format_quantity(self)

    def __int__(self) -> int:
        """Whole units, rounded up as Kubernetes' ``Value()`` does."""
        return math.ceil(self.value)


def parse_quantity(text: str) -> Quantity:
    """Parse ``"1k"``, ``"1000"``, ``"2Ki"``, ``"500m"``, ``"1e3"`` and the like."""
    stripped = text.strip()
    match = _NUMBER.match(stripped)
    if not stripped or match is None:
        raise QuantityError(
            f"{text!r} is not a quantity: expected a number with an optional suffix "
            "such as 1000, 1k, 2Ki or 500m"
        )
    from fractions import Fraction

    sign, digits, suffix = match.groups()
    number = Fraction(digits)
    if sign == "-":
        number = -number
    if suffix in _DECIMAL_SUFFIXES:
        value = number * Fraction(10) ** _DECIMAL_SUFFIXES[suffix]
        fmt = QuantityFormat.DECIMAL_SI
    elif suffix in _BINARY_SUFFIXES:
        value = number * Fraction(1024) ** _BINARY_SUFFIXES[suffix]
        fmt = QuantityFormat.BINARY_SI
    elif (exp := _EXPONENT.match(suffix)) is not None:
        value = number * Fraction(10) ** int(exp.group(1))
        fmt = QuantityFormat.DECIMAL_EXPONENT
    else:
        raise QuantityError(
            f"{text!r} is not a quantity: unknown suffix {suffix!r} (allowed: "
            "n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent like e3)"
        )
    return Quantity(_round_up_to_nano(value), fmt)


def _round_up_to_nano(value: Fraction) -> Fraction:
    scaled = value * _NANO
    # Round away from zero, as Kubernetes does when it drops precision.
    whole = math.ceil(scaled) if scaled >= 0 else math.floor(scaled)
    return type(value)(whole, _NANO)


def format_quantity(quantity: Quantity) -> str:
    """The canonical text kubectl prints for a quantity."""
    value, fmt = quantity.value, quantity.format
    if fmt is QuantityFormat.BINARY_SI and (abs(value) < 1024 or value.denominator != 1):
        # Small or fractional binary values print in decimal form so nothing is rounded.
        fmt = QuantityFormat.DECIMAL_SI
    if fmt is QuantityFormat.BINARY_SI:
        return _format_binary(int(value))
    return _format_decimal(value, fmt)


def _format_binary(value: int) -> str:
    power = 0
    while power < max(_BINARY_BY_POWER) and value != 0 and value % 1024 == 0:
        value //= 1024
        power += 1
    return f"{value}{_BINARY_BY_POWER.get(power, '')}"


def format_whole(value: int, fmt: QuantityFormat = QuantityFormat.DECIMAL_SI) -> str:
    """The kubectl form of a whole number (device counts, bandwidths: 400000000000 is
    ``400G``) in plain integers: Fraction arithmetic costs tens of microseconds a value, and
    a slice rebuild formats one per device."""
    if value == 0:
        return "0"
    whole, exponent = value, 0
    while whole % 1000 == 0:
        whole //= 1000
        exponent += 3
    if fmt is QuantityFormat.DECIMAL_EXPONENT or exponent > max(_DECIMAL_SUFFIXES.values()):
        return f"{whole}" + (f"e{exponent}" if exponent else "")
    return f"{whole}{_DECIMAL_BY_EXPONENT[exponent]}"


def _format_decimal(value: Fraction, fmt: QuantityFormat) -> str:
    if value.denominator == 1:
        return format_whole(int(value), fmt)
    # Find the mantissa with the largest exponent that is a multiple of three and still
    # leaves the mantissa a whole number; values are multiples of 1e-9, so -9 always works.
    exponent = -9
    mantissa = value * 10**9
    while mantissa.denominator == 1 and mantissa % 1000 == 0:
        mantissa /= 1000
        exponent += 3
    if fmt is QuantityFormat.DECIMAL_EXPONENT:
        return f"{int(mantissa)}" + (f"e{exponent}" if exponent else "")
    if exponent > max(_DECIMAL_SUFFIXES.values()):
        # Beyond exa there is no suffix; kubectl falls back to exponent form too.
        return f"{int(mantissa)}e{exponent}"
    return f"{int(mantissa)}{_DECIMAL_BY_EXPONENT[exponent]}"


def canonical(text: str) -> str:
    """Shortcut: the kubectl form of a quantity string (``"1000"`` -> ``"1k"``)."""
    return format_quantity(parse_quantity(text))
