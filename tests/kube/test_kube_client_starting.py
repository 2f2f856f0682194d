"""A client started before its HTTP client is built: requests wait for the build, a build
that fails is every request's error, and what a build made is given back at close."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer, write_kubeconfig
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kube.client import ApiClient, _build_http
from rdma_hca.kube.credentials import Credentials, load_credentials
from rdma_hca.kube.errors import KubeconfigError, KubeError
from rdma_hca.kube.policy import ClientPolicy

NODES = "/api/v1/nodes"
GATE_WAIT = 10.0


class GatedBuild:
    """lightkube's HTTP client, built once let through; counts the builds and the closes."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        self.go = threading.Event()
        self.builds = 0
        self.closed = 0

    def __call__(self, creds: Credentials, timeout: float) -> Any:
        self.builds += 1
        self.go.wait(GATE_WAIT)
        if self.fail is not None:
            raise KubeconfigError(self.fail)
        http = _build_http(creds, timeout)
        plain = http.aclose

        async def counted() -> None:
            self.closed += 1
            await plain()

        http.aclose = counted
        return http


async def test_a_request_waits_for_the_build_and_clients_share_what_it_made(
        api: FakeApiServer, creds: Credentials) -> None:
    gate = GatedBuild()
    first = ApiClient.starting(creds, ClientPolicy(timeout=2), build=gate)
    second = ApiClient.starting(creds, ClientPolicy(timeout=2), build=gate)
    try:
        asked = asyncio.create_task(first.get(NODES))
        await asyncio.sleep(0.2)
        assert not asked.done() and api.count() == 0  # nothing goes out before the build
        gate.go.set()
        assert [n["metadata"]["name"] for n in (await asked)["items"]] == ["n1"]
        await second.ready()
        assert (await second.get(f"{NODES}/n1"))["metadata"]["name"] == "n1"
        assert gate.builds == 1  # one HTTP client (one TLS context) for both
    finally:
        gate.go.set()
        await first.close()
        assert gate.closed == 0  # the other still uses it
        await second.close()
    assert gate.closed == 1


async def test_a_client_started_later_builds_at_its_first_request(
        api: FakeApiServer, creds: Credentials) -> None:
    gate = GatedBuild()
    gate.go.set()
    client = ApiClient.starting(creds, ClientPolicy(timeout=2), now=False, build=gate)
    try:
        await asyncio.sleep(0.1)
        assert gate.builds == 0  # nothing asked of it yet
        assert (await client.get(f"{NODES}/n1"))["metadata"]["name"] == "n1"
        assert gate.builds == 1
    finally:
        await client.close()
    unused = ApiClient.starting(creds, ClientPolicy(timeout=2), now=False, build=gate)
    await unused.close()  # never built, nothing to give back
    with pytest.raises(KubeError, match="closed before it was built"):
        await unused.ready()
    assert gate.builds == 1 and gate.closed == 1


async def test_a_build_that_fails_is_the_error_of_every_request(
        api: FakeApiServer, creds: Credentials) -> None:
    gate = GatedBuild(fail="kubeconfig kc: a certificate or key is not valid PEM: fix it")
    client = ApiClient.starting(creds, ClientPolicy(timeout=2), off=OffLoop(5.0), build=gate)
    asked = asyncio.create_task(client.get(NODES))
    gate.go.set()
    with pytest.raises(KubeconfigError, match=r"^kubeconfig kc: a certificate") as err:
        await asked
    with pytest.raises(KubeconfigError) as again:
        await client.ready()
    assert again.value is err.value
    assert api.count() == 0 and client.tally.requests == {}
    await client.close()  # nothing to give back


async def test_a_build_past_the_deadline_is_a_one_line_error(creds: Credentials) -> None:
    gate = GatedBuild()
    client = ApiClient.starting(creds, ClientPolicy(timeout=2), off=OffLoop(0.2), build=gate)
    try:
        with pytest.raises(KubeError, match="^reading the API server's certificates did not "
                                            r"answer within 0\.2 s$"):
            await client.get(NODES)
    finally:
        gate.go.set()
        await client.close()


async def test_a_close_during_the_build_gives_back_what_it_made(creds: Credentials) -> None:
    gate = GatedBuild()
    client = ApiClient.starting(creds, ClientPolicy(timeout=2), build=gate)
    closing = asyncio.create_task(client.close())
    await asyncio.sleep(0.1)
    assert not closing.done()  # the build's thread still works
    gate.go.set()
    await closing
    assert gate.closed == 1
    again = ApiClient.starting(creds, ClientPolicy(timeout=2), build=gate)
    await again.ready()
    assert gate.builds == 2  # the first one's was closed, not kept for the next
    await again.close()


async def test_connect_that_fails_leaves_nothing_held(creds: Credentials) -> None:
    gate = GatedBuild(fail="kubeconfig kc: cannot read a certificate or key: fix it")
    gate.go.set()
    with pytest.raises(KubeconfigError, match="cannot read"):
        await ApiClient.connect(creds, ClientPolicy(timeout=2), build=gate)
    gate.fail = None
    client = await ApiClient.connect(creds, ClientPolicy(timeout=2), build=gate)
    assert gate.builds == 2
    await client.close()
    assert gate.closed == 1


def _ca_certs(http: Any) -> int:
    """CA certificates loaded into the TLS context of a built HTTP client."""
    stats: dict[str, int] = http._transport._pool._ssl_context.cert_store_stats()
    return stats["x509_ca"]


async def test_a_plain_http_server_costs_no_trust_store(
        api: FakeApiServer, tmp_path: Path) -> None:
    plain = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "plain")),
                             context=None, env={}, home=tmp_path)
    http = _build_http(plain, 2.0)
    try:
        assert _ca_certs(http) == 0
        # lightkube's auth of the kubeconfig's user still goes with every request.
        answer = await http.request("GET", f"{NODES}/n1")
        assert answer.status_code == 200 and answer.json()["metadata"]["name"] == "n1"
    finally:
        await http.aclose()
    # Over TLS without a certificate-authority: the system's trust store, as before.
    tls = load_credentials(kubeconfig=str(write_kubeconfig(tmp_path / "tls",
                                                           "https://127.0.0.1:1")),
                           context=None, env={}, home=tmp_path)
    secure = _build_http(tls, 2.0)
    try:
        assert _ca_certs(secure) > 0
    finally:
        await secure.aclose()
