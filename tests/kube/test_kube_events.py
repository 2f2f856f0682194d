"""The Event recorder against the fake API server: series instead of new objects, the
core v1 fallback, a bounded queue that drops and counts, and a held server that never
holds the caller. Clocks are injected: a series window passes without waiting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import Credentials
from rdma_hca.kube.eventbody import NORMAL, EventSpec, ObjectRef
from rdma_hca.kube.events import EVENTS_POLICY, EventRecorder

POD = ObjectRef("Pod", "trainer-0", "ml", "uid-pod")
NODE = ObjectRef("Node", "n1", uid="n1")
FAILED = EventSpec(POD, "ClaimPrepareFailed", "device dev0 is no longer on this node; check "
                   "the HCA", action="Prepare")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(creds: Credentials) -> AsyncIterator[ApiClient]:
    c = ApiClient(creds, EVENTS_POLICY)
    yield c
    await c.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def recorder(client: ApiClient, clock: Clock) -> AsyncIterator[EventRecorder]:
    r = EventRecorder(client, controller="rdma-hca.io/node-daemon", instance="n1",
                      clock=clock)
    r.start()
    yield r
    await r.close()


async def test_repeats_are_one_event_with_a_series(
        api: FakeApiServer, recorder: EventRecorder, clock: Clock) -> None:
    recorder.record(FAILED)
    assert await recorder.drain(10)
    (first,) = api.events(reason="ClaimPrepareFailed")
    assert "series" not in first
    for _ in range(20):  # the kubelet retrying: they come while the first is out, or after
        clock.now += 5
        recorder.record(FAILED)
    assert await recorder.drain(10)
    events = api.events(reason="ClaimPrepareFailed")
    assert len(events) == 1
    event = events[0]
    assert event["regarding"] == {"apiVersion": "v1", "kind": "Pod", "name": "trainer-0",
                                  "namespace": "ml", "uid": "uid-pod"}
    assert event["metadata"]["namespace"] == "ml"
    assert event["type"] == "Warning" and event["action"] == "Prepare"
    assert event["series"]["count"] == 21
    assert recorder.api == "events.k8s.io/v1"
    assert recorder.created == 1 and recorder.dropped == 0 and recorder.failed == 0
    # Discovery was asked once, and repeats went out as merge patches of the one Event.
    assert api.count("GET", "/apis/events.k8s.io/v1") == 1
    assert api.count("POST", "/events") == 1
    assert api.count("PATCH", "/events/" + first["metadata"]["name"]) == 1


async def test_a_repeat_after_the_window_is_a_new_event(
        api: FakeApiServer, recorder: EventRecorder, clock: Clock) -> None:
    recorder.record(FAILED)
    assert await recorder.drain(10)
    clock.now += recorder.window + 1
    recorder.record(FAILED)
    assert await recorder.drain(10)
    assert len(api.events(reason="ClaimPrepareFailed")) == 2


async def test_core_v1_where_events_k8s_io_is_not_served(
        api: FakeApiServer, recorder: EventRecorder) -> None:
    api.cluster.events_v1 = False
    recorder.record(EventSpec(NODE, "HcaPortUp", "mlx5_0 port 1 is up", type=NORMAL))
    recorder.record(EventSpec(NODE, "HcaPortUp", "mlx5_0 port 1 is up", type=NORMAL))
    assert await recorder.drain(10)
    assert recorder.api == "v1"
    assert api.count("POST", "/api/v1/namespaces/default/events") == 1
    assert api.count("POST", "/apis/events.k8s.io") == 0
    (event,) = api.events(reason="HcaPortUp", kind="Node", name="n1")
    assert event["metadata"]["namespace"] == "default"
    assert event["type"] == "Normal"
    assert event["deprecatedCount"] == 2  # core v1 counts repeats in count
    assert event["note"] == "mlx5_0 port 1 is up"


async def test_a_full_queue_drops_and_counts(api: FakeApiServer, client: ApiClient,
                                             clock: Clock) -> None:
    recorder = EventRecorder(client, controller="rdma-hca.io/node-daemon", instance="n1",
                             clock=clock, queue_size=3)
    # Not started: nothing leaves the queue.
    for i in range(5):
        recorder.record(EventSpec(NODE, "HcaPortDown", f"mlx5_{i} port 1 is down"))
    recorder.record(EventSpec(NODE, "HcaPortDown", "mlx5_0 port 1 is down"))  # coalesced
    assert recorder.dropped == 2
    recorder.start()
    assert await recorder.drain(10)
    assert len(api.events(reason="HcaPortDown")) == 3
    await recorder.close()


async def test_a_held_server_never_holds_the_caller(
        api: FakeApiServer, recorder: EventRecorder) -> None:
    api.hang(30, path="/events", times=100)
    for i in range(200):  # never waits, never raises, whatever the server does
        recorder.record(EventSpec(NODE, "HcaPortDown", f"mlx5_{i} port 1 is down"))
    assert recorder.dropped == 200 - recorder.queue_size
    assert not await recorder.drain(0.05)
    # Anything else the server serves is answered meanwhile.
    api.add_node("n1")
    assert api.cluster.nodes


async def test_a_forbidden_write_is_counted_not_raised(
        api: FakeApiServer, recorder: EventRecorder) -> None:
    api.cluster.forbidden.add("events")
    recorder.record(FAILED)
    assert await recorder.drain(10)
    assert recorder.failed == 1 and api.events() == []


async def test_an_expired_event_starts_again(
        api: FakeApiServer, recorder: EventRecorder) -> None:
    recorder.record(FAILED)
    assert await recorder.drain(10)
    api.cluster.events.clear()  # the server's TTL (an hour) removed it
    recorder.record(FAILED)
    assert await recorder.drain(10)
    (event,) = api.events()
    assert event["series"]["count"] == 2


async def test_long_fields_are_cut_to_the_limits(
        api: FakeApiServer, recorder: EventRecorder) -> None:
    recorder.record(EventSpec(POD, "R" * 300, "é" * 2000, action="A" * 300))
    assert await recorder.drain(10)
    (event,) = api.events()
    assert len(event["reason"]) == 128 and len(event["action"]) == 128
    assert len(event["note"].encode()) <= 1024
    assert recorder.failed == 0


async def test_close_sends_what_is_queued_within_its_grace(
        api: FakeApiServer, client: ApiClient, clock: Clock) -> None:
    recorder = EventRecorder(client, controller="rdma-hca.io/node-daemon", instance="n1",
                             clock=clock)
    recorder.start()
    recorder.record(FAILED)
    await recorder.close(grace=10)
    assert len(api.events()) == 1
    await asyncio.sleep(0)
