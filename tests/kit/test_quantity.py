"""Quantities, ages and label selectors print exactly as kubectl prints them."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdma_hca.kit.quantity import (
    Quantity,
    QuantityError,
    QuantityFormat,
    canonical,
    parse_quantity,
)
from rdma_hca.tools.doctor.clusternodes import human_duration


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("1k", "1k"),
        ("1000", "1k"),  # what the kubelet reports for 1000 devices
        ("999", "999"),
        ("1500", "1500"),
        ("1.5k", "1500"),
        ("0", "0"),
        ("500m", "500m"),
        ("0.5", "500m"),
        ("2Ki", "2Ki"),
        ("2048", "2048"),  # decimal text stays decimal
        ("1536Mi", "1536Mi"),
        ("0.5Ki", "512"),  # below 1024 a binary value prints in decimal
        ("1e3", "1e3"),
        ("1E3", "1e3"),
        ("64M", "64M"),
        ("1000000", "1M"),
        ("2112881480Ki", "2112881480Ki"),
        ("189280m", "189280m"),
        ("1.0000000001", "1000000001n"),  # finer than nano rounds up
        ("-1k", "-1k"),
        ("400000000000", "400G"),  # a 400 Gb/s HCA's bandwidth capacity
        ("2.5G", "2500M"),
        ("1000000000000000000000", "1e21"),  # past exa: exponent form, as kubectl
        ("1e24", "1e24"),
        ("12e3", "12e3"),
        ("1e2", "100"),
    ],
)
def test_canonical_form(text: str, shown: str) -> None:
    assert canonical(text) == shown


def test_parsed_values_are_exact() -> None:
    assert parse_quantity("2Ki") == Quantity(Fraction(2048), QuantityFormat.BINARY_SI)
    assert parse_quantity("500m").value == Fraction(1, 2)
    assert int(parse_quantity("1500m")) == 2  # whole units round up, like Value()
    assert parse_quantity("1k").value > parse_quantity("999").value


@pytest.mark.parametrize("text", ["", "k", "1kk", "1 k", "one", "1Ki2", "1e", "--1"])
def test_bad_quantities_say_what_is_allowed(text: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=10**15))
def test_decimal_round_trip(n: int) -> None:
    assert parse_quantity(canonical(str(n))).value == n


@given(st.integers(min_value=0, max_value=2**50))
def test_binary_round_trip(n: int) -> None:
    text = canonical(f"{n}Ki")
    assert parse_quantity(text).value == n * 1024


@pytest.mark.parametrize(
    ("seconds", "age"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (42, "42s"),
        (119, "119s"),
        (7 * 60 + 12, "7m12s"),
        (8 * 60, "8m"),
        (42 * 60, "42m"),
        (5 * 3600 + 3 * 60, "5h3m"),
        (5 * 3600, "5h"),
        (17 * 3600 + 59 * 60, "17h"),
        (5 * 86400 + 3 * 3600, "5d3h"),
        (3 * 86400, "3d"),
        (20 * 86400, "20d"),
        (3 * 365 * 86400 + 10 * 86400, "3y10d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_age_like_kubectl(seconds: int, age: str) -> None:
    assert human_duration(seconds) == age
