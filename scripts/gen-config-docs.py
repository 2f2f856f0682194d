"""Regenerate the settings table of docs/configuration.md from the declaration.

    .venv/bin/python scripts/gen-config-docs.py          # rewrite the table
    .venv/bin/python scripts/gen-config-docs.py --check  # exit 1 when it is out of date

The table comes from ``rdma_hca.settings.decl.SETTINGS``; a test fails when the
committed page differs, so a new or changed setting is documented in the same commit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rdma_hca.settings.decl import with_docs_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main(argv: list[str]) -> int:
    current = PAGE.read_text(encoding="utf-8")
    wanted = with_docs_table(current)
    if "--check" in argv:
        if current != wanted:
            print(f"{PAGE} is out of date: run python scripts/gen-config-docs.py",
                  file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        PAGE.write_text(wanted, encoding="utf-8")
        print(f"rewrote the settings table in {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
