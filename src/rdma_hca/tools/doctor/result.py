"""The verdict record every doctor and check report is made of."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rdma_hca.kit.exitcodes import EXIT_USAGE

# Where doctor --node asks for readiness outside the plugin's pod (the chart's metrics port).
DEFAULT_READYZ_URL = "http://127.0.0.1:9478/readyz"


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict: what was checked, on what, the finding, and the fix when it failed."""

    subject: str  # "cluster", "node", "container" or a node name
    name: str
    ok: bool
    detail: str
    fix: str | None = None


def parse_command(
    command: str,
    add_parser: Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None],
    argv: Sequence[str] | None,
) -> argparse.Namespace | int:
    """Parse ``rdma-hca COMMAND ARGV...`` for a command run as a function.

    Returns the namespace, or the exit status argparse chose (2 for a usage error)
    instead of raising SystemExit, so tests and callers get a status back.
    """
    parser = argparse.ArgumentParser(prog="rdma-hca")
    add_parser(parser.add_subparsers(dest="command", required=True))
    try:
        return parser.parse_args([command, *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
