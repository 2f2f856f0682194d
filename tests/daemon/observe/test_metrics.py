"""``/metrics``, ``/healthz`` and ``/readyz`` of a running ``rdma-hca serve`` process.

Scrapes go over real TCP to the child process; the text is parsed with
prometheus_client's own parser, so a malformed exposition fails here as it would
fail a Prometheus server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import grpc
import pytest
from test_serve_process import (
    WAIT,
    R,
    build_gpu_node,
    free_port,
    http_get,
    http_request,
    metric_samples,
    serve,
    serve_argv,
    wait_http,
    wait_registered,
)

import rdma_hca
from rdma_hca.daemon._proto import api_pb2, api_pb2_grpc
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode

FAMILIES = (
    "rdma_hca_hcas",
    "rdma_hca_port_up",
    "rdma_hca_port_state",
    "rdma_hca_port_rate_bytes_per_second",
    "rdma_hca_port_receive_bytes_total",
    "rdma_hca_pool_devices",
    "rdma_hca_pool_devices_healthy",
    "rdma_hca_registered",
    "rdma_hca_registrations_total",
    "rdma_hca_allocations_total",
    "rdma_hca_allocate_duration_seconds_count",
    "rdma_hca_allocate_duration_seconds_bucket",
    "rdma_hca_kubelet_restarts_total",
    "rdma_hca_ipv6_ready",
    "rdma_hca_build_info",
    "process_resident_memory_bytes",
    "process_open_fds",
    "rdma_hca_port_transmit_bytes_total",
    "rdma_hca_port_receive_packets_total",
    "rdma_hca_port_transmit_packets_total",
    "rdma_hca_port_receive_errors_total",
    "rdma_hca_port_transmit_discards_total",
    "rdma_hca_port_link_downed_total",
    "rdma_hca_port_state_changes_total",
    "rdma_hca_pool_hcas",
    "rdma_hca_sysfs_stalls_total",
    "rdma_hca_discovery_errors_total",
    "rdma_hca_http_connections_rejected_total",
    "rdma_hca_health_last_pass_timestamp_seconds",
)


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
          **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples in {samples.get(name)}"
    return found[0]


async def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, headers, body = await http_request(port, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    assert int(headers["content-length"]) == len(body.encode())
    return metric_samples(body)


async def test_healthz_always_readyz_after_registration(node: SimNode,
                                                        plugin_dir: Path) -> None:
    port = free_port()
    async with serve(serve_argv(node, plugin_dir, metrics_port=port)) as proc:
        await wait_http(port)
        assert await http_get(port, "/healthz") == (200, "ok\n")
        status, body = await http_get(port, "/readyz")
        assert (status, body) == (503, f"not registered yet: {R}\n")
        assert value(await scrape(port), "rdma_hca_registered", resource=R) == 0

        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        try:
            await wait_registered(kubelet)
            assert await http_get(port, "/readyz") == (200, "registered with the kubelet\n")
            assert (await http_get(port, "/healthz"))[0] == 200
            # The kubelet goes away: not ready any more, but alive all the same.
            await kubelet.stop()
            try:
                async with asyncio.timeout(WAIT):
                    while (await http_get(port, "/readyz"))[0] != 503:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise AssertionError("still ready with no kubelet; the daemon said:\n"
                                     + proc.stderr + "\nthe kubelet saw:\n"
                                     + "\n".join(kubelet.events())) from None
            assert (await http_get(port, "/healthz"))[0] == 200
        finally:
            await kubelet.stop()
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit() == 0


async def test_metric_families_and_values(node: SimNode, plugin_dir: Path) -> None:
    node.set_counter("mlx5_2", 1, "port_rcv_data", 1_000_000)
    port = free_port()
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    try:
        async with serve(serve_argv(node, plugin_dir, metrics_port=port)) as proc:
            await wait_registered(kubelet)
            await wait_http(port)
            samples = await scrape(port)
            # No Allocate yet, but every series an alert reads is there at 0 already.
            assert value(samples, "rdma_hca_allocate_duration_seconds_count", resource=R) == 0
            assert value(samples, "rdma_hca_allocations_total", resource=R, result="ok") == 0
            assert value(samples, "rdma_hca_allocations_total", resource=R, result="error") == 0
            assert value(samples, "rdma_hca_hca_missing", resource=R, hca="mlx5_2") == 0
            assert value(samples, "rdma_hca_hca_info", hca="mlx5_2", port="1")
            assert value(samples, "rdma_hca_port_symbol_errors_total", hca="mlx5_2",
                         port="1") == 0
            assert value(samples, "rdma_hca_port_hw_events_total", hca="mlx5_2", port="1",
                         counter="np_cnp_sent") == 0
            assert value(samples, "rdma_hca_port_receive_bytes_total",
                         hca="mlx5_2", port="1") == 4 * 1_000_000

            # Counters come from a cache the health loop keeps: a later value shows soon.
            node.set_counter("mlx5_2", 1, "port_rcv_data", 1_234_567)
            async with asyncio.timeout(WAIT):
                while value(await scrape(port), "rdma_hca_port_receive_bytes_total",
                            hca="mlx5_2", port="1") != 4 * 1_234_567:
                    await asyncio.sleep(0.2)
            resp = await kubelet.admit_pod(R, 1)
            assert resp.envs["RDMA_HCA_DEVICES"]
            # A refused Allocate counts as an error, and is timed too.
            with pytest.raises(Exception, match="unknown device IDs"):
                await kubelet.allocate(R, [["hca-9999"]])

            samples = await scrape(port)
            missing = [f for f in FAMILIES if f not in samples]
            assert not missing, f"families missing from /metrics: {missing}"
            assert value(samples, "rdma_hca_hcas", usable="true") == 9
            assert value(samples, "rdma_hca_hcas", usable="false") == 0
            assert len(samples["rdma_hca_port_up"]) == 9
            assert all(v == 1 for _, v in samples["rdma_hca_port_up"])
            assert value(samples, "rdma_hca_port_up", hca="mlx5_0", port="1",
                         link_layer="Ethernet") == 1
            assert value(samples, "rdma_hca_port_state", hca="mlx5_0", state="ACTIVE") == 1
            assert value(samples, "rdma_hca_port_state", hca="mlx5_0", state="DOWN") == 0
            rate = "rdma_hca_port_rate_bytes_per_second"
            assert value(samples, rate, hca="mlx5_0") == 400e9 / 8
            assert value(samples, rate, hca="mlx5_bond_0") == 200e9 / 8
            # port_rcv_data counts 4-byte words.
            assert value(samples, "rdma_hca_port_receive_bytes_total",
                         hca="mlx5_2", port="1") == 4 * 1_234_567
            assert value(samples, "rdma_hca_pool_devices", resource=R) == 1000
            assert value(samples, "rdma_hca_pool_devices_healthy", resource=R) == 1000
            assert value(samples, "rdma_hca_registered", resource=R) == 1
            assert value(samples, "rdma_hca_registrations_total", resource=R) == 1
            assert value(samples, "rdma_hca_allocations_total", resource=R, result="ok") == 1
            assert value(samples, "rdma_hca_allocations_total", resource=R, result="error") == 1
            assert value(samples, "rdma_hca_allocate_duration_seconds_count", resource=R) == 2
            assert value(samples, "rdma_hca_allocate_duration_seconds_bucket", resource=R,
                         le="+Inf") == 2
            assert value(samples, "rdma_hca_kubelet_restarts_total") == 0
            assert value(samples, "rdma_hca_pool_hcas", resource=R) == 9
            assert value(samples, "rdma_hca_build_info", version=rdma_hca.__version__) == 1
            assert value(samples, "rdma_hca_sysfs_stalls_total") == 0
            assert value(samples, "rdma_hca_discovery_errors_total", reason="fd") == 0
            assert value(samples, "rdma_hca_port_state_changes_total", hca="mlx5_0") == 0
            # Nothing has vanished: every HCA held reads 0.
            assert len(samples["rdma_hca_hca_missing"]) == 9
            assert all(v == 0 for _, v in samples["rdma_hca_hca_missing"])
            # An IPv4 compute network: non-hostNetwork RDMA cannot work here.
            assert value(samples, "rdma_hca_ipv6_ready") == 0

            before = kubelet.registrations(R)
            await kubelet.restart()
            await wait_registered(kubelet, more_than=before)
            # The kubelet holds the registration before the daemon has its answer and
            # counts it: scrape until the count shows it (or the deadline says it never did).
            deadline = asyncio.get_running_loop().time() + 10
            samples = await scrape(port)
            while value(samples, "rdma_hca_registrations_total", resource=R) < 2 \
                    and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
                samples = await scrape(port)
            assert value(samples, "rdma_hca_kubelet_restarts_total") >= 1
            assert value(samples, "rdma_hca_registrations_total", resource=R) >= 2
            proc.send(signal.SIGTERM)
            assert await proc.wait_exit() == 0
    finally:
        await kubelet.stop()


async def test_port_down_shows_in_metrics(node: SimNode, plugin_dir: Path) -> None:
    port = free_port()
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    try:
        async with serve(serve_argv(node, plugin_dir, metrics_port=port)):
            await wait_registered(kubelet)
            node.set_port("mlx5_4", 1, up=False)
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
            samples = await scrape(port)
            assert value(samples, "rdma_hca_port_up", hca="mlx5_4", port="1") == 0
            assert value(samples, "rdma_hca_port_state", hca="mlx5_4", state="DOWN") == 1
            assert value(samples, "rdma_hca_port_state", hca="mlx5_4", state="ACTIVE") == 0
            others = [v for lab, v in samples["rdma_hca_port_up"] if lab["hca"] != "mlx5_4"]
            assert others == [1.0] * 8
            assert value(samples, "rdma_hca_pool_devices_healthy", resource=R) == 0
            assert value(samples, "rdma_hca_pool_devices", resource=R) == 1000

            node.set_port("mlx5_4", 1, up=True)
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
            samples = await scrape(port)
            assert value(samples, "rdma_hca_port_up", hca="mlx5_4", port="1") == 1
            assert value(samples, "rdma_hca_pool_devices_healthy", resource=R) == 1000
    finally:
        await kubelet.stop()


async def test_ipv6_ready_on_an_ipv6_node(tmp_path: Path, plugin_dir: Path) -> None:
    node = build_gpu_node(tmp_path / "node6", ipv6=True)
    port = free_port()
    async with serve(serve_argv(node, plugin_dir, metrics_port=port)):
        await wait_http(port)
        # The gauge follows the first inventory's findings, which a loaded machine may
        # judge after /metrics already answers: wait for it, within WAIT.
        deadline = asyncio.get_running_loop().time() + WAIT
        while (ready := value(await scrape(port), "rdma_hca_ipv6_ready")) != 1 and (
                asyncio.get_running_loop().time() < deadline):
            await asyncio.sleep(0.05)
        assert ready == 1


async def test_other_paths_methods_and_junk(node: SimNode, plugin_dir: Path) -> None:
    port = free_port()
    async with serve(serve_argv(node, plugin_dir, metrics_port=port)) as proc:
        await wait_http(port)
        status, body = await http_get(port, "/")
        assert status == 404 and "/metrics" in body
        assert (await http_get(port, "/metricsz"))[0] == 404
        assert (await http_get(port, "/healthz/../metrics"))[0] == 404
        assert (await http_get(port, "/healthz?verbose=1"))[0] == 200
        for method in ("POST", "PUT", "DELETE"):
            status, _, body = await http_request(port, "/metrics", method=method)
            assert status == 405 and "GET" in body
        status, headers, body = await http_request(port, "/healthz", method="HEAD")
        assert (status, body) == (200, "") and headers["content-length"] == "3"
        # Junk, a bare request line and a huge header must not stop the server.
        for junk in (b"\x00\xff\r\n\r\n", b"GET\r\n\r\n", b"GET /healthz HTTP/1.1\r\nX: "
                     + b"a" * 100_000 + b"\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                with s.makefile("rb") as f:
                    reply = f.read()
            assert reply == b"" or reply.startswith((b"HTTP/1.1 405", b"HTTP/1.1 404"))
        assert (await http_get(port, "/healthz"))[0] == 200
        assert proc.proc.returncode is None
        assert "Traceback" not in proc.stderr


def listening_tcp_inodes() -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    out: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[len("socket:["):-1])
    return out


async def test_empty_metrics_address_serves_no_http(node: SimNode, plugin_dir: Path) -> None:
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    try:
        # serve_argv passes --metrics-address "" unless given a port.
        argv = serve_argv(node, plugin_dir)
        assert argv[argv.index("--metrics-address") + 1] == ""
        # The default port is where the server would be had "" not been honoured.
        with socket.socket() as s:
            default_port_taken = s.connect_ex(("127.0.0.1", 9478)) == 0
        async with serve(argv) as proc:
            await wait_registered(kubelet)
            assert not socket_inodes(proc.pid) & listening_tcp_inodes()
            if not default_port_taken:
                with pytest.raises(ConnectionRefusedError):
                    await http_get(9478, "/healthz")
            assert proc.count(lambda line: "serving /metrics" in line) == 0
    finally:
        await kubelet.stop()


class _NewKubeletDuringRegister(api_pb2_grpc.RegistrationServicer):
    """A kubelet whose Register is still being answered when kubelet.sock is created anew.

    The new kubelet.sock is bound but not listening yet (a kubelet starting up), so the
    daemon gives up the call in flight and its next Register fails: it is not registered
    with anyone from then on.
    """

    def __init__(self, plugin_dir: Path) -> None:
        self.sock_path = plugin_dir / "kubelet.sock"
        self.newcomer: socket.socket | None = None
        self.calls = 0

    async def Register(self, request: api_pb2.RegisterRequest,
                       context: object) -> api_pb2.Empty:
        self.calls += 1
        if self.calls == 1:
            self.sock_path.unlink()
            self.newcomer = socket.socket(socket.AF_UNIX)
            self.newcomer.bind(str(self.sock_path))
            # Long enough for the daemon to read the inotify event meanwhile.
            await asyncio.sleep(0.5)
        return api_pb2.Empty()


async def test_not_ready_after_a_superseded_registration(node: SimNode,
                                                         plugin_dir: Path) -> None:
    kubelet = _NewKubeletDuringRegister(plugin_dir)
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    await server.start()
    port = free_port()
    try:
        async with serve(serve_argv(node, plugin_dir, metrics_port=port)) as proc:
            # The call to the replaced kubelet.sock is given up, not waited for.
            await proc.wait_line(lambda line: "giving up the Register call in flight: "
                                              "kubelet.sock was created anew" in line)
            await proc.wait_line(lambda line: "Register on" in line and "failed" in line)
            assert kubelet.calls == 1
            assert proc.count(lambda line: "registered with the kubelet" in line) == 0
            assert (await http_get(port, "/readyz"))[0] == 503
            assert value(await scrape(port), "rdma_hca_registered", resource=R) == 0
    finally:
        await server.stop(None)
        if kubelet.newcomer is not None:
            kubelet.newcomer.close()
