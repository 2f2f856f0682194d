"""The HTTP server: its connection cap, the hosts it binds, and an address in use.

The server is run in-process over a fixed status snapshot; the address-in-use case
runs ``rdma-hca serve`` as a process, since its answer is an exit status and a line.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest
from test_port_metrics import hca
from test_serve_process import child_env, free_port, metric_samples, serve, serve_argv

from rdma_hca.daemon.observe.httpserver import MetricsServer, split_address
from rdma_hca.daemon.observe.status import PoolStatus, Status
from rdma_hca.devkit.sim.tree import SimNode

STATUS = Status(version="t", pools=(PoolStatus("rdma/hca", 1000, 1000, 9, (), True, 1),))


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


async def get(host: str, port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


@pytest.mark.parametrize(("address", "host", "port"), [
    ("127.0.0.1:9478", "127.0.0.1", 9478),
    ("[::1]:9478", "::1", 9478),
    (":9478", None, 9478),
    ("[::]:1", "::", 1),
])
def test_split_address(address: str, host: str | None, port: int) -> None:
    assert split_address(address) == (host, port)


@pytest.mark.parametrize("address", ["127.0.0.1:0", "[::1]:0", ":0"])
async def test_binds_the_configured_host(address: str) -> None:
    if "::1" in address and not ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    if address == ":0":
        # Every address means one socket per family: port 0 would differ between them.
        address = f":{free_port()}"
    server = MetricsServer(lambda: STATUS, address)
    await server.start()
    try:
        port = server.bound_port
        reach = {"127.0.0.1:0": ["127.0.0.1"], "[::1]:0": ["::1"]}.get(
            address, ["127.0.0.1", *(["::1"] if ipv6_loopback() else [])])
        for host in reach:
            assert await get(host, port, "/readyz") == (200, "registered with the kubelet\n")
        if address == "127.0.0.1:0" and ipv6_loopback():
            with pytest.raises(OSError):
                await get("::1", port, "/readyz")
        if address == "[::1]:0":
            with pytest.raises(OSError):
                await get("127.0.0.1", port, "/readyz")
    finally:
        await server.stop()


async def test_connections_over_the_cap_get_503_at_once_and_are_counted() -> None:
    server = MetricsServer(lambda: STATUS, "127.0.0.1:0", max_connections=3)
    await server.start()
    port = server.bound_port
    idle: list[asyncio.StreamWriter] = []
    try:
        # Clients that connect and send nothing hold their slot until the read timeout.
        for _ in range(3):
            _, w = await asyncio.open_connection("127.0.0.1", port)
            idle.append(w)
        await asyncio.sleep(0.05)
        status, body = await get("127.0.0.1", port, "/metrics")
        assert (status, body) == (503, "too many connections\n")
        assert server.rejected == 1
        for w in idle:
            w.close()
        idle.clear()
        for _ in range(100):  # the slots come back once the idle clients have gone
            status, body = await get("127.0.0.1", port, "/metrics")
            if status == 200:
                break
            await asyncio.sleep(0.02)
        assert status == 200
        samples = metric_samples(body)
        assert samples["rdma_hca_http_connections_rejected_total"][0][1] >= 1
    finally:
        for w in idle:
            w.close()
        await server.stop()


async def test_metrics_address_in_use_is_one_line_and_exit_2(node: SimNode,
                                                             plugin_dir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with serve(serve_argv(node, plugin_dir, metrics_port=port)) as proc:
            assert await proc.wait_exit() == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.lines if f"127.0.0.1:{port}" in line]
    assert len(lines) == 1, proc.stderr
    assert "--metrics-address" in lines[0] and "already in use" in lines[0]
    assert not any("rdma-hca" in p.name and p.name.endswith(".sock")
                   for p in plugin_dir.iterdir())


@pytest.mark.parametrize("env", [{}, {"POD_UID": "pod-b"}], ids=["no-pod-uid", "pod-uid"])
async def test_a_port_shared_by_a_dra_alone_instance_is_refused_to_the_device_plugin(
        node: SimNode, plugin_dir: Path, env: dict[str, str]) -> None:
    """A second release beside a DRA-alone one: the device plugin does not share the
    port (its pods never overlap), so it stops with the one line and exit 2."""
    running = MetricsServer(lambda: STATUS, "127.0.0.1:0", share_port=True)
    await running.start()
    port = running.bound_port
    try:
        async with serve(serve_argv(node, plugin_dir, metrics_port=port),
                         child_env(**env)) as proc:
            assert await proc.wait_exit() == 2
        lines = [line for line in proc.lines if f"127.0.0.1:{port}" in line]
        assert len(lines) == 1, proc.stderr
        assert "--metrics-address" in lines[0] and "already in use" in lines[0]
        assert (await get("127.0.0.1", port, "/metrics"))[0] == 200  # still the first's
    finally:
        await running.stop()


async def test_counters_just_read_are_made_into_the_page_before_the_next_scrape() -> None:
    # A scrape after a busy interval would otherwise format every new value while the
    # scraper waits; the refresh makes the text, the scrape serves it.
    hcas = (hca("mlx5_0"),)
    now = {"status": Status(version="t", hcas=hcas,
                            counters={("mlx5_0", 1): {"port_rcv_data": 1}})}
    server = MetricsServer(lambda: now["status"], "127.0.0.1:0")
    await server.start()
    try:
        await server.counters_read()  # before the first scrape: the client is not loaded
        assert server.port_texts_made == 0
        status, body = await get("127.0.0.1", server.bound_port, "/metrics")
        assert status == 200
        assert 'rdma_hca_port_receive_bytes_total{hca="mlx5_0",port="1"} 4.0' in body
        assert server.port_texts_made == 1
        now["status"] = Status(version="t", hcas=hcas,
                               counters={("mlx5_0", 1): {"port_rcv_data": 250_000_000}})
        await server.counters_read()
        assert server.port_texts_made == 2
        status, body = await get("127.0.0.1", server.bound_port, "/metrics")
        assert status == 200
        assert 'rdma_hca_port_receive_bytes_total{hca="mlx5_0",port="1"} 1e+09' in body
        assert server.port_texts_made == 2  # served as made, not made again
    finally:
        await server.stop()
