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
    """Each distinct message said once for the life of the object."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def first(self, message: str) -> bool:
        """True the first time ``message`` comes (then say it), False after."""
        if message in self._said:
            return False
        self._said.add(message)
        return True
