"""Argument types of the tools: a value that cannot be used is a usage error (status 2)
with the subcommand's usage, never a failed check with a misleading fix."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from urllib.parse import urlsplit

from rdma_hca.settings.checks import mount_dir_problem


def http_url(text: str) -> str:
    """An http(s) URL with a host, e.g. http://127.0.0.1:9478/readyz."""
    try:
        parts = urlsplit(text)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 (a port out of range or not a number raises ValueError)
    except ValueError:
        usable = False
    if not usable:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// URL with a host: give e.g. "
            "http://127.0.0.1:9478/readyz")
    return text


def mounted_dir(what: str) -> Callable[[str], str]:
    """The argument type of a directory ``what`` is mounted at (``procfs``: /proc)."""

    def existing_dir(text: str) -> str:
        problem = mount_dir_problem(text, what)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    return existing_dir
