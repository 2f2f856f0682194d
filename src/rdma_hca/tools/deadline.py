"""The read deadline the tools share with ``serve`` (``--read-deadline-seconds``)."""

from __future__ import annotations

import argparse

from rdma_hca.node.deadline_reader import DEFAULT_DEADLINE
from rdma_hca.settings.config import load_settings


def read_deadline(args: argparse.Namespace) -> float:
    """Seconds each sysfs read may take: the flag or variable, validated as serve does.

    The CLI fills in a validated float; a tool's ``main`` called directly may still hold
    the flag's text. A bad value raises ConfigError, which the CLI prints in one line.
    """
    value = getattr(args, "read_deadline_seconds", None)
    if value is None:
        return DEFAULT_DEADLINE
    if isinstance(value, float):
        return value
    return load_settings(None, {}, {"readDeadlineSeconds": value}).read_deadline_seconds
