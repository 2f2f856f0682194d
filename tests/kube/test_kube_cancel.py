"""A stop that lands just as the API server's answer comes back still stops the caller.

On Python 3.11 ``asyncio.wait_for`` returns the inner call's result when the outer task
is cancelled after that call finished but before the task resumed: the cancel is lost.
A loop that makes API calls (the Event recorder's sender) then goes on after the stop
that cancelled it, and a stop that awaits it never ends. These tests put the cancel in
that window on purpose: the HTTP client's answer is handed back only after the cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rdma_hca.kube.client import ApiClient
from rdma_hca.kube.credentials import Credentials
from rdma_hca.kube.eventbody import EventSpec, ObjectRef
from rdma_hca.kube.events import EVENTS_POLICY, EventRecorder

NODES = "/api/v1/nodes"
POD = ObjectRef("Pod", "trainer-0", "ml", "uid-pod")
FAILED = EventSpec(POD, "ClaimPrepareFailed", "device dev0 is gone; check the HCA",
                   action="Prepare")


@pytest.fixture
async def client(creds: Credentials) -> AsyncIterator[ApiClient]:
    c = ApiClient(creds, EVENTS_POLICY)
    yield c
    await c.close()


def cancel_as_answered(client: ApiClient, stop: Any) -> None:
    """The next exchange of ``client`` gets its real answer, then ``stop()`` runs (or is
    scheduled) before the answer is handed back: the cancel reaches the caller after the
    exchange is done and before the caller resumes. Once: later exchanges are left alone,
    as a stop comes once."""
    http = client._http
    real = http.request
    stops = [stop]

    async def request(*args: Any, **kwargs: Any) -> Any:
        answer = await real(*args, **kwargs)
        if stops:
            stops.pop()()
        return answer

    http.request = request


async def test_a_cancel_that_lands_as_the_answer_comes_is_not_lost(
        client: ApiClient) -> None:
    call = asyncio.ensure_future(client.get(NODES))
    cancel_as_answered(client, call.cancel)
    await asyncio.wait({call}, timeout=10)
    assert call.cancelled(), "the call returned its answer after it was cancelled"


async def test_the_event_recorder_closes_when_its_cancel_lands_as_a_send_is_answered(
        client: ApiClient) -> None:
    recorder = EventRecorder(client, controller="rdma-hca.io/node-daemon", instance="n1")
    sender = recorder.start()
    closing: list[asyncio.Future[None]] = []
    cancel_as_answered(client, lambda: closing.append(asyncio.ensure_future(recorder.close())))
    recorder.record(FAILED)
    try:
        assert await _until(lambda: bool(closing))
        done, _ = await asyncio.wait(closing, timeout=3)
        assert done, "EventRecorder.close() never ended: its sender outlived the cancel"
    finally:
        sender.cancel()  # a second cancel ends it: it waits for work now
        await asyncio.wait([sender, *closing], timeout=10)


async def _until(predicate: Any, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
