"""Text helpers the tools and the daemon share: natural order, tables, close matches."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")

_DIGITS = re.compile(r"([0-9]+)")


def natural_key(text: str) -> tuple[str | int, ...]:
    """Sort key putting ``mlx5_2`` before ``mlx5_10`` (digit runs compare as numbers).

    ``re.split`` with a capturing group alternates text and digits, so positions hold
    the same type in every key and keys compare without mixing str and int.
    """
    parts = _DIGITS.split(text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def natural_sorted(items: Iterable[T], key: Callable[[T], str] | None = None) -> list[T]:
    """``items`` in natural order of their text (``key`` gives it; default ``str``)."""
    text = key if key is not None else str
    return sorted(items, key=lambda item: natural_key(text(item)))


def text_table(rows: Sequence[Sequence[str]], *, gap: int = 2, indent: str = "",
               rule: str = "") -> list[str]:
    """Rows as aligned columns, each column as wide as its widest cell, no trailing blanks.

    The first row is usually the header; every row must have the same number of cells.
    With ``rule`` (say ``"-"``), a line of it as wide as each column follows the first row.
    """
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    sep = " " * gap
    lines = [
        (indent + sep.join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))).rstrip()
        for row in rows
    ]
    if rule:
        lines.insert(1, (indent + sep.join(rule * w for w in widths)).rstrip())
    return lines


_ALIGN = {"": "---", "left": ":---", "right": "---:", "center": ":---:"}


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]], *,
                   align: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured markdown table; ``|`` inside cells is escaped and a line break
    becomes a space (either would end the cell or the row).

    ``align`` gives each column's alignment: "" (the renderer's default), "left", "right"
    or "center".
    """
    aligns = list(align) if align is not None else [""] * len(headers)
    if len(aligns) != len(headers):
        raise ValueError(f"align names {len(aligns)} column(s); the table has {len(headers)}")
    unknown = [a for a in aligns if a not in _ALIGN]
    if unknown:
        raise ValueError(f"unknown alignment {unknown[0]!r}; use one of "
                         + ", ".join(repr(a) for a in _ALIGN))

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    out = [line(headers), "|" + "|".join(_ALIGN[a] for a in aligns) + "|"]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice most like ``word`` (a likely typo of it), or None when none is close."""
    import difflib  # only on the way to an error message: a running daemon never needs it

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return found[0] if found else None


def short_repr(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: untrusted values stay one short line.

    Containers are summarised before ``repr`` runs, so a huge (or alias-expanded) value
    costs nothing to describe.
    """
    if isinstance(value, dict) and len(value) > 8:
        return f"<a mapping of {len(value)} entries>"
    if isinstance(value, list | tuple) and len(value) > 8:
        return f"<a list of {len(value)} items>"
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]
        return repr(value)[: limit + 1] + "…"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
