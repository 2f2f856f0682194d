"""Limits on what a gRPC client may send, and how its values are shown back.

Every request comes from a local client we do not control; the kubelet is only the
expected one. Its values are echoed in error texts and log lines only as a short
prefix, so a request of megabytes never turns into a log line (or a gRPC trailer) of
megabytes.
"""

from __future__ import annotations

from collections.abc import Sequence

# The largest request the kubelet really sends: GetPreferredAllocation with every ID
# of the biggest pool in both lists. 100,000 slots (rdmaHcaMax's maximum) have IDs of
# 9 characters ("hca-99999"), 11 bytes each on the wire with tag and length: 1.1 MB a
# list, 2.2 MB for both. Exclusive pools have one ID per HCA (tens). 3 MiB (3.1 MB)
# leaves 40% more than that; anything larger is refused by gRPC before it is decoded.
MAX_RECEIVE_BYTES = 3 * 1024 * 1024

SHOWN_IDS = 5
SHOWN_CHARS = 64


def shorten(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` as it may appear in a message: cut to ``limit`` characters, quoted."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + f"... ({len(value)} characters)"


def shorten_ids(ids: Sequence[str], shown: int = SHOWN_IDS) -> str:
    """A few IDs, each cut short, then how many more there are."""
    head = ", ".join(i if _plain(i) else shorten(i) for i in ids[:shown])
    more = len(ids) - shown
    return head + (f" and {more} more" if more > 0 else "")


def _plain(value: str) -> bool:
    return len(value) <= SHOWN_CHARS and value.isprintable() and "," not in value
