"""Reaching the Kubernetes API server for ``doctor``: credentials found the way kubectl finds
them, and the reads it needs, made with lightkube.

Every kubeconfig kubectl accepts works: tokens and token files, client certificates (files or
``*-data``), basic auth, exec credential plugins (EKS, GKE, AKS, OIDC) and the in-cluster
service account. The kubeconfig is read and checked here first, so a broken one gets a
message that names the file and the field; lightkube then makes the requests.

lightkube and its HTTP stack are imported only when a client is built, so commands that never
talk to the API server (``serve`` above all) do not load them.

Every failure becomes a :class:`KubeError` whose message says what went wrong and how to fix
it; callers print it as one line instead of a traceback.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

if TYPE_CHECKING:
    from lightkube import Client

DEFAULT_TIMEOUT = 10.0
SERVICE_ACCOUNT_DIR = "var/run/secrets/kubernetes.io/serviceaccount"
# lightkube runs exec plugins of these versions; a v1 plugin prints the same ExecCredential.
_EXEC_V1 = "client.authentication.k8s.io/v1"
_EXEC_V1BETA1 = "client.authentication.k8s.io/v1beta1"
_CONTEXT = "rdma-hca"

T = TypeVar("T")


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
    """Where the API server is and how to prove who we are, as a kubeconfig with one context
    (``kubeconfig``) whose relative paths are resolved against ``base``."""

    server: str
    source: str  # where these came from, named in error messages
    kubeconfig: Mapping[str, Any]
    base: Path | None = None  # the kubeconfig file the paths are relative to
    proxy: str | None = None


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
        return _from_kubeconfig(path, context, env)
    for entry in env.get("KUBECONFIG", "").split(os.pathsep):
        if entry and Path(entry).expanduser().is_file():
            return _from_kubeconfig(Path(entry).expanduser(), context, env)
    default = home / ".kube" / "config"
    if default.is_file():
        return _from_kubeconfig(default, context, env)
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
        token_file.read_text()
    except OSError as exc:
        raise ConfigError(
            f"running in a pod but cannot read the service account token {token_file} "
            f"({exc.strerror}): set automountServiceAccountToken: true on the pod"
        ) from exc
    host = env["KUBERNETES_SERVICE_HOST"]
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 service address needs brackets in a URL
        host = f"[{host}]"
    cluster: dict[str, Any] = {"server": f"https://{host}:{port}"}
    ca_file = sa_dir / "ca.crt"
    if ca_file.is_file():
        cluster["certificate-authority"] = str(ca_file)
    # A token file, not its content: the kubelet rotates it and lightkube re-reads it.
    user = {"tokenFile": str(token_file)}
    return Credentials(
        server=cluster["server"],
        source="in-cluster service account",
        kubeconfig=_one_context(cluster, user),
        proxy=_env_proxy(cluster["server"], env),
    )


def _one_context(cluster: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": _CONTEXT, "cluster": dict(cluster)}],
        "users": [{"name": _CONTEXT, "user": dict(user)}],
        "contexts": [{"name": _CONTEXT, "context": {"cluster": _CONTEXT, "user": _CONTEXT}}],
        "current-context": _CONTEXT,
    }


def _from_kubeconfig(path: Path, context_name: str | None, env: Mapping[str, str]) -> Credentials:
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
    where = f"kubeconfig {path}, context {name}"
    server = _check_cluster(cluster, path)
    checked_user = _check_user(user, path, str(name))
    proxy = cluster.get("proxy-url") or _env_proxy(server, env)
    return Credentials(
        server=server,
        source=where,
        kubeconfig=_one_context(cluster, checked_user),
        base=path,
        proxy=str(proxy) if proxy else None,
    )


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


def _check_pem(body: Mapping[str, Any], key: str, path: Path) -> bool:
    """Check ``key-data`` (base64) or ``key`` (a file, relative to the kubeconfig's folder)
    can be read; True when either is given."""
    data = body.get(f"{key}-data")
    if data:
        try:
            base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"kubeconfig {path}: {key}-data is not valid base64") from exc
        return True
    file = body.get(key)
    if file:
        target = (path.parent / str(file)).expanduser()
        try:
            target.read_bytes()
        except OSError as exc:
            raise ConfigError(f"kubeconfig {path}: cannot read {key} {target}: "
                              f"{exc.strerror}") from exc
        return True
    return False


def _check_cluster(cluster: Mapping[str, Any], path: Path) -> str:
    server = _str_field(cluster, "server", path)
    parsed = urllib.parse.urlsplit(server)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"kubeconfig {path}: cluster server {server!r} is not an http(s) URL")
    _check_pem(cluster, "certificate-authority", path)
    return server.rstrip("/")


def _check_user(user: Mapping[str, Any], path: Path, context: str) -> dict[str, Any]:
    """The user entry, checked, with the changes lightkube needs to use it as kubectl does."""
    out = dict(user)
    if "auth-provider" in user:
        raise ConfigError(
            f"kubeconfig {path}: context {context!r} uses an auth-provider, which kubectl "
            "dropped in 1.26: switch to its exec credential plugin (e.g. "
            "gke-gcloud-auth-plugin, kubelogin) and run doctor again"
        )
    token_file = user.get("tokenFile")
    if not user.get("token") and token_file:
        # kubectl reads tokenFile relative to the kubeconfig, lightkube as given.
        target = (path.parent / str(token_file)).expanduser()
        try:
            target.read_text()
        except OSError as exc:
            raise ConfigError(f"kubeconfig {path}: cannot read tokenFile {token_file}: "
                              f"{exc.strerror}") from exc
        out["tokenFile"] = str(target)
    elif user.get("token"):
        out.pop("tokenFile", None)  # kubectl prefers the token; lightkube the file
    cert = _check_pem(user, "client-certificate", path)
    key = _check_pem(user, "client-key", path)
    if cert != key:
        raise ConfigError(f"kubeconfig {path}: user of context {context!r} has a client "
                          "certificate or key but not both")
    if "exec" in user:
        out["exec"] = _exec(user["exec"], path, context)
    return out


def _exec(spec: Any, path: Path, context: str) -> dict[str, Any]:
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), str):
        raise ConfigError(f"kubeconfig {path}: the exec entry of context {context!r} needs a "
                          "command")
    version = spec.get("apiVersion")
    if version not in (_EXEC_V1, _EXEC_V1BETA1, "client.authentication.k8s.io/v1alpha1"):
        raise ConfigError(f"kubeconfig {path}: exec apiVersion {version!r} of context "
                          f"{context!r} is not one kubectl knows; use {_EXEC_V1}")
    out = dict(spec)
    command = spec["command"]
    # Like kubectl: a command with a slash in it is relative to the kubeconfig's folder.
    if os.sep in command and not os.path.isabs(command):
        out["command"] = str(path.parent / command)
    if version == _EXEC_V1:
        out["apiVersion"] = _EXEC_V1BETA1
    # What kubectl tells the plugin; some plugins refuse to run without it.
    info = {"apiVersion": version, "kind": "ExecCredential", "spec": {"interactive": False}}
    env = [e for e in spec.get("env") or [] if isinstance(e, dict)]
    out["env"] = [*env, {"name": "KUBERNETES_EXEC_INFO", "value": json.dumps(info)}]
    return out


def _env_proxy(server: str, env: Mapping[str, str]) -> str | None:
    """The proxy kubectl would use for ``server`` from HTTPS_PROXY/HTTP_PROXY and NO_PROXY."""
    parts = urllib.parse.urlsplit(server)
    names = ("HTTPS_PROXY", "https_proxy") if parts.scheme == "https" else (
        "HTTP_PROXY", "http_proxy")
    proxy = next((env[n] for n in names if env.get(n)), None)
    if not proxy:
        return None
    no_proxy = env.get("NO_PROXY") or env.get("no_proxy") or ""
    host = (parts.hostname or "").lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        domain = entry.lstrip("*").lstrip(".")
        if entry == "*" or (domain and (host == domain or host.endswith("." + domain))):
            return None
    return proxy


class KubeClient:
    """The reads ``doctor`` makes, as plain JSON-shaped dictionaries."""

    def __init__(self, creds: Credentials, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._creds = creds
        self._client = self._build(creds, timeout)

    @property
    def server(self) -> str:
        return self._creds.server

    @staticmethod
    def _build(creds: Credentials, timeout: float) -> Client:
        from lightkube import Client, KubeConfig
        from lightkube.core.exceptions import ConfigError as LightkubeConfigError

        try:
            config = KubeConfig.from_dict(dict(creds.kubeconfig), fname=creds.base).get()
            # Proxies come from the kubeconfig or the environment given to load_credentials.
            return Client(config=config, timeout=_timeout(timeout), trust_env=False,
                          proxy=creds.proxy)
        except ssl.SSLError as exc:
            raise ConfigError(f"{creds.source}: a certificate or key is not valid PEM "
                              f"({exc.reason or exc}): fix the kubeconfig") from exc
        except OSError as exc:
            raise ConfigError(f"{creds.source}: cannot read a certificate or key "
                              f"({exc.strerror or exc}): fix the kubeconfig") from exc
        except (LightkubeConfigError, ValueError, TypeError) as exc:
            raise ConfigError(f"{creds.source}: {exc}: fix the kubeconfig") from exc
        except ImportError as exc:  # e.g. a socks5:// proxy-url without socksio installed
            raise ConfigError(f"{creds.source}: {exc}") from exc

    def daemonset(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The DaemonSet, or None when it does not exist."""
        from lightkube.resources.apps_v1 import DaemonSet

        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        try:
            obj = self._call(path, lambda: self._client.get(DaemonSet, name, namespace=namespace))
        except NotFoundError:
            return None
        return _plain(obj)

    def nodes(self) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Node

        return self._call("/api/v1/nodes", lambda: [_plain(n) for n in self._client.list(Node)])

    def pods(self, namespace: str, selector: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pods of ``namespace`` that match a LabelSelector object."""
        from lightkube.resources.core_v1 import Pod

        labels = label_filter(selector)
        return self._call(
            f"/api/v1/namespaces/{namespace}/pods",
            lambda: [_plain(p) for p in self._client.list(Pod, namespace=namespace,
                                                          labels=labels or None)],
        )

    def resource_slices(self, driver: str) -> list[dict[str, Any]]:
        """Every ResourceSlice (resource.k8s.io/v1) of ``driver``, on all nodes."""
        from lightkube.resources.resource_v1 import ResourceSlice

        found = self._call(
            "/apis/resource.k8s.io/v1/resourceslices",
            lambda: [_plain(s) for s in self._client.list(ResourceSlice,
                                                          fields={"spec.driver": driver})],
        )
        # The field selector did this already; a server that ignored it must not make
        # another driver's slices look like ours.
        return [s for s in found if (s.get("spec") or {}).get("driver") == driver]

    def device_classes(self) -> list[dict[str, Any]]:
        from lightkube.resources.resource_v1 import DeviceClass

        return self._call("/apis/resource.k8s.io/v1/deviceclasses",
                          lambda: [_plain(c) for c in self._client.list(DeviceClass)])

    def _call(self, path: str, request: Callable[[], T]) -> T:
        """Run one request, turning every failure into a one-line KubeError."""
        import httpx2
        from lightkube import ApiError as LightkubeApiError
        from lightkube.core.exceptions import ConfigError as LightkubeConfigError

        url = self._creds.server + path
        server, source = self._creds.server, self._creds.source
        try:
            return request()
        except LightkubeApiError as exc:
            status = exc.status.code or exc.response.status_code
            text = f"GET {url}: HTTP {status}" + (f": {exc.status.message}"
                                                  if exc.status.message else "")
            raise (NotFoundError if status == 404 else ApiError)(text, status) from exc
        except httpx2.HTTPStatusError as exc:
            status = exc.response.status_code
            body = exc.response.text.strip()[:200]
            text = f"GET {url}: HTTP {status}" + (f": {body}" if body else "")
            raise (NotFoundError if status == 404 else ApiError)(text, status) from exc
        except httpx2.TransportError as exc:
            cause = _root_cause(exc)
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise UnreachableError(
                    f"TLS verification of the API server {server} failed "
                    f"({cause.verify_message}): check certificate-authority in {source}"
                ) from exc
            reason = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
            raise UnreachableError(
                f"API server {server} is unreachable ({reason}): check the server URL in "
                f"{source} and that the cluster is up"
            ) from exc
        except LightkubeConfigError as exc:
            # An exec credential plugin that failed: lightkube says which and its stderr.
            raise ConfigError(f"{source}: {' '.join(str(exc).split())}") from exc
        except OSError as exc:
            raise ConfigError(f"{source}: {_exec_failure(self._creds, exc)}") from exc
        except (KeyError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"{source}: the exec credential plugin did not print an ExecCredential with "
                "status.token; rdma-hca doctor needs a plugin that issues tokens"
            ) from exc
        except ValueError as exc:  # the body did not decode as the object asked for
            raise ApiError(f"GET {url} returned something that is not a Kubernetes object: "
                           f"is {server} a Kubernetes API server?", 200) from exc


def _timeout(seconds: float) -> Any:
    import httpx2

    return httpx2.Timeout(seconds)


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


def label_filter(selector: Mapping[str, Any]) -> dict[str, Any]:
    """A ``LabelSelector`` object as the key -> value-or-operator map lightkube encodes."""
    from lightkube import operators

    labels: dict[str, Any] = {
        str(k): str(v) for k, v in sorted((selector.get("matchLabels") or {}).items())}
    for expr in selector.get("matchExpressions") or []:
        key, op = str(expr.get("key", "")), expr.get("operator", "")
        values = [str(v) for v in expr.get("values") or []]
        if op == "In":
            labels[key] = operators.in_(values)
        elif op == "NotIn":
            labels[key] = operators.not_in(values)
        elif op == "Exists":
            labels[key] = operators.exists()
        elif op == "DoesNotExist":
            labels[key] = operators.not_exists()
    return labels


def _plain(obj: Any) -> dict[str, Any]:
    """A lightkube object as the JSON the API server sent (times as RFC 3339 strings)."""
    plain: dict[str, Any] = obj.to_dict()
    return plain
