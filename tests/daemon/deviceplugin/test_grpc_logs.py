"""gRPC's own logging: C-core silent unless asked, Python loggers in our format and levels."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_logs import json_line
from test_serve_process import R, serve, serve_argv, wait_registered

from rdma_hca.daemon._proto import api_pb2
from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.logs import quiet_grpc_core, setup_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    grpc_level = logging.getLogger("grpc").level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)
    logging.getLogger("grpc").setLevel(grpc_level)


def test_grpc_core_is_quiet_unless_the_operator_asks() -> None:
    env: dict[str, str] = {}
    quiet_grpc_core(env)
    assert env == {"GRPC_VERBOSITY": "NONE", "GRPC_TRACE": ""}
    asked = {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}
    quiet_grpc_core(asked)
    assert asked == {"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "http"}


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("level", ["info", "debug"])
def test_grpc_python_loggers_use_our_format_and_level(
        level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    setup_logging("json", level)
    logging.getLogger("grpc._cython.cygrpc").info("chatter about a connection")
    logging.getLogger("grpc.aio._server").warning("something gRPC wants said")
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [d["message"] for d in docs] == (
        ["chatter about a connection"] if level == "debug" else []) + [
        "something gRPC wants said"]
    assert docs[-1]["logger"] == "grpc.aio._server" and docs[-1]["level"] == "warning"


async def test_serve_under_attack_writes_only_json_lines(node: SimNode, tmp_path: Path) -> None:
    # The kubelet's directory is missing at first, then hostile clients call the plugin:
    # every line on stderr is still one of ours, and each thing is said once.
    plugin_dir = tmp_path / "dp"
    argv = serve_argv(node, plugin_dir, "--log-format", "json")
    async with serve(argv) as proc:
        await proc.wait_line(lambda line: "does not exist" in line)
        await asyncio.sleep(0.5)
        plugin_dir.mkdir()
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        try:
            await wait_registered(kubelet)
            target = "unix://" + str(plugin_dir / socket_name(R))
            async with grpc.aio.insecure_channel(target) as channel:
                allocate = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
                for _ in range(20):
                    with pytest.raises(grpc.aio.AioRpcError):
                        await allocate(b"\x0a\xff\xff\xff")
                big = api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=["x" * 60] * 70_000)])
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await allocate(big.SerializeToString())
                assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                for _ in range(5):
                    stream = channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch")(b"")
                    await stream.read()
                    stream.cancel()
            await kubelet.admit_pod(R, 1)
            assert kubelet.registrations(R) == 1
            proc.send(signal.SIGTERM)
            assert await proc.wait_exit() == 0
        finally:
            await kubelet.stop()
    docs = [json_line(line) for line in proc.lines]
    messages = [d["message"] for d in docs]
    assert sum("does not exist" in m for m in messages) == 1, messages
    assert sum("is not a valid" in m for m in messages) == 1, messages
    assert not [d for d in docs if d["level"] in ("error", "critical")], messages
