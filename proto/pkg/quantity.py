"""Kubernetes resource quantities ("1.5Gi", "250m", "2e3"): parsed strictly, and written in
the API server's canonical form.

The grammar is the API server's (apimachinery `resource.Quantity`): an optional sign, a
decimal number, then one binary suffix (Ki Mi Gi Ti Pi Ei), one decimal suffix (n u m k M G
T P E) or an exponent (e3, E-3); anything else is a QuantityError naming the text. Written
here, not taken from the official client: importing any part of it loads every generated
API and model class (seconds of CPU and about 60 MB in each process).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import ROUND_UP, Context, Decimal, Inexact, Overflow, Underflow

_GRAMMAR = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>[KMGTPE]i|[numkMGTPE]?))"
)
_BINARY: Mapping[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL_EXPONENT: Mapping[str, int] = {
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
_CANONICAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
_INTEGER_DIGITS = 18
"""An integer of up to this many digits times any suffix is well inside `_EXACT`'s range."""
_EXACT = Context(prec=64, Emax=64, Emin=-64, traps=[Inexact, Overflow, Underflow])
"""Every quantity with up to 64 significant digits between 1e-64 and 1e64 is exact; beyond
that a quantity is refused, not rounded."""


class QuantityError(ValueError):
    """A resource quantity that does not parse; the message names the text."""


def _match(text: str) -> re.Match[str]:
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        raise QuantityError(f"invalid quantity {text!r}")
    return match


def parse_quantity(value: object) -> Decimal:
    """The exact value of a quantity (its text: an int from decoded JSON is its digits)."""
    text = str(value)
    match = _match(text)
    number, suffix = Decimal(match["number"]), match["suffix"]
    try:
        if suffix in _BINARY:
            return _EXACT.multiply(number, _BINARY[suffix])
        exponent = _DECIMAL_EXPONENT[suffix] if suffix is not None else int(match["exponent"])
        return number.scaleb(exponent, _EXACT)
    except ArithmeticError:
        raise QuantityError(f"invalid quantity {text!r}: out of range") from None


def quantity_value(value: object, milli: bool = False) -> int:
    """A quantity as an integer, in milli-units when `milli`, rounded away from zero (as the
    API's Quantity.Value and MilliValue do): "1.5" is 2, or 1500 milli; "12n" is 1 milli."""
    text = str(value)
    match = _match(text)
    digits, suffix = match["number"], match["suffix"]
    if suffix is not None and digits.isdigit() and len(digits) <= _INTEGER_DIGITS:
        # the common case, "8Gi" or "500m" of cpu: integer arithmetic, exact and fast
        if suffix in _BINARY:
            return int(digits) * _BINARY[suffix] * (1000 if milli else 1)
        shift = _DECIMAL_EXPONENT[suffix] + (3 if milli else 0)
        if shift >= 0:
            return int(digits) * int(10**shift)  # int(): mypy types int ** int as Any
    exact = parse_quantity(text)
    if milli:
        try:
            exact = exact.scaleb(3, _EXACT)
        except ArithmeticError:
            raise QuantityError(f"invalid quantity {text!r}: out of range") from None
    return int(exact.to_integral_value(rounding=ROUND_UP))


def format_quantity(value: int) -> str:
    """`value` as the API server stores it (canonical decimal SI: the largest power of 1000
    that divides it, e.g. 85899346000 -> "85899346k"), so what is written reads back equal."""
    sign, magnitude = ("-" if value < 0 else ""), abs(value)
    exponent = 0
    while magnitude and magnitude % 1000 == 0 and exponent < len(_CANONICAL_SUFFIXES) - 1:
        magnitude //= 1000
        exponent += 1
    return f"{sign}{magnitude}{_CANONICAL_SUFFIXES[exponent]}"
