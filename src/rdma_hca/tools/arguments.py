"""Argument types of the tools: a value that cannot be used is a usage error (status 2)
with the subcommand's usage, never a failed check with a misleading fix."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from urllib.parse import urlsplit


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
        if not os.path.exists(text):
            raise argparse.ArgumentTypeError(f"{text} does not exist: give the directory where "
                                             f"{what} is mounted")
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is not a directory: give the directory "
                                             f"where {what} is mounted")
        return text

    return existing_dir
