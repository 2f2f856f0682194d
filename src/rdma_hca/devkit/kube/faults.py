"""Faults tests inject into the fake API server: an error status (with ``Retry-After``), a
hang, a connection reset, or a hold until released, for the next requests matching a verb
and a part of the path."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Fault:
    """What the server does instead of answering the next ``times`` matching requests."""

    kind: str  # "status", "hang", "reset" or "hold"
    code: int = 500
    retry_after: str | None = None
    seconds: float = 0.0  # how long a hang lasts before the connection is closed
    method: str | None = None
    path: str = ""  # a part of the path the request must contain
    times: int = 1
    released: threading.Event = field(default_factory=threading.Event)  # ends a "hold"
    held: int = 0  # requests a "hold" has held so far
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def release(self) -> None:
        """Let the held requests (and every later one) through, answered as usual."""
        self.released.set()

    def wait_released(self, stopping: threading.Event) -> None:
        """Hold one request until ``release()`` (or the server stops)."""
        with self._lock:
            self.held += 1
        while not self.released.wait(0.02) and not stopping.is_set():
            pass

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and self.path in path


def take(faults: list[Fault], method: str, path: str) -> Fault | None:
    """The first fault still due for this request, counted down (callers hold the lock)."""
    for fault in faults:
        if fault.times > 0 and fault.matches(method, path):
            fault.times -= 1
            return fault
    return None


def reason_for(code: int) -> str:
    return {429: "TooManyRequests", 503: "ServiceUnavailable"}.get(code, "InternalError")
