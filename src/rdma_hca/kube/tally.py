"""What the client sent and how long it waited for tokens, as plain counts.

The client counts into an :class:`ApiTally`; whoever reports it (the daemon's /metrics)
copies the counts when it likes. Nothing here knows who reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# client-go's rest_client_requests_total says this for a request that got no answer.
NO_ANSWER = "<error>"
# Server-side apply: the body is the fields the field manager wants, as YAML (JSON is YAML).
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass
class ApiTally:
    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    """Requests sent, by (resource, verb, code): each attempt, retries included."""
    waited: dict[str, float] = field(default_factory=dict)
    """Seconds spent waiting for a token, by budget."""

    def expect(self, requests: Iterable[tuple[str, str, str]], budgets: Iterable[str]) -> None:
        """Series that exist from the start, at 0."""
        for key in requests:
            self.requests.setdefault(key, 0)
        for name in budgets:
            self.waited.setdefault(name, 0.0)

    def sent(self, method: str, path: str, code: int | None,
             params: Mapping[str, str] | None = None, content_type: str | None = None
             ) -> None:
        resource, verb = resource_verb(method, path, params, content_type)
        self.requests[(resource, verb, NO_ANSWER if code is None else str(code))] += 1

    def wait(self, budget: str, seconds: float) -> None:
        self.waited[budget] = self.waited.get(budget, 0.0) + seconds


def resource_verb(method: str, path: str, params: Mapping[str, str] | None = None,
                  content_type: str | None = None) -> tuple[str, str]:
    """``("resourceclaims/status", "update")`` for a PUT of a claim's status: the
    resource (with its subresource) and the API server's verb, as its audit log says;
    a server-side apply is ``apply``, as the server's own apiserver_request_total says
    (its audit log would say ``patch``, which would not tell it from a merge patch)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if len(parts) > 2 and parts[0] == "namespaces":
        parts = parts[2:]
    resource = parts[0] if parts else ""
    named = len(parts) > 1
    if len(parts) > 2:
        resource += "/" + parts[2]
    if method == "GET":
        verb = "get" if named else ("watch" if (params or {}).get("watch") else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
        if method == "PATCH" and content_type == APPLY_PATCH:
            verb = "apply"
        if method == "DELETE":
            verb = "delete" if named else "deletecollection"
    return resource, verb or method.lower()
