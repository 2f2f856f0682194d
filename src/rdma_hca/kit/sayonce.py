"""Saying a problem once per reason, not once per poll: the one mechanism for it.

A daemon that polls meets the same problem on every pass; an operator wants one line
when it starts, one when its reason changes, and one when it is over.
"""

from __future__ import annotations


class Latch:
    """The current reason something is wrong, or None; says when to speak."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def set(self, reason: str) -> bool:
        """Record ``reason``; True when it is new (then say it)."""
        if reason == self.reason:
            return False
        self.reason = reason
        return True

    def clear(self) -> bool:
        """Nothing is wrong any more; True when something was (then say it is over)."""
        was, self.reason = self.reason, None
        return was is not None


class Once:
    """Each distinct message said once for the life of the object.

    With ``limit``, at most that many are remembered: when more come (messages that name
    ever new things), the memory starts over, and a message may be said once more.
    """

    def __init__(self, limit: int | None = None) -> None:
        self._said: set[str] = set()
        self._limit = limit

    def first(self, message: str) -> bool:
        """True the first time ``message`` comes (then say it), False after."""
        if message in self._said:
            return False
        if self._limit is not None and len(self._said) >= self._limit:
            self._said.clear()
        self._said.add(message)
        return True
