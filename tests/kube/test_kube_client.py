"""The one API client against the fake API server: Retry-After, backoff, resets, deadlines,
the rate limit. Waits go through an injected sleep, so nothing here waits out a backoff."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kit.backoff import Backoff, jittered
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import Credentials, load_credentials
from rdma_hca.kube.errors import ApiError, ConflictError, NotFoundError, UnreachableError
from rdma_hca.kube.policy import ClientPolicy, Priority, Rate, TokenBucket, retry_after
from rdma_hca.kube.tally import resource_verb

NODES = "/api/v1/nodes"


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def client(creds: Credentials, sleeps: Sleeps) -> AsyncIterator[ApiClient]:
    c = ApiClient(creds, ClientPolicy(timeout=2, budget=20), sleep=sleeps)
    yield c
    await c.close()


async def test_retry_after_on_429_is_what_the_client_waits(
        api: FakeApiServer, client: ApiClient, sleeps: Sleeps) -> None:
    api.fail(429, retry_after="3", times=2)
    nodes = await client.get(NODES)
    assert [n["metadata"]["name"] for n in nodes["items"]] == ["n1"]
    assert sleeps.waits == [3.0, 3.0]
    assert api.count("GET", NODES) == 3


async def test_503_without_retry_after_backs_off_with_jitter(
        api: FakeApiServer, client: ApiClient, sleeps: Sleeps) -> None:
    api.fail(503, times=3)
    await client.get(NODES)
    first, second, third = sleeps.waits
    assert 0.1 <= first <= 0.2 and 0.2 <= second <= 0.4 and 0.4 <= third <= 0.8


async def test_500_without_retry_after_is_not_retried(
        api: FakeApiServer, client: ApiClient, sleeps: Sleeps) -> None:
    api.fail(500)
    with pytest.raises(ApiError, match="HTTP 500") as err:
        await client.get(NODES)
    assert err.value.status == 500 and sleeps.waits == []
    assert api.count("GET", NODES) == 1


async def test_a_retry_after_beyond_the_budget_fails_at_once(
        api: FakeApiServer, client: ApiClient, sleeps: Sleeps) -> None:
    api.fail(429, retry_after="45")
    with pytest.raises(ApiError, match="HTTP 429"):
        await client.get(NODES)
    assert sleeps.waits == []


async def test_a_call_that_gives_up_still_says_what_the_server_asked(
        api: FakeApiServer, client: ApiClient, sleeps: Sleeps) -> None:
    api.fail(429, retry_after="7200")  # past the client's own cap of one wait, too
    with pytest.raises(ApiError) as err:
        await client.get(NODES)
    assert err.value.retry_after == 7200.0 and sleeps.waits == []
    api.fail(500)
    with pytest.raises(ApiError) as err:
        await client.get(NODES)
    assert err.value.retry_after is None


async def test_a_reset_get_is_tried_again_a_reset_write_is_not(
        api: FakeApiServer, client: ApiClient, sleeps: Sleeps) -> None:
    api.reset(method="GET")
    assert (await client.get(f"{NODES}/n1"))["metadata"]["name"] == "n1"
    assert api.count("GET", f"{NODES}/n1") == 2
    api.reset(method="POST")
    with pytest.raises(UnreachableError, match="unreachable"):
        await client.request("POST", "/apis/resource.k8s.io/v1/resourceslices", body={})
    assert api.count("POST") == 1


async def test_a_hung_request_ends_at_its_deadline(
        api: FakeApiServer, tmp_path: Path) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    client = ApiClient(creds, ClientPolicy(timeout=0.3))
    api.hang(30)
    try:
        with pytest.raises(UnreachableError, match=r"no answer within 0\.3 s"):
            await client.get(NODES)
    finally:
        await client.close()


async def test_retries_end_at_the_call_deadline(api: FakeApiServer, tmp_path: Path) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    client = ApiClient(creds, ClientPolicy(timeout=5, budget=0.4))
    api.reset(method="GET")  # retried at once (a reset GET)...
    api.hang(30)  # ...into a hang: the exchange gets what is left of the 0.4 s, not 5 s
    try:
        with pytest.raises(UnreachableError, match=r"no answer within 0\.[0-4]"):
            await client.get(NODES)
    finally:
        await client.close()
    assert api.count("GET", NODES) == 2


async def test_status_errors_are_typed(api: FakeApiServer, client: ApiClient) -> None:
    with pytest.raises(NotFoundError, match="HTTP 404"):
        await client.get(f"{NODES}/nope")
    api.fail(409)
    with pytest.raises(ConflictError):
        await client.get(NODES)


async def test_every_request_takes_a_token(api: FakeApiServer, tmp_path: Path,
                                           sleeps: Sleeps) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    now = [100.0]
    client = ApiClient(creds, ClientPolicy(qps=5, burst=10), clock=lambda: now[0],
                       sleep=sleeps)
    try:
        for _ in range(12):
            await client.get(NODES)
    finally:
        await client.close()
    # The clock stood still: ten went at once, the 11th and 12th waited 1/5 s and 2/5 s.
    assert sleeps.waits == pytest.approx([0.2, 0.4])
    assert client.limiter.throttled == 2


def test_token_bucket_refills_at_qps() -> None:
    now = [0.0]
    bucket = TokenBucket(2, 3, clock=lambda: now[0])
    assert [bucket.reserve() for _ in range(3)] == [0, 0, 0]
    assert bucket.reserve() == pytest.approx(0.5)
    now[0] = 10.0  # long idle: back to a full burst, not more
    assert [bucket.reserve() for _ in range(3)] == [0, 0, 0]
    assert bucket.reserve() > 0
    with pytest.raises(ValueError, match="qps > 0"):
        TokenBucket(0, 1)


def test_backoff_grows_to_its_cap_and_retry_after_is_read() -> None:
    b = Backoff(1, 8)
    waits = [b.next() for _ in range(6)]
    assert all(lo / 2 <= w <= lo for w, lo in zip(waits, [1, 2, 4, 8, 8, 8], strict=True))
    assert retry_after("7") == 7 and retry_after(None) is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 1.0
    assert retry_after("100000") == 60.0
    assert 8 <= jittered(10, 0.2) <= 12 and jittered(10, 0) == 10


class Clock:
    """A clock that the injected sleep moves on: waits pass at once, in order."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def test_a_high_request_never_waits_behind_low_ones() -> None:
    now = [0.0]

    async def tick(seconds: float) -> None:  # time moves only when the test moves it
        await asyncio.sleep(0)

    bucket = TokenBucket(1, 1, clock=lambda: now[0], sleep=tick)
    order: list[str] = []

    async def take(name: str, priority: Priority) -> None:
        await bucket.take(priority)
        order.append(name)

    await bucket.take()  # the burst is used up
    lows = [asyncio.create_task(take(f"low{i}", Priority.LOW)) for i in range(5)]
    for _ in range(3):
        await asyncio.sleep(0)  # the LOW ones wait first...
    high = asyncio.create_task(take("high", Priority.HIGH))
    await asyncio.sleep(0)  # it asks before the next token comes
    while not all(t.done() for t in (high, *lows)):
        now[0] += 1.0  # one token a second
        for _ in range(5):
            await asyncio.sleep(0)
    # ...and the HIGH one asked after them goes with the next token; the LOWs in order.
    assert order == ["high", "low0", "low1", "low2", "low3", "low4"]
    assert bucket.throttled == 6 and bucket.waited == pytest.approx(1 + 2 + 3 + 4 + 5 + 6)


async def test_waiting_for_a_token_does_not_shorten_the_exchange(
        api: FakeApiServer, tmp_path: Path) -> None:
    creds = load_credentials(kubeconfig=str(api.write_kubeconfig(tmp_path / "kc")),
                             context=None, env={}, home=tmp_path)
    clock = Clock()
    # A read deadline of 1 s; the third of three claims read at once waits 2 s for its token.
    client = ApiClient(creds, ClientPolicy(qps=5, burst=10, timeout=1, budget=1,
                                           rates=(Rate("claims", 1, 1),)),
                       clock=clock, sleep=clock.sleep)
    api.on_request = lambda record: time.sleep(0.1)  # each answer takes 0.1 s
    try:
        answers = await asyncio.gather(*(client.get(NODES, rate="claims") for _ in range(3)))
    finally:
        await client.close()
    # Each had its full second: none failed on "no answer within 0.05 s".
    assert [len(a["items"]) for a in answers] == [1, 1, 1]
    assert client.tally.waited["claims"] >= 1  # past the 1 s deadline, all together
    assert client.tally.waited["default"] == 0


async def test_requests_are_counted_by_resource_verb_and_code(
        api: FakeApiServer, client: ApiClient) -> None:
    api.fail(503, times=1)
    await client.get(NODES)
    with pytest.raises(NotFoundError):
        await client.get(f"{NODES}/nope")
    with pytest.raises(ValueError, match="no rate limit named 'other'"):
        await client.get(NODES, rate="other")
    assert client.tally.requests == {("nodes", "list", "503"): 1, ("nodes", "list", "200"): 1,
                                     ("nodes", "get", "404"): 1}


def test_resource_and_verb_of_a_path() -> None:
    claims = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"
    assert resource_verb("GET", f"{claims}/c") == ("resourceclaims", "get")
    assert resource_verb("PUT", f"{claims}/c/status") == ("resourceclaims/status", "update")
    assert resource_verb("GET", "/apis/resource.k8s.io/v1/resourceslices") == (
        "resourceslices", "list")
    assert resource_verb("POST", "/apis/resource.k8s.io/v1/resourceslices") == (
        "resourceslices", "create")
    assert resource_verb("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s") == (
        "resourceslices", "delete")
    assert resource_verb("GET", "/api/v1/nodes/n") == ("nodes", "get")
    assert resource_verb("GET", "/api/v1/pods", {"watch": "1"}) == ("pods", "watch")
