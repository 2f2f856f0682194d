"""Finding API server credentials the way kubectl finds them, checked before use.

Every kubeconfig kubectl accepts works: tokens and token files, client certificates (files or
``*-data``), basic auth, exec credential plugins (EKS, GKE, AKS, OIDC) and the in-cluster
service account. The kubeconfig is read and checked here, so a broken one gets a message
that names the file and the field; :mod:`rdma_hca.kube.client` then makes the requests.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdma_hca.kube.errors import KubeconfigError

SERVICE_ACCOUNT_DIR = "var/run/secrets/kubernetes.io/serviceaccount"
# lightkube runs exec plugins of these versions; a v1 plugin prints the same ExecCredential.
_EXEC_V1 = "client.authentication.k8s.io/v1"
_EXEC_V1BETA1 = "client.authentication.k8s.io/v1beta1"
_CONTEXT = "rdma-hca"

@dataclass(frozen=True, slots=True)
class Credentials:
    """Where the API server is and how to prove who we are, as a kubeconfig with one context
    (``kubeconfig``) whose relative paths are resolved against ``base``."""

    server: str
    source: str  # where these came from, named in error messages
    kubeconfig: Mapping[str, Any]
    base: Path | None = None  # the kubeconfig file the paths are relative to
    proxy: str | None = None


@dataclass(frozen=True, slots=True)
class CredentialSearch:
    """What one command accepts for API server credentials, so that its messages name only
    what that command has.

    ``kubeconfig_flag`` and ``context_flag`` are the command's flags (None: it has none).
    ``in_cluster_first``: a daemon in a pod tries its service account before $KUBECONFIG and
    ~/.kube/config, as client-go's in-cluster config does; a command-line tool goes kubectl's
    way and tries it last. ``in_pod_fix`` says how such a daemon gets its token mounted.
    """

    kubeconfig_flag: str | None = None
    context_flag: str | None = None
    in_cluster_first: bool = False
    in_pod_fix: str = "run it in a pod with its service account token mounted"

    @property
    def order(self) -> tuple[str, ...]:
        """Where credentials are looked for when no kubeconfig file is given, in order."""
        return (_POD, _ENV, _HOME) if self.in_cluster_first else (_ENV, _HOME, _POD)

    def fallbacks(self) -> str:
        """``order`` in words, for a flag's help."""
        *first, last = self.order
        return ", ".join(first) + ", then " + last

    def fix(self) -> str:
        """How to give credentials, with only what the command accepts."""
        fixes = [f"pass {self.kubeconfig_flag} FILE"] if self.kubeconfig_flag else []
        if self.in_cluster_first:
            fixes.append(self.in_pod_fix)
        fixes.append("set KUBECONFIG to a kubeconfig file")
        return (", or " if self.in_cluster_first else " or ").join(fixes)


_POD, _ENV, _HOME = "the in-cluster service account", "$KUBECONFIG", "~/.kube/config"
# A command with no credential flags of its own; the messages name none.
NO_FLAGS = CredentialSearch()


def load_credentials(
    *,
    kubeconfig: str | None,
    context: str | None,
    env: Mapping[str, str],
    home: Path,
    in_cluster_root: Path = Path("/"),
    accepts: CredentialSearch = NO_FLAGS,
) -> Credentials:
    """Find credentials the way kubectl does, falling back to the in-cluster service account.

    A ``kubeconfig`` file given wins; then, in the order of ``accepts``, ``$KUBECONFIG``
    (the first existing file of the list), ``~/.kube/config`` and the pod's service account
    when ``KUBERNETES_SERVICE_HOST`` is set. Nothing found: the message says what was tried,
    and how to fix it with what the calling command ``accepts``.
    """
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            give = (f"pass an existing file to {accepts.kubeconfig_flag}"
                    if accepts.kubeconfig_flag else "give an existing kubeconfig file")
            raise KubeconfigError(f"kubeconfig {path} does not exist: {give}")
        return _from_kubeconfig(path, context, env, accepts)
    tried = [f"{accepts.kubeconfig_flag} (not given)"] if accepts.kubeconfig_flag else []
    for step in accepts.order:
        if step == _POD:
            if env.get("KUBERNETES_SERVICE_HOST"):
                return _in_cluster(env, in_cluster_root)
            tried.append(f"{_POD} (KUBERNETES_SERVICE_HOST is not set)")
        elif step == _ENV:
            listed = env.get("KUBECONFIG", "")
            for entry in listed.split(os.pathsep):
                if entry and Path(entry).expanduser().is_file():
                    return _from_kubeconfig(Path(entry).expanduser(), context, env, accepts)
            tried.append(f"KUBECONFIG={listed} (no such file)" if listed
                         else "$KUBECONFIG (not set)")
        else:
            default = home / ".kube" / "config"
            if default.is_file():
                return _from_kubeconfig(default, context, env, accepts)
            tried.append(f"{default} (missing)")
    raise KubeconfigError(f"no usable API server credentials: tried {', then '.join(tried)}: "
                      f"{accepts.fix()}")


def _in_cluster(env: Mapping[str, str], root: Path) -> Credentials:
    sa_dir = root / SERVICE_ACCOUNT_DIR
    token_file = sa_dir / "token"
    try:
        token_file.read_text()
    except OSError as exc:
        raise KubeconfigError(
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


def _from_kubeconfig(path: Path, context_name: str | None, env: Mapping[str, str],
                     accepts: CredentialSearch) -> Credentials:
    import yaml  # only a kubeconfig needs it; in a pod the service account's files do not

    # libyaml's safe loader where PyYAML was built with it, as for the settings file: the
    # same documents, in a tenth of the pure-Python parser's time (a daemon reads its
    # kubeconfig before it registers, once for Events and once for the DRA driver).
    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        doc = yaml.load(path.read_text(), Loader=loader)
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        another = (f" or pass another with {accepts.kubeconfig_flag}"
                   if accepts.kubeconfig_flag else "")
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML{where}: fix the file{another}"
                          ) from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a kubeconfig (expected a mapping with "
                          "clusters, users and contexts)")
    name = context_name or doc.get("current-context")
    if not name:
        pick = f"pass {accepts.context_flag} NAME or " if accepts.context_flag else ""
        raise KubeconfigError(f"kubeconfig {path} has no current-context: {pick}run kubectl "
                          "config use-context NAME")
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
        raise KubeconfigError(f"kubeconfig {path}: {key} must be a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(inner)
            if not isinstance(body, dict):
                raise KubeconfigError(f"kubeconfig {path}: {key} entry {name!r} has no {inner}")
            return body
    known = ", ".join(str(e.get("name")) for e in entries if isinstance(e, dict)) or "none"
    raise KubeconfigError(f"kubeconfig {path}: no {inner} named {name!r} in {key} (known: {known})")


def _str_field(body: Mapping[str, Any], key: str, path: Path) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"kubeconfig {path}: {key} is missing or not a string")
    return value


def _check_pem(body: Mapping[str, Any], key: str, path: Path) -> bool:
    """Check ``key-data`` (base64) or ``key`` (a file, relative to the kubeconfig's folder)
    can be read; True when either is given."""
    data = body.get(f"{key}-data")
    if data:
        try:
            base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise KubeconfigError(f"kubeconfig {path}: {key}-data is not valid base64") from exc
        return True
    file = body.get(key)
    if file:
        target = (path.parent / str(file)).expanduser()
        try:
            target.read_bytes()
        except OSError as exc:
            raise KubeconfigError(f"kubeconfig {path}: cannot read {key} {target}: "
                              f"{exc.strerror}") from exc
        return True
    return False


def _check_cluster(cluster: Mapping[str, Any], path: Path) -> str:
    server = _str_field(cluster, "server", path)
    parsed = urllib.parse.urlsplit(server)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise KubeconfigError(f"kubeconfig {path}: cluster server {server!r} is not an http(s) URL")
    _check_pem(cluster, "certificate-authority", path)
    return server.rstrip("/")


def _check_user(user: Mapping[str, Any], path: Path, context: str) -> dict[str, Any]:
    """The user entry, checked, with the changes lightkube needs to use it as kubectl does."""
    out = dict(user)
    if "auth-provider" in user:
        raise KubeconfigError(
            f"kubeconfig {path}: context {context!r} uses an auth-provider, which kubectl "
            "dropped in 1.26: switch to its exec credential plugin (e.g. "
            "gke-gcloud-auth-plugin, kubelogin)"
        )
    token_file = user.get("tokenFile")
    if not user.get("token") and token_file:
        # kubectl reads tokenFile relative to the kubeconfig, lightkube as given.
        target = (path.parent / str(token_file)).expanduser()
        try:
            target.read_text()
        except OSError as exc:
            raise KubeconfigError(f"kubeconfig {path}: cannot read tokenFile {token_file}: "
                              f"{exc.strerror}") from exc
        out["tokenFile"] = str(target)
    elif user.get("token"):
        out.pop("tokenFile", None)  # kubectl prefers the token; lightkube the file
    cert = _check_pem(user, "client-certificate", path)
    key = _check_pem(user, "client-key", path)
    if cert != key:
        raise KubeconfigError(f"kubeconfig {path}: user of context {context!r} has a client "
                          "certificate or key but not both")
    if "exec" in user:
        out["exec"] = _exec(user["exec"], path, context)
    return out


def _exec(spec: Any, path: Path, context: str) -> dict[str, Any]:
    if not isinstance(spec, dict) or not isinstance(spec.get("command"), str):
        raise KubeconfigError(f"kubeconfig {path}: the exec entry of context {context!r} needs a "
                          "command")
    version = spec.get("apiVersion")
    if version not in (_EXEC_V1, _EXEC_V1BETA1, "client.authentication.k8s.io/v1alpha1"):
        raise KubeconfigError(f"kubeconfig {path}: exec apiVersion {version!r} of context "
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


def label_selector(selector: Mapping[str, Any]) -> str:
    """A ``LabelSelector`` object as the ``labelSelector`` query kubectl sends."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op = str(expr.get("key", "")), expr.get("operator", "")
        values = ",".join(str(v) for v in expr.get("values") or [])
        if op == "In":
            terms.append(f"{key} in ({values})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({values})")
        elif op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms)
