"""Refusals as the API server words them: an HTTP code and a ``Status`` object."""

from __future__ import annotations

from typing import Any


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.details = details or {}


def status_object(code: int, reason: str, message: str,
                  details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details or {}, "code": code}


def not_found() -> HttpError:
    return HttpError(404, "NotFound", "the server could not find the requested resource")
