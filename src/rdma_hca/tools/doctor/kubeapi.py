"""A minimal, read-only Kubernetes API client: credentials plus GET of JSON.

``doctor`` needs three GETs (nodes, one DaemonSet, its pods). Pulling in the official client
for that would add a large dependency to an image that must stay small, so this module reads
a kubeconfig (or the in-cluster service account) with the standard library and PyYAML.

Every failure becomes a :class:`KubeError` whose message says what went wrong and how to fix
it; callers print it as one line instead of a traceback.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import ssl
import tempfile
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_TIMEOUT = 10.0
SERVICE_ACCOUNT_DIR = "var/run/secrets/kubernetes.io/serviceaccount"


class KubeError(Exception):
    """Any failure talking to the cluster; ``str()`` is a one-line, actionable message."""


class ConfigError(KubeError):
    """No usable credentials: no kubeconfig, or one that cannot be read or used."""


class ApiError(KubeError):
    """The API server answered with an error status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class NotFoundError(ApiError):
    """404: the object asked for does not exist."""


class UnreachableError(KubeError):
    """The API server did not answer (refused, timed out, DNS, TLS)."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to prove who we are.

    Certificates are kept as PEM bytes (not paths) so ``*-data`` and file forms are handled
    alike; they reach ``ssl`` only through short-lived temporary files.
    """

    server: str
    source: str  # where these came from, named in error messages
    ca_pem: bytes | None = None
    insecure: bool = False
    token: str | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    username: str | None = None
    password: str | None = None


def load_credentials(
    *,
    kubeconfig: str | None,
    context: str | None,
    env: Mapping[str, str],
    home: Path,
    in_cluster_root: Path = Path("/"),
) -> Credentials:
    """Find credentials the way kubectl does, falling back to the in-cluster service account.

    Order: ``--kubeconfig``, then ``$KUBECONFIG`` (first existing file of the list), then
    ``~/.kube/config``, then the pod's service account when ``KUBERNETES_SERVICE_HOST`` is set.
    """
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise ConfigError(f"kubeconfig {path} does not exist: pass an existing file to "
                              "--kubeconfig")
        return _from_kubeconfig(path, context)
    for entry in env.get("KUBECONFIG", "").split(os.pathsep):
        if entry and Path(entry).expanduser().is_file():
            return _from_kubeconfig(Path(entry).expanduser(), context)
    default = home / ".kube" / "config"
    if default.is_file():
        return _from_kubeconfig(default, context)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return _in_cluster(env, in_cluster_root)
    raise ConfigError(
        "no kubeconfig found (looked at --kubeconfig, $KUBECONFIG and "
        f"{default}, and not running in a pod): pass --kubeconfig FILE or set KUBECONFIG"
    )


def _in_cluster(env: Mapping[str, str], root: Path) -> Credentials:
    sa_dir = root / SERVICE_ACCOUNT_DIR
    token_file = sa_dir / "token"
    try:
        token = token_file.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"running in a pod but cannot read the service account token {token_file} "
            f"({exc.strerror}): set automountServiceAccountToken: true on the pod"
        ) from exc
    ca_file = sa_dir / "ca.crt"
    ca = ca_file.read_bytes() if ca_file.is_file() else None
    host = env["KUBERNETES_SERVICE_HOST"]
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 service address needs brackets in a URL
        host = f"[{host}]"
    return Credentials(
        server=f"https://{host}:{port}",
        source="in-cluster service account",
        ca_pem=ca,
        token=token,
    )


def _from_kubeconfig(path: Path, context_name: str | None) -> Credentials:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read kubeconfig {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(
            f"kubeconfig {path} is not valid YAML{where}: fix the file or pass another "
            "with --kubeconfig"
        ) from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"kubeconfig {path} is not a kubeconfig (expected a mapping with "
                          "clusters, users and contexts)")
    name = context_name or doc.get("current-context")
    if not name:
        raise ConfigError(f"kubeconfig {path} has no current-context: pass --context NAME "
                          "or run kubectl config use-context NAME")
    ctx = _named(doc, "contexts", "context", str(name), path)
    cluster = _named(doc, "clusters", "cluster", _str_field(ctx, "cluster", path), path)
    user_name = ctx.get("user")
    user = _named(doc, "users", "user", str(user_name), path) if user_name else {}
    return _credentials(path, str(name), cluster, user)


def _named(doc: dict[str, Any], key: str, inner: str, name: str, path: Path) -> dict[str, Any]:
    entries = doc.get(key) or []
    if not isinstance(entries, list):
        raise ConfigError(f"kubeconfig {path}: {key} must be a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(inner)
            if not isinstance(body, dict):
                raise ConfigError(f"kubeconfig {path}: {key} entry {name!r} has no {inner}")
            return body
    known = ", ".join(str(e.get("name")) for e in entries if isinstance(e, dict)) or "none"
    raise ConfigError(f"kubeconfig {path}: no {inner} named {name!r} in {key} (known: {known})")


def _str_field(body: Mapping[str, Any], key: str, path: Path) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"kubeconfig {path}: {key} is missing or not a string")
    return value


def _pem(body: Mapping[str, Any], key: str, base: Path, path: Path) -> bytes | None:
    """Read ``key-data`` (base64) or ``key`` (a file, relative to the kubeconfig's folder)."""
    data = body.get(f"{key}-data")
    if data:
        try:
            return base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"kubeconfig {path}: {key}-data is not valid base64") from exc
    file = body.get(key)
    if file:
        target = (base / str(file)).expanduser()
        try:
            return target.read_bytes()
        except OSError as exc:
            raise ConfigError(f"kubeconfig {path}: cannot read {key} {target}: "
                              f"{exc.strerror}") from exc
    return None


def _credentials(
    path: Path, context: str, cluster: Mapping[str, Any], user: Mapping[str, Any]
) -> Credentials:
    server = _str_field(cluster, "server", path)
    parsed = urllib.parse.urlsplit(server)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"kubeconfig {path}: cluster server {server!r} is not an http(s) URL")
    if "exec" in user or "auth-provider" in user:
        kind = "exec" if "exec" in user else "auth-provider"
        raise ConfigError(
            f"kubeconfig {path}: context {context!r} uses {kind} credentials, which "
            "rdma-hca doctor does not run: use a kubeconfig with a token or client "
            "certificate (e.g. a service account token)"
        )
    token = user.get("token")
    token_file = user.get("tokenFile")
    if not token and token_file:
        try:
            token = (path.parent / str(token_file)).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"kubeconfig {path}: cannot read tokenFile {token_file}: "
                              f"{exc.strerror}") from exc
    base = path.parent
    cert = _pem(user, "client-certificate", base, path)
    key = _pem(user, "client-key", base, path)
    if (cert is None) != (key is None):
        raise ConfigError(f"kubeconfig {path}: user of context {context!r} has a client "
                          "certificate or key but not both")
    return Credentials(
        server=server.rstrip("/"),
        source=f"kubeconfig {path}, context {context}",
        ca_pem=_pem(cluster, "certificate-authority", base, path),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=str(token) if token else None,
        client_cert_pem=cert,
        client_key_pem=key,
        username=user.get("username"),
        password=user.get("password"),
    )


@contextmanager
def _pem_files(cert: bytes, key: bytes) -> Iterator[tuple[str, str]]:
    # ssl can only load a client certificate from files; keep them private and short-lived.
    with tempfile.TemporaryDirectory(prefix="rdma-hca-") as tmp:
        cert_path, key_path = Path(tmp) / "client.crt", Path(tmp) / "client.key"
        for target, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        yield str(cert_path), str(key_path)


def _ssl_context(creds: Credentials) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    try:
        if creds.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif creds.ca_pem is not None:
            ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii", "replace"))
        if creds.client_cert_pem is not None and creds.client_key_pem is not None:
            with _pem_files(creds.client_cert_pem, creds.client_key_pem) as (cert, key):
                ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(f"{creds.source}: a certificate or key is not valid PEM "
                          f"({exc.reason or exc}): fix the kubeconfig") from exc
    return ctx


class KubeClient:
    """GETs JSON from the API server. One connection per request keeps it simple and safe
    to use from any thread; ``doctor`` makes only a handful of requests."""

    def __init__(self, creds: Credentials, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._creds = creds
        self._timeout = timeout
        parts = urllib.parse.urlsplit(creds.server)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._ssl = _ssl_context(creds) if self._https else None

    @property
    def server(self) -> str:
        return self._creds.server

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "rdma-hca-doctor"}
        if self._creds.token:
            headers["Authorization"] = f"Bearer {self._creds.token}"
        elif self._creds.username is not None:
            pair = f"{self._creds.username}:{self._creds.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._ssl
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET ``path`` (e.g. ``/api/v1/nodes``) and return the decoded JSON object."""
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        url = self._creds.server + path
        conn = self._connection()
        try:
            conn.request("GET", target, headers=self._headers())
            response = conn.getresponse()
            body = response.read()
        except ssl.SSLCertVerificationError as exc:
            raise UnreachableError(
                f"TLS verification of the API server {self._creds.server} failed "
                f"({exc.verify_message}): check certificate-authority in {self._creds.source}"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise UnreachableError(
                f"API server {self._creds.server} is unreachable ({reason}): check the "
                f"server URL in {self._creds.source} and that the cluster is up"
            ) from exc
        finally:
            conn.close()
        if response.status >= 400:
            raise _api_error(response.status, body, url)
        try:
            decoded = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(f"GET {url} returned something that is not JSON: is "
                           f"{self._creds.server} a Kubernetes API server?",
                           response.status) from exc
        if not isinstance(decoded, dict):
            raise ApiError(f"GET {url} returned JSON that is not an object", response.status)
        return decoded


def _api_error(status: int, body: bytes, url: str) -> ApiError:
    """Turn an error response (usually a ``Status`` object) into a typed error."""
    message = ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            message = str(doc.get("message") or "")
    except (ValueError, UnicodeDecodeError):
        message = body.decode("utf-8", "replace").strip()[:200]
    text = f"GET {url}: HTTP {status}" + (f": {message}" if message else "")
    if status == 404:
        return NotFoundError(text, status)
    return ApiError(text, status)
