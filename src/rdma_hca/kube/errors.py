"""What can go wrong talking to the API server: each a one-line, actionable message."""

from __future__ import annotations


class KubeError(Exception):
    """Any failure talking to the cluster; ``str()`` is a one-line, actionable message."""

    status = 0  # the HTTP status, 0 when the server gave none
    retry_after: float | None = None  # seconds the server asked to wait (Retry-After)


class KubeconfigError(KubeError):
    """No usable credentials: no kubeconfig, or one that cannot be read or used."""


class ApiError(KubeError):
    """The API server answered with an error status."""

    def __init__(self, message: str, status: int, reason: str = "",
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # the Status object's reason (Conflict, NotFound, Invalid...)
        # The seconds the server's Retry-After asked, as it said them (no cap): a caller
        # that gives up on the call still knows when the server wants to hear from it.
        self.retry_after = retry_after


class NotFoundError(ApiError):
    """404: the object asked for does not exist."""


class ConflictError(ApiError):
    """409: the object changed since it was read, or already exists."""


class UnreachableError(KubeError):
    """The API server did not answer (refused, timed out, reset, DNS, TLS)."""
