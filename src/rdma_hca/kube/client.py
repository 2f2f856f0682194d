"""One client for the Kubernetes API server, with client-go's manners.

Requests go out as JSON over lightkube's HTTP stack (its kubeconfig handling: TLS, tokens
and token files, client certificates, exec credential plugins), by path, and come back as
plain dicts: no model layer between the driver and the objects the server holds.

- Every request takes a token of a client-side rate limit first (QPS and burst; client-go's
  defaults are 5 and 10), so a loop gone wrong cannot flood the API server. A request may
  name another budget of the client's (``rate``) and yield to the rest of its own
  (``priority``): work someone waits for need not queue behind work nobody waits for.
- 429 and 503 are backpressure: the client waits what ``Retry-After`` says (or a growing,
  jittered backoff when the server says nothing) and tries again; any other 5xx is retried
  only when the server sent ``Retry-After``, as client-go does.
  A call that gives up (its retries or its budget used up) raises an error that still
  carries the server's ``Retry-After``, whatever its length, so that a caller with work of
  its own to pace (the claim status writer) waits what the server asked.
- A GET whose connection was reset is tried again; a write is not (it may have happened).
- ``apply`` is server-side apply (``application/apply-patch+yaml``, a field manager):
  the server merges what one manager owns with what others own.
- One exchange is bounded by ``timeout``, a call with its retries by ``budget``: a caller
  always gets an answer or a one-line error in bounded time. Both count from when the
  request first goes out, not from when it was asked for: time spent waiting for a token
  never shortens the exchange (requests queued together do not share a shrinking budget).
- What went out, by resource, verb and code, and the seconds spent waiting for tokens,
  are counted in ``tally`` (a plain record: whoever reports it reads it).

lightkube and its HTTP stack load only when a client is built: a daemon that runs only the
device plugin never imports them. A daemon that registers with the kubelet first makes its
clients with :meth:`ApiClient.starting`: the client exists at once (its credentials read,
its rate limits and tally made), its HTTP client (those imports, the TLS context) is built
off the loop, at once or from its first request on, and a request made before it is done
waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rdma_hca import __version__
from rdma_hca.kit.backoff import Backoff, Clock, Sleep
from rdma_hca.kit.offloop import OffLoop, Stalled
from rdma_hca.kit.workers import WORKERS
from rdma_hca.kube.credentials import Credentials, CredentialSearch, load_credentials
from rdma_hca.kube.errors import (
    ApiError,
    ConflictError,
    KubeconfigError,
    KubeError,
    NotFoundError,
    UnreachableError,
)
from rdma_hca.kube.policy import ClientPolicy, Priority, TokenBucket, retry_after
from rdma_hca.kube.tally import APPLY_PATCH, ApiTally

T = TypeVar("T")
# Builds the HTTP client of some credentials with one exchange's timeout (blocking: it
# imports lightkube's HTTP stack and reads certificate files).
HttpBuilder = Callable[["Credentials", float], Any]

# Who writes, as the API server records it: the User-Agent of every request and the field
# manager of every create, update and merge patch (``kubectl get -o yaml
# --show-managed-fields``). Without a fieldManager the server names the writer after the
# User-Agent's product, the HTTP library's name unless set. A server-side apply names its
# manager itself (``apply``): ownership there must outlast a version change.
AGENT = f"rdma-hca/{__version__}"
_WRITES = frozenset({"POST", "PUT", "PATCH"})

log = logging.getLogger(__name__)

def _build_http(creds: Credentials, timeout: float) -> Any:
    import httpx2
    from lightkube import KubeConfig
    from lightkube.config.client_adapter import AsyncClient, ConnectionParams, user_auth
    from lightkube.core.exceptions import ConfigError as LightkubeConfigError

    # httpx logs every request at INFO: a line per slice write is noise in a node daemon.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        config = KubeConfig.from_dict(dict(creds.kubeconfig), fname=creds.base).get()
        if config is None:
            raise KubeconfigError(f"{creds.source}: no context to use: fix the kubeconfig")
        # Proxies come from the kubeconfig or the environment given to load_credentials.
        params = ConnectionParams(timeout=httpx2.Timeout(timeout), trust_env=False,
                                  proxy=creds.proxy)
        if urllib.parse.urlsplit(creds.server).scheme == "http":
            # Plain HTTP uses nothing of TLS: lightkube would still load the system trust
            # store (over a MiB) for a server without certificate-authority. The rest is
            # lightkube's: its auth of the kubeconfig's user, the same parameters.
            return httpx2.AsyncClient(base_url=config.cluster.server, verify=False,
                                      auth=user_auth(config.user), timeout=params.timeout,
                                      trust_env=False, proxy=creds.proxy)
        return AsyncClient(config, params)
    except ssl.SSLError as exc:
        raise KubeconfigError(f"{creds.source}: a certificate or key is not valid PEM "
                          f"({exc.reason or exc}): fix the kubeconfig") from exc
    except OSError as exc:
        raise KubeconfigError(f"{creds.source}: cannot read a certificate or key "
                          f"({exc.strerror or exc}): fix the kubeconfig") from exc
    except (LightkubeConfigError, ValueError, TypeError, AssertionError) as exc:
        raise KubeconfigError(f"{creds.source}: {exc}: fix the kubeconfig") from exc
    except ImportError as exc:  # e.g. a socks5:// proxy-url without socksio installed
        raise KubeconfigError(f"{creds.source}: {exc}") from exc


class _Transports:
    """The HTTP clients of one process, one per event loop and credentials: every API client
    on them shares one TLS context (with its trust store, over a MiB each) and one pool of
    connections. The last user to close one closes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[int, str], list[Any]] = {}  # key -> [client, users]

    def take(self, loop: int, creds: Credentials, timeout: float,
             build: HttpBuilder = _build_http) -> tuple[Any, tuple[int, str]]:
        key = (loop, json.dumps([creds.kubeconfig, str(creds.base), creds.proxy],
                                sort_keys=True, default=str))
        with self._lock:
            held = self._open.get(key)
            if held is None:
                held = self._open[key] = [build(creds, timeout), 0]
            held[1] += 1
            return held[0], key

    def give_back(self, key: tuple[int, str]) -> Any | None:
        """The client to close when this was its last user, else None."""
        with self._lock:
            held = self._open[key]
            held[1] -= 1
            if held[1] > 0:
                return None
            del self._open[key]
            return held[0]


_TRANSPORTS = _Transports()


def _exchange_timeout(seconds: float) -> Any:
    """Each client's own, on a shared HTTP client built with another's."""
    import httpx2

    return httpx2.Timeout(seconds)


async def off_loop(off: OffLoop | None, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` off the event loop: on ``off`` within its deadline, else on a thread."""
    if off is None:
        return await WORKERS.run(fn, "rdma-hca-kube")
    try:
        return await off.run(what, fn)
    except Stalled as exc:
        raise KubeError(str(exc)) from exc


async def read_credentials(kubeconfig: str | None, accepts: CredentialSearch, *,
                           off: OffLoop | None = None) -> Credentials:
    """A daemon's credentials, searched as ``accepts`` says in the process environment and
    home; the files are read off the loop (within ``off``'s deadline when given)."""
    env, home = dict(os.environ), Path.home()
    return await off_loop(off, "reading the API server credentials", lambda: load_credentials(
        kubeconfig=kubeconfig, context=None, env=env, home=home, accepts=accepts))


class ApiClient:
    """``await request(method, path, body=...)`` -> the object the server answered."""

    def __init__(self, creds: Credentials, policy: ClientPolicy | None = None, *,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 rng: random.Random | None = None, loop: int | None = None,
                 build: HttpBuilder | None = None, later: bool = False) -> None:
        """``loop``: the id of the event loop the client will run on; clients given one
        share their HTTP client with the others of that loop on the same credentials.
        ``build`` makes the HTTP client (lightkube's when None); ``later``: not now
        (:meth:`starting` does it)."""
        self.creds = creds
        self.policy = policy or ClientPolicy()
        self._loop = loop
        self._build = build or _build_http
        self._http: Any = None
        self._timeout: Any = None
        self._shared: tuple[int, str] | None = None
        self._building: asyncio.Future[None] | None = None  # done once built (or failed)
        self._build_task: asyncio.Task[None] | None = None
        self._off: OffLoop | None = None
        self._closed = False
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.limiter = TokenBucket(self.policy.qps, self.policy.burst, clock=clock, sleep=sleep)
        self.limiters = {self.policy.rate_name: self.limiter}
        for rate in self.policy.rates:
            self.limiters[rate.name] = TokenBucket(rate.qps, rate.burst, clock=clock,
                                                   sleep=sleep)
        self.tally = ApiTally()
        self.tally.expect((), self.limiters)
        if not later:
            self._make_http()

    def _make_http(self) -> None:
        """Build (or share) the HTTP client. Blocking: see :data:`HttpBuilder`."""
        if self._loop is None:
            http, shared = self._build(self.creds, self.policy.timeout), None
        else:
            http, shared = _TRANSPORTS.take(self._loop, self.creds, self.policy.timeout,
                                            self._build)
        self._timeout = _exchange_timeout(self.policy.timeout)
        self._http, self._shared = http, shared

    @classmethod
    def starting(cls, creds: Credentials, policy: ClientPolicy | None = None, *,
                 off: OffLoop | None = None, now: bool = True, **kw: Any) -> ApiClient:
        """The client now, its HTTP client built off the event loop (with ``off``, the
        daemon's, within its deadline): at once, or with ``now`` False when :meth:`begin`
        is called or the first request is made. Requests wait for it; :meth:`ready` says
        whether it could be built."""
        loop = asyncio.get_running_loop()
        client = cls(creds, policy, loop=id(loop), later=True, **kw)
        client._off = off
        building = client._building = loop.create_future()
        # Its error is the requests' and ready()'s to raise, not the loop's to report.
        building.add_done_callback(lambda done: done.cancelled() or done.exception())
        if now:
            client.begin()
        return client

    def begin(self) -> None:
        """Start building the HTTP client, unless it is built or being built."""
        building = self._building
        if building is None or self._build_task is not None or building.done():
            return

        def settle(task: asyncio.Task[None]) -> None:
            if building.done():
                return
            if task.cancelled():
                building.set_exception(KubeError("building the API client was cancelled"))
            elif (exc := task.exception()) is not None:
                building.set_exception(exc)
            else:
                building.set_result(None)

        self._build_task = asyncio.get_running_loop().create_task(
            off_loop(self._off, "reading the API server's certificates", self._make_http),
            name="kube-client-build")
        self._build_task.add_done_callback(settle)

    @classmethod
    async def connect(cls, creds: Credentials, policy: ClientPolicy | None = None, *,
                      off: OffLoop | None = None, **kw: Any) -> ApiClient:
        """Build the client off the event loop (it reads certificate files); with ``off``
        (the daemon's), within its deadline, so a hung filesystem cannot hold a stop."""
        client = cls.starting(creds, policy, off=off, **kw)
        try:
            await client.ready()
        except BaseException:
            await client.close()
            raise
        return client

    async def ready(self) -> None:
        """Return once the HTTP client is built; raise the :class:`KubeError` that kept it
        from being built (a certificate that is not PEM, a read past its deadline)."""
        if self._building is not None:
            self.begin()
            # Shielded: a caller given up on does not stop the build for the others.
            await asyncio.shield(self._building)

    @property
    def server(self) -> str:
        return self.creds.server

    async def close(self) -> None:
        building = self._building
        if building is not None and not building.done():
            if self._build_task is None:  # never begun: nothing to give back
                building.set_exception(KubeError("the API client was closed before it "
                                                 "was built"))
                return
            # What the build makes must be given back: it is bounded by its deadline.
            with contextlib.suppress(Exception):
                await asyncio.shield(building)
        if self._http is None:
            return  # never built
        if self._shared is not None:
            if self._closed:
                return  # its share is given back already
            self._closed = True
            http = _TRANSPORTS.give_back(self._shared)
            if http is not None:
                await http.aclose()
            return
        await self._http.aclose()

    async def get(self, path: str, params: Mapping[str, str] | None = None, *,
                  rate: str | None = None, priority: Priority = Priority.HIGH
                  ) -> dict[str, Any]:
        return await self.request("GET", path, params=params, rate=rate, priority=priority)

    async def apply(self, path: str, body: Mapping[str, Any], *, field_manager: str,
                    force: bool = True, rate: str | None = None,
                    priority: Priority = Priority.HIGH) -> dict[str, Any]:
        """Server-side apply of ``body`` at ``path`` as ``field_manager``; ``force`` takes
        over fields another manager set (their owner loses them, no 409)."""
        params = {"fieldManager": field_manager, **({"force": "true"} if force else {})}
        return await self.request("PATCH", path, body=body, params=params, rate=rate,
                                  priority=priority, content_type=APPLY_PATCH)

    async def request(self, method: str, path: str, *, body: Any = None,
                      params: Mapping[str, str] | None = None, rate: str | None = None,
                      priority: Priority = Priority.HIGH,
                      content_type: str | None = None) -> dict[str, Any]:
        """One API call with its retries; raises a :class:`KubeError` on failure.

        ``rate`` names the budget it takes tokens from (the policy's ``rates``; None: the
        client's own); ``priority`` LOW lets every HIGH request of that budget go first.
        ``content_type`` of the body: None is JSON, and a JSON merge patch for a PATCH.
        """
        await self.ready()
        if method in _WRITES and content_type != APPLY_PATCH and not (
                params and "fieldManager" in params):
            params = {**(params or {}), "fieldManager": AGENT}
        name = rate or self.policy.rate_name
        try:
            limiter = self.limiters[name]
        except KeyError:
            raise ValueError(f"no rate limit named {name!r}: the client has "
                             f"{', '.join(sorted(self.limiters))}") from None
        backoff = Backoff(self.policy.backoff_first, self.policy.backoff_max, rng=self._rng)
        attempt = 0
        deadline: float | None = None
        while True:
            self.tally.wait(name, await limiter.take(priority))
            if deadline is None:  # from the first exchange on: a token's wait is not in it
                deadline = self._clock() + self.policy.call_deadline
            # One exchange never outlives the call's deadline.
            limit = max(0.05, min(self.policy.timeout, deadline - self._clock()))
            outcome, wait = await self._once(method, path, body, params, limit, content_type)
            if isinstance(outcome, dict):
                return outcome
            error = outcome
            if wait is None or attempt >= self.policy.max_retries:
                raise error
            wait = wait if wait > 0 else backoff.next()
            if self._clock() + wait > deadline:
                raise error
            attempt += 1
            log.debug("%s; trying again in %.2f s", error, wait)
            await self._sleep(wait)

    async def _once(self, method: str, path: str, body: Any, params: Mapping[str, str] | None,
                    limit: float, content_type: str | None = None
                    ) -> tuple[dict[str, Any] | KubeError, float | None]:
        """The answer, or (error, None when not to retry / seconds to wait / 0: backoff)."""
        import httpx2
        from lightkube.core.exceptions import ConfigError as LightkubeConfigError

        headers = {"Accept": "application/json", "User-Agent": AGENT}
        content: bytes | None = None
        if body is not None:
            content = json.dumps(body).encode()
            # A PATCH is a JSON merge patch (RFC 7386) unless said otherwise: the server
            # refuses plain JSON there. An apply patch is YAML, and JSON is YAML.
            headers["Content-Type"] = content_type or (
                "application/merge-patch+json" if method == "PATCH" else "application/json")
        url = self.server + path
        source = self.creds.source
        try:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for hands back the
                # answer when a cancel lands as it comes in, and a stopped loop goes on.
                async with asyncio.timeout(limit):
                    resp = await self._http.request(method, path, content=content,
                                                    params=params, headers=headers,
                                                    timeout=self._timeout)
            except BaseException:
                self.tally.sent(method, path, None, params, content_type)
                raise
            self.tally.sent(method, path, resp.status_code, params, content_type)
        except (TimeoutError, httpx2.TimeoutException):
            return UnreachableError(f"{method} {url}: no answer within {limit:.3g} s"), None
        except httpx2.TransportError as exc:
            error = _unreachable(exc, self.creds)
            reset = isinstance(exc, httpx2.RemoteProtocolError) or isinstance(
                _root_cause(exc), ConnectionResetError)
            return error, (0.0 if reset and method == "GET" else None)
        except LightkubeConfigError as exc:
            # An exec credential plugin that failed: lightkube says which and its stderr.
            return KubeconfigError(f"{source}: {' '.join(str(exc).split())}"), None
        except OSError as exc:
            return KubeconfigError(f"{source}: {_exec_failure(self.creds, exc)}"), None
        except (KeyError, json.JSONDecodeError):
            return KubeconfigError(
                f"{source}: the exec credential plugin did not print an ExecCredential with "
                "status.token; use a plugin that issues tokens"), None
        code = resp.status_code
        if code >= 400:
            return _api_error(method, url, resp), _retry_wait(code, resp)
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return ApiError(f"{method} {url} returned something that is not a Kubernetes "
                            f"object: is {self.server} a Kubernetes API server?", code), None
        return answer, None


def _retry_wait(code: int, resp: Any) -> float | None:
    hint = retry_after(resp.headers.get("Retry-After"))
    if code in (429, 503):
        return hint if hint is not None else 0.0
    if code >= 500 and hint is not None:
        return hint
    return None


def _api_error(method: str, url: str, resp: Any) -> ApiError:
    code = int(resp.status_code)
    message, reason = "", ""
    try:
        status = resp.json()
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status":
        message = str(status.get("message") or "")
        reason = str(status.get("reason") or "")
    else:
        message = resp.text.strip()[:200]
    text = f"{method} {url}: HTTP {code}" + (f": {message}" if message else "")
    kind = {404: NotFoundError, 409: ConflictError}.get(code, ApiError)
    # Uncapped: the cap of a wait inside one call is not the caller's cap.
    return kind(text, code, reason,
                retry_after(resp.headers.get("Retry-After"), most=float("inf")))


def _unreachable(exc: BaseException, creds: Credentials) -> UnreachableError:
    cause = _root_cause(exc)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return UnreachableError(
            f"TLS verification of the API server {creds.server} failed "
            f"({cause.verify_message}): check certificate-authority in {creds.source}")
    reason = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return UnreachableError(
        f"API server {creds.server} is unreachable ({reason}): check the server URL in "
        f"{creds.source} and that the cluster is up")


def _root_cause(exc: BaseException) -> BaseException:
    """The certificate error behind a failed connection if there is one, else the deepest
    cause (the OSError that says "connection refused")."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 20:
        chain.append(current)
        current = current.__cause__ or current.__context__
    for cause in chain:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause
    return chain[-1]


def _exec_failure(creds: Credentials, exc: OSError) -> str:
    users = creds.kubeconfig.get("users") or [{}]
    spec = users[0].get("user", {}).get("exec") or {}
    command = spec.get("command", "?")
    hint = " ".join(str(spec.get("installHint") or "").split())
    return (f"cannot run the exec credential plugin {command!r} ({exc.strerror or exc})"
            + (f": {hint}" if hint else ": install it or fix its path in the kubeconfig"))
