"""Credentials: kubeconfig forms (token, certificates as files or data, contexts, exec
credential plugins), $KUBECONFIG, the in-cluster service account, and a real TLS handshake
with client certificates, all against the fake API server over real HTTP(S).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rdma_hca.devkit.kube.apiserver import serve, write_kubeconfig
from rdma_hca.devkit.kube.certs import CA_CRT, CLIENT_CRT, CLIENT_KEY, server_tls
from rdma_hca.devkit.kube.cluster import TOKEN, FakeCluster
from rdma_hca.devkit.kube.objects import daemonset, node, pod
from rdma_hca.kube.credentials import Credentials, load_credentials
from rdma_hca.kube.errors import KubeconfigError, NotFoundError, UnreachableError
from rdma_hca.tools.doctor import main
from rdma_hca.tools.doctor.kubeapi import KubeClient


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig_doc(server: str, cluster: dict[str, object], user: dict[str, object],
                   contexts: int = 1) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": f"ctx{i}", "context": {"cluster": "c", "user": "u"}}
                     for i in range(contexts)],
        "current-context": "ctx0",
    }


def load(tmp_path: Path, doc: dict[str, object], context: str | None = None) -> Credentials:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return load_credentials(kubeconfig=str(path), context=context, env={}, home=tmp_path)


@pytest.fixture
def healthy() -> FakeCluster:
    return FakeCluster(
        nodes=[node("e01-cn-a")],
        daemonsets={("kube-system", "ack-rdma-dp-ds"): daemonset(desired=1, ready=1)},
        pods=[pod("ack-rdma-dp-ds-7x2kq", "e01-cn-a")],
    )


@pytest.fixture
def tls_server(tmp_path: Path, healthy: FakeCluster) -> Iterator[str]:
    """An HTTPS fake API server that demands a client certificate signed by the test CA."""
    ctx = server_tls(tmp_path, client_certs=True)
    healthy.token = None
    with serve(healthy, tls=ctx) as url:
        yield url


def test_client_certificate_data_over_tls(
    tls_server: str, healthy: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = kubeconfig_doc(
        tls_server, {"certificate-authority-data": b64(CA_CRT)},
        {"client-certificate-data": b64(CLIENT_CRT), "client-key-data": b64(CLIENT_KEY)},
    )
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    assert main(["--kubeconfig", str(path)], env={}, home=tmp_path) == 0, capsys.readouterr()
    assert {r.client_cn for r in healthy.requests} == {"viewer"}


def test_certificate_files_are_relative_to_the_kubeconfig(
    tls_server: str, healthy: FakeCluster, tmp_path: Path
) -> None:
    certs = tmp_path / "conf" / "pki"
    certs.mkdir(parents=True)
    for name, text in (("ca.crt", CA_CRT), ("client.crt", CLIENT_CRT),
                       ("client.key", CLIENT_KEY)):
        (certs / name).write_text(text)
    doc = kubeconfig_doc(tls_server, {"certificate-authority": "pki/ca.crt"},
                         {"client-certificate": "pki/client.crt", "client-key": "pki/client.key"})
    path = tmp_path / "conf" / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    # Found through $KUBECONFIG this time (the first entry does not exist and is skipped).
    env = {"KUBECONFIG": f"{tmp_path / 'missing'}:{path}"}
    assert main([], env=env, home=tmp_path) == 0
    assert healthy.requests and healthy.requests[0].client_cn == "viewer"


def test_unknown_ca_fails_verification_with_a_hint(tls_server: str, tmp_path: Path) -> None:
    doc = kubeconfig_doc(tls_server, {},
                         {"client-certificate-data": b64(CLIENT_CRT),
                          "client-key-data": b64(CLIENT_KEY)})
    creds = load(tmp_path, doc)
    with pytest.raises(UnreachableError, match=r"TLS verification .* failed.*authority"):
        KubeClient(creds, timeout=5).nodes()


def test_insecure_skip_tls_verify(tls_server: str, healthy: FakeCluster, tmp_path: Path) -> None:
    doc = kubeconfig_doc(tls_server, {"insecure-skip-tls-verify": True},
                         {"client-certificate-data": b64(CLIENT_CRT),
                          "client-key-data": b64(CLIENT_KEY)})
    creds = load(tmp_path, doc)
    nodes = KubeClient(creds, timeout=5).nodes()
    assert [n["metadata"]["name"] for n in nodes] == ["e01-cn-a"]


def test_context_flag_picks_the_context(tmp_path: Path) -> None:
    doc = kubeconfig_doc("http://127.0.0.1:1", {}, {"token": "t"}, contexts=2)
    assert load(tmp_path, doc, context="ctx1").source.endswith("context ctx1")
    known = "no context named 'nope' in contexts \\(known: ctx0, ctx1\\)"
    with pytest.raises(KubeconfigError, match=known):
        load(tmp_path, doc, context="nope")


def test_token_file_and_server_path_prefix(tmp_path: Path, healthy: FakeCluster) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    with serve(healthy) as url:
        # Nothing is served under /prefix: the client must keep the prefix it was given.
        doc = kubeconfig_doc(url + "/prefix/", {}, {"tokenFile": "token"})
        creds = load(tmp_path, doc)
        with pytest.raises(NotFoundError, match="HTTP 404"):
            KubeClient(creds).nodes()
    assert healthy.requests[0].path == "/prefix/api/v1/nodes"
    # The file is read relative to the kubeconfig, as kubectl does.
    assert healthy.requests[0].authorization == f"Bearer {TOKEN}"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("- just a list", "is not a kubeconfig"),
        ({"clusters": []}, "has no current-context"),
        (kubeconfig_doc("ftp://host", {}, {}), "is not an http\\(s\\) URL"),
        (kubeconfig_doc("https://h", {}, {"auth-provider": {"name": "gcp"}}),
         "uses an auth-provider, which kubectl dropped in 1.26: switch to its exec"),
        (kubeconfig_doc("https://h", {}, {"exec": {"apiVersion": "v9", "command": "aws"}}),
         "exec apiVersion 'v9' of context 'ctx0' is not one kubectl knows"),
        (kubeconfig_doc("https://h", {}, {"exec": {"apiVersion": "x"}}), "needs a command"),
        (kubeconfig_doc("https://h", {"certificate-authority-data": "%%%"}, {}),
         "certificate-authority-data is not valid base64"),
        (kubeconfig_doc("https://h", {"certificate-authority": "/no/such/ca.crt"}, {}),
         "cannot read certificate-authority /no/such/ca.crt"),
        (kubeconfig_doc("https://h", {}, {"client-certificate-data": b64(CLIENT_CRT)}),
         "certificate or key but not both"),
        ({"current-context": "x", "contexts": [{"name": "x", "context": {}}]},
         "cluster is missing"),
    ],
)
def test_bad_kubeconfigs_say_what_is_wrong(
    tmp_path: Path, doc: object, message: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    with pytest.raises(KubeconfigError, match=message):
        load_credentials(kubeconfig=str(path), context=None, env={}, home=tmp_path)


def test_bad_pem_is_a_config_error(tmp_path: Path) -> None:
    doc = kubeconfig_doc("https://127.0.0.1:1", {"certificate-authority-data": b64("junk")}, {})
    with pytest.raises(KubeconfigError, match="not valid PEM"):
        KubeClient(load(tmp_path, doc))


def test_home_kubeconfig_is_the_fallback(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:1")
    creds = load_credentials(kubeconfig=None, context=None, env={}, home=tmp_path)
    assert creds.server == "http://127.0.0.1:1"
    assert creds.source == f"kubeconfig {tmp_path / '.kube' / 'config'}, context test"


def service_account(root: Path, token: str = "sa-token") -> None:
    sa = root / "var/run/secrets/kubernetes.io/serviceaccount"
    sa.mkdir(parents=True)
    (sa / "token").write_text(token + "\n")
    (sa / "ca.crt").write_text(CA_CRT)


def test_in_cluster_service_account_address(tmp_path: Path) -> None:
    service_account(tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    creds = load_credentials(kubeconfig=None, context=None, env=env, home=tmp_path,
                             in_cluster_root=tmp_path)
    assert creds.server == "https://[fd00::1]:6443"
    assert creds.source == "in-cluster service account"


@pytest.fixture
def token_tls_server(tmp_path: Path, healthy: FakeCluster) -> Iterator[str]:
    """An HTTPS fake API server (certificate for 127.0.0.1 by the test CA) that wants a token."""
    with serve(healthy, tls=server_tls(tmp_path)) as url:
        yield url


def test_in_cluster_service_account_over_tls(
    token_tls_server: str, healthy: FakeCluster, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "pod"
    service_account(root, token=TOKEN)
    port = token_tls_server.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    status = main([], env=env, home=tmp_path / "home", in_cluster_root=root)
    assert status == 0, capsys.readouterr()
    # The CA of the service account verified the server; its token was sent.
    assert {r.authorization for r in healthy.requests} == {f"Bearer {TOKEN}"}


def write_plugin(tmp_path: Path, body: str) -> Path:
    """An exec credential plugin: a script kubectl (and doctor) runs to get a token."""
    plugin = tmp_path / "bin" / "fake-auth-plugin"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(f"#!{sys.executable}\n{body}")
    plugin.chmod(0o755)
    return plugin


PRINT_TOKEN = """\
import json, os, pathlib, sys
info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO", "{}"))
pathlib.Path(sys.argv[1]).write_text(json.dumps({"args": sys.argv[2:], "info": info,
                                                 "region": os.environ.get("REGION")}))
print(json.dumps({"apiVersion": info.get("apiVersion"), "kind": "ExecCredential",
                  "status": {"token": TOKEN, "expirationTimestamp": "2999-01-01T00:00:00Z"}}))
""".replace("TOKEN", repr(TOKEN))


@pytest.mark.parametrize("version", ["client.authentication.k8s.io/v1beta1",
                                     "client.authentication.k8s.io/v1"])
def test_exec_credential_plugin(healthy: FakeCluster, tmp_path: Path, version: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    plugin = write_plugin(tmp_path, PRINT_TOKEN)
    ran = tmp_path / "ran.json"
    exec_spec: dict[str, object] = {
        "apiVersion": version, "command": str(plugin),
        "args": [str(ran), "eks", "get-token", "--cluster-name", "gpu"],
        "env": [{"name": "REGION", "value": "cn-hangzhou"}],
        "interactiveMode": "Never", "provideClusterInfo": False,
    }
    with serve(healthy) as url:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig_doc(url, {}, {"exec": exec_spec})))
        status = main(["--kubeconfig", str(path)], env={}, home=tmp_path)
    assert status == 0, capsys.readouterr()
    assert {r.authorization for r in healthy.requests} == {f"Bearer {TOKEN}"}
    seen = json.loads(ran.read_text())
    assert seen["args"] == ["eks", "get-token", "--cluster-name", "gpu"]
    assert seen["region"] == "cn-hangzhou"
    # The plugin is told the version it was configured with, as kubectl tells it.
    assert seen["info"] == {"apiVersion": version, "kind": "ExecCredential",
                            "spec": {"interactive": False}}


def test_exec_plugin_path_is_relative_to_the_kubeconfig(
        healthy: FakeCluster, tmp_path: Path) -> None:
    write_plugin(tmp_path, PRINT_TOKEN)
    exec_spec = {"apiVersion": "client.authentication.k8s.io/v1beta1",
                 "command": "./bin/fake-auth-plugin", "args": [str(tmp_path / "ran.json")]}
    with serve(healthy) as url:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig_doc(url, {}, {"exec": exec_spec})))
        assert main(["--kubeconfig", str(path)], env={}, home=tmp_path / "home") == 0
    assert (tmp_path / "ran.json").is_file()


@pytest.mark.parametrize(
    ("body", "command", "message"),
    [
        ("import sys\nsys.stderr.write('token expired, run aws sso login')\nsys.exit(1)\n",
         None, "returned 1: token expired, run aws sso login"),
        ("print('not json')\n", None, "did not print an ExecCredential with status.token"),
        ("", "/no/such/aws", "cannot run the exec credential plugin '/no/such/aws'"
         " (No such file or directory): install the AWS CLI v2"),
    ],
    ids=["plugin-fails", "plugin-prints-junk", "plugin-missing"],
)
def test_exec_plugin_failures_are_one_line(
    healthy: FakeCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    body: str, command: str | None, message: str,
) -> None:
    plugin = write_plugin(tmp_path, body)
    exec_spec = {"apiVersion": "client.authentication.k8s.io/v1beta1",
                 "command": command or str(plugin),
                 "installHint": "install the AWS CLI v2\n(see the EKS user guide)"}
    with serve(healthy) as url:
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig_doc(url, {}, {"exec": exec_spec})))
        status = main(["--kubeconfig", str(path)], env={}, home=tmp_path)
    err = capsys.readouterr().err
    assert status == 2
    (line,) = err.splitlines()
    assert line.startswith(f"rdma-hca doctor: kubeconfig {path}, context ctx0: ")
    assert message in line
    assert "Traceback" not in err
    assert healthy.requests == [] or all(r.authorization is None for r in healthy.requests)


def test_proxy_from_the_environment_and_no_proxy(tmp_path: Path) -> None:
    doc = kubeconfig_doc("https://api.example.com:6443", {}, {"token": "t"})
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))

    def proxy(env: dict[str, str]) -> str | None:
        return load_credentials(kubeconfig=str(path), context=None, env=env,
                                home=tmp_path).proxy

    assert proxy({"HTTPS_PROXY": "http://proxy:3128"}) == "http://proxy:3128"
    assert proxy({"HTTP_PROXY": "http://proxy:3128"}) is None  # https server
    assert proxy({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".example.com"}) is None
    assert proxy({"https_proxy": "http://p:1", "no_proxy": "other.org"}) == "http://p:1"
    doc["clusters"][0]["cluster"]["proxy-url"] = "socks5://jump:1080"  # type: ignore[index]
    path.write_text(yaml.safe_dump(doc))
    assert proxy({"HTTPS_PROXY": "http://proxy:3128"}) == "socks5://jump:1080"


def test_in_cluster_without_token_says_how_to_fix(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    with pytest.raises(KubeconfigError, match="automountServiceAccountToken: true"):
        load_credentials(kubeconfig=None, context=None, env=env, home=tmp_path,
                         in_cluster_root=tmp_path)


def test_serve_and_the_cli_do_not_load_the_api_client() -> None:
    # lightkube and its HTTP stack load only when doctor builds a client.
    code = (
        "import sys\n"
        "from rdma_hca.cli import build_parser\n"
        "import rdma_hca.daemon.wiring, rdma_hca.tools.doctor.cluster\n"
        "build_parser().parse_args(['serve'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightkube', 'httpx2', 'httpx'}))\n"
        "from rdma_hca.kube.credentials import label_selector\n"
        "label_selector({})\n"
        "print('lightkube' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "False"]
