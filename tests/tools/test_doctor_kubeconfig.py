"""Credentials: kubeconfig forms (token, certificates as files or data, contexts),
$KUBECONFIG, the in-cluster service account, and a real TLS handshake with client certificates.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fakeapi import TOKEN, FakeCluster, daemonset, node, pod, serve, write_kubeconfig

from rdma_hca.tools.doctor import main
from rdma_hca.tools.doctor.kubeapi import (
    ConfigError,
    Credentials,
    KubeClient,
    NotFoundError,
    UnreachableError,
    load_credentials,
)

# A throw-away CA, a server certificate for IP 127.0.0.1 and a client certificate (CN viewer),
# valid for a century, made with openssl for these tests only.
CA_CRT = """\
-----BEGIN CERTIFICATE-----
MIIBejCCASGgAwIBAgIUZPBFpZ2J5WjCqZ6JF3Gblm6qTGgwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjExMjkxODI1MzFaGA8yMTI2MTEwNTE4
MjUzMVowEjEQMA4GA1UEAwwHdGVzdC1jYTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABJkDU2V82wpcKebuWEN8Ojf7wLe+HUDxIYs3K9p9pmdxyjLlEPzgFP0yO154
ziq888ych0HY3UnGTJ9QAxkLYEqjUzBRMB0GA1UdDgQWBBQ7rfNB/8RlkhHCCurf
64qqK7pd3TAfBgNVHSMEGDAWgBQ7rfNB/8RlkhHCCurf64qqK7pd3TAPBgNVHRMB
Af8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCIHfeLVuD62c3r7wSNU53+6+ZeaRr
O8jI+UGw0FHT7vWEAiBFJg3fwhl+4cYo+MsSyvMvIDHzk3ycywVGOIxPBPmdiA==
-----END CERTIFICATE-----
"""
SERVER_CRT = """\
-----BEGIN CERTIFICATE-----
MIIBkTCCATigAwIBAgIUN47DKse5IQTdURJ7zfN9YRFYaWAwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjExMjkxODI1MzFaGA8yMTI2MTEwNTE4
MjUzMVowFDESMBAGA1UEAwwJMTI3LjAuMC4xMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEdyn3N2xPcYIABx3//nusEYdb3wtOBHILeMB1DSQhK5klktPhnjLdKQ+T
b+qIstme/N4Eb3AMf42Fh0Ddt7B6SKNoMGYwDwYDVR0RBAgwBocEfwAAATATBgNV
HSUEDDAKBggrBgEFBQcDATAdBgNVHQ4EFgQU6/oxp0Qw/4E+LsEKMlf+Yz7PXCAw
HwYDVR0jBBgwFoAUO63zQf/EZZIRwgrq3+uKqiu6Xd0wCgYIKoZIzj0EAwIDRwAw
RAIgIlJ1KgMjGyRTM7XVXRBc8EvveT4WVmqQ12pz5RAGvvACIHVhphdbOjqBlgi7
/ncLVf7osPhaS/cK2J77ZhqmdUmQ
-----END CERTIFICATE-----
"""
SERVER_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg4p4bKpwHgkNwAgHY
IV5GxNBGyRul9qOvpcs1Y1JLa6GhRANCAAR3Kfc3bE9xggAHHf/+e6wRh1vfC04E
cgt4wHUNJCErmSWS0+GeMt0pD5Nv6oiy2Z783gRvcAx/jYWHQN23sHpI
-----END PRIVATE KEY-----
"""
CLIENT_CRT = """\
-----BEGIN CERTIFICATE-----
MIIBlDCCATugAwIBAgIUN47DKse5IQTdURJ7zfN9YRFYaWEwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjExMjkxODI1MzFaGA8yMTI2MTEwNTE4
MjUzMVowKDEPMA0GA1UEAwwGdmlld2VyMRUwEwYDVQQKDAxyZG1hLWRvY3RvcnMw
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAR8PVTUFQpr9jIrdRbl9ReptzjqIj5H
6igjb9bHGPgfr9O/mQLzkOoirUC4dwxGrTRZ/rjId8NS88rcOLrTeZoMo1cwVTAT
BgNVHSUEDDAKBggrBgEFBQcDAjAdBgNVHQ4EFgQUGh1FNeLIx2wNhD8mzQDZYCWS
DsMwHwYDVR0jBBgwFoAUO63zQf/EZZIRwgrq3+uKqiu6Xd0wCgYIKoZIzj0EAwID
RwAwRAIgON4vpxuTCbVnwGEXQZVJWIn8fgrYXAYwnumfiK9/rOECIGOeABHTBs8z
IOiAXa20reVl83l0BMpmf1ROZSjVHKA4
-----END CERTIFICATE-----
"""
CLIENT_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgTGKaT9YtTZbUOngi
TJO6FBPQpYodhXmu0OFInhtqHzuhRANCAAR8PVTUFQpr9jIrdRbl9ReptzjqIj5H
6igjb9bHGPgfr9O/mQLzkOoirUC4dwxGrTRZ/rjId8NS88rcOLrTeZoM
-----END PRIVATE KEY-----
"""


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
    (tmp_path / "server.crt").write_text(SERVER_CRT)
    (tmp_path / "server.key").write_text(SERVER_KEY)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    ctx.load_verify_locations(cadata=CA_CRT)
    ctx.verify_mode = ssl.CERT_REQUIRED
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
        KubeClient(creds, timeout=5).get("/api/v1/nodes")


def test_insecure_skip_tls_verify(tls_server: str, healthy: FakeCluster, tmp_path: Path) -> None:
    doc = kubeconfig_doc(tls_server, {"insecure-skip-tls-verify": True},
                         {"client-certificate-data": b64(CLIENT_CRT),
                          "client-key-data": b64(CLIENT_KEY)})
    creds = load(tmp_path, doc)
    nodes = KubeClient(creds, timeout=5).get("/api/v1/nodes")
    assert [n["metadata"]["name"] for n in nodes["items"]] == ["e01-cn-a"]


def test_context_flag_picks_the_context(tmp_path: Path) -> None:
    doc = kubeconfig_doc("http://127.0.0.1:1", {}, {"token": "t"}, contexts=2)
    assert load(tmp_path, doc, context="ctx1").source.endswith("context ctx1")
    known = "no context named 'nope' in contexts \\(known: ctx0, ctx1\\)"
    with pytest.raises(ConfigError, match=known):
        load(tmp_path, doc, context="nope")


def test_token_file_and_server_path_prefix(tmp_path: Path, healthy: FakeCluster) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    with serve(healthy) as url:
        # Nothing is served under /prefix: the client must keep the prefix it was given.
        doc = kubeconfig_doc(url + "/prefix/", {}, {"tokenFile": "token"})
        creds = load(tmp_path, doc)
        assert creds.token == TOKEN
        with pytest.raises(NotFoundError, match="HTTP 404"):
            KubeClient(creds).get("/api/v1/nodes")
    assert healthy.requests[0].path == "/prefix/api/v1/nodes"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("- just a list", "is not a kubeconfig"),
        ({"clusters": []}, "has no current-context"),
        (kubeconfig_doc("ftp://host", {}, {}), "is not an http\\(s\\) URL"),
        (kubeconfig_doc("https://h", {}, {"exec": {"command": "aws"}}), "uses exec credentials"),
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
    with pytest.raises(ConfigError, match=message):
        load_credentials(kubeconfig=str(path), context=None, env={}, home=tmp_path)


def test_bad_pem_is_a_config_error(tmp_path: Path) -> None:
    doc = kubeconfig_doc("https://127.0.0.1:1", {"certificate-authority-data": b64("junk")}, {})
    with pytest.raises(ConfigError, match="not valid PEM"):
        KubeClient(load(tmp_path, doc))


def test_home_kubeconfig_is_the_fallback(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", "http://127.0.0.1:1")
    creds = load_credentials(kubeconfig=None, context=None, env={}, home=tmp_path)
    assert creds.server == "http://127.0.0.1:1"
    assert creds.source == f"kubeconfig {tmp_path / '.kube' / 'config'}, context test"


def test_in_cluster_service_account(tmp_path: Path) -> None:
    sa = tmp_path / "var/run/secrets/kubernetes.io/serviceaccount"
    sa.mkdir(parents=True)
    (sa / "token").write_text("sa-token\n")
    (sa / "ca.crt").write_text(CA_CRT)
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    creds = load_credentials(kubeconfig=None, context=None, env=env, home=tmp_path,
                             in_cluster_root=tmp_path)
    assert creds.server == "https://[fd00::1]:6443"
    assert creds.token == "sa-token"
    assert creds.ca_pem == CA_CRT.encode()


def test_in_cluster_without_token_says_how_to_fix(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    with pytest.raises(ConfigError, match="automountServiceAccountToken: true"):
        load_credentials(kubeconfig=None, context=None, env=env, home=tmp_path,
                         in_cluster_root=tmp_path)
