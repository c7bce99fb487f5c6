"""Resource quantities: the API server's grammar parsed exactly, integers rounded up, and
the canonical form written as the API server stores it."""

from __future__ import annotations

from decimal import ROUND_UP, Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as official_parse

from lj_runtimekit.proto.pkg.quantity import (
    QuantityError,
    format_quantity,
    parse_quantity,
    quantity_value,
)
from lj_runtimekit.testkit.imports import official_client_loaded_by


@pytest.mark.parametrize(
    ("text", "milli", "expected"),
    [
        ("1.5Gi", False, 3 * 2**29),
        ("2e3", False, 2000),
        ("0.5", True, 500),
        ("1.5", True, 1500),
        ("250M", False, 250 * 10**6),
        ("1.5k", False, 1500),
        ("12n", True, 1),  # rounded up, as Quantity.MilliValue
        ("0.5", False, 1),
        ("1500m", False, 2),
        ("1e-3", True, 1),
        ("1E", False, 10**18),  # the suffix E (exa), not an exponent
        ("1E3", False, 1000),
        (".5", True, 500),
        ("8", True, 8000),
        (8, False, 8),  # an int from decoded JSON
        ("-1500m", False, -2),  # away from zero, as Quantity.Value
    ],
)
def test_quantities_with_fractions_and_exponents(text: str, milli: bool, expected: int) -> None:
    assert quantity_value(text, milli) == expected


@pytest.mark.parametrize(
    "text",
    ["abc", "1ki", "1.2.3", "Gi", "NaN", "1X", "m", "1K", " 1", "1 Gi", "1_000", "Infinity"],
)
def test_bad_quantities_are_refused_naming_the_text(text: str) -> None:
    with pytest.raises(QuantityError, match=f"invalid quantity {text!r}"):
        quantity_value(text)


@pytest.mark.parametrize("text", ["1e65", "1e-200", "1" + "0" * 70, "9" * 65 + "m"])
def test_quantities_beyond_exact_range_are_refused_not_rounded(text: str) -> None:
    with pytest.raises(QuantityError, match="out of range"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (100, "100"),
        (1000, "1k"),
        (85899346000, "85899346k"),
        (858993460, "858993460"),
        (10**9, "1G"),
        (10**21, "1000E"),
        (-5000, "-5k"),
    ],
)
def test_quantities_are_written_as_the_api_server_stores_them(value: int, text: str) -> None:
    assert format_quantity(value) == text
    assert parse_quantity(text) == value


@given(st.integers(min_value=-(10**30), max_value=10**30))
def test_a_written_quantity_reads_back_equal(value: int) -> None:
    assert parse_quantity(format_quantity(value)) == value


# At most 9 significant digits: the official parser rounds to 28, and 2**60 has 19.
_NUMBERS = st.from_regex(r"\A[+-]?(?:[0-9]{1,6}(?:\.[0-9]{0,3})?|\.[0-9]{1,3})\Z")
_SUFFIXES = st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E"]) | st.sampled_from(
    ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
)


@given(_NUMBERS, _SUFFIXES)
def test_valid_quantities_parse_as_the_official_client_does(number: str, suffix: str) -> None:
    text = number + suffix
    assert parse_quantity(text) == official_parse(text)


@given(_NUMBERS, _SUFFIXES, st.booleans())
def test_integers_are_the_exact_value_rounded_away_from_zero(
    number: str, suffix: str, milli: bool
) -> None:
    exact = parse_quantity(number + suffix) * (1000 if milli else 1)
    rounded = exact.to_integral_value(rounding=ROUND_UP)
    assert quantity_value(number + suffix, milli) == rounded


@given(_NUMBERS, st.integers(min_value=-20, max_value=20))
def test_exponents_parse_as_the_official_client_does(number: str, exponent: int) -> None:
    text = f"{number}e{exponent}"
    assert parse_quantity(text) == Decimal(text) == official_parse(text)


def test_the_module_does_not_import_the_official_client() -> None:
    assert official_client_loaded_by("lj_runtimekit.proto.pkg.quantity") == []
