"""The shared text helpers: natural order, tables, close matches, short reprs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdma_hca.kit.text import (
    closest,
    markdown_table,
    natural_key,
    natural_sorted,
    short_repr,
    text_table,
)


def test_natural_order_puts_2_before_10() -> None:
    names = ["mlx5_10", "mlx5_2", "mlx5_bond_0", "mlx5_1", "erdma_0"]
    assert natural_sorted(names) == ["erdma_0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_bond_0"]
    assert natural_sorted([("b", 10), ("a", 2)], key=lambda t: f"{t[0]}{t[1]}") == [
        ("a", 2), ("b", 10)]


@given(st.lists(st.text(alphabet="ab_019", max_size=6), max_size=20))
def test_natural_keys_always_compare(names: list[str]) -> None:
    # Mixed text and digit runs never compare str with int.
    assert sorted(names, key=natural_key) == natural_sorted(names)


def test_text_table_aligns_and_trims() -> None:
    assert text_table([["HCA", "PORT"], ["mlx5_10", "up"], ["x", ""]], indent="  ") == [
        "  HCA      PORT",
        "  mlx5_10  up",
        "  x",
    ]
    assert text_table([]) == []


def test_markdown_table_escapes_pipes() -> None:
    assert markdown_table(["a", "b"], [["x|y", "z"]]) == (
        "| a | b |\n|---|---|\n| x\\|y | z |")


def test_text_table_rule_under_the_header() -> None:
    assert text_table([["figure", "ours"], ["Allocate p50", "1 ms"]], rule="-") == [
        "figure        ours",
        "------------  ----",
        "Allocate p50  1 ms",
    ]
    assert text_table([["a", "b"], ["xy", ""]], rule="=", indent="  ")[1] == "  ==  ="


def test_markdown_table_aligns_columns() -> None:
    text = markdown_table(["what", "n", "ok"], [["x", "12", "yes"]],
                          align=["left", "right", "center"])
    assert text.splitlines()[1] == "|:---|---:|:---:|"
    assert markdown_table(["a", "b"], [], align=["", "right"]) == "| a | b |\n|---|---:|"


def test_markdown_table_refuses_alignments_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match=r"align names 1 column\(s\); the table has 2"):
        markdown_table(["a", "b"], [], align=["right"])
    with pytest.raises(ValueError, match="unknown alignment 'middle'"):
        markdown_table(["a"], [], align=["middle"])


def test_markdown_table_keeps_a_line_break_inside_its_cell() -> None:
    assert markdown_table(["a"], [["two\nlines"]]).splitlines()[2] == "| two lines |"


def test_closest() -> None:
    known = ["RDMA_HCA_SYSFS_ROOT", "RDMA_HCA_DEV_ROOT"]
    assert closest("RDMA_HCA_SYSFS_ROT", known) == "RDMA_HCA_SYSFS_ROOT"
    assert closest("SOMETHING_ELSE", known) is None


def test_short_repr_is_short_for_huge_values() -> None:
    assert short_repr("abc") == "'abc'"
    assert len(short_repr("x" * 10_000)) <= 82
    assert short_repr(list(range(10**5))) == "<a list of 100000 items>"
    assert short_repr({str(i): i for i in range(20)}) == "<a mapping of 20 entries>"
    assert "digits" in short_repr(10**5000)
    assert short_repr(True) == "True"
