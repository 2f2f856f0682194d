"""Two instances on one metrics port, each probed on its own socket (a DRA rolling update on
the host network), and ``rdma-hca probe``, the exec probe that asks it."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_http_server import get

from rdma_hca.daemon.observe.httpserver import BindError, MetricsServer
from rdma_hca.daemon.observe.status import DraStatus, PoolStatus, Status
from rdma_hca.kit.probe import ProbeError, ask, probe_socket_path
from rdma_hca.tools import probe

# Alive whatever the clock says: these snapshots never change.
READY = Status(version="new", pools=(PoolStatus("rdma/hca", 1000, 1000, 9, (), True, 1),),
               health_stale_after=float("inf"))
NOT_READY = Status(version="old", dra=DraStatus(registered=False, registrations=0,
                                                  prepared_claims=0, publish_error=None))


@pytest.fixture
def probe_dir() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: a short directory under /tmp.
    with tempfile.TemporaryDirectory(prefix="probe-", dir="/tmp") as d:
        yield d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(endpoint: str, directory: str) -> argparse.Namespace:
    return argparse.Namespace(endpoint=endpoint, dir=directory, timeout=2.0)


async def test_two_instances_share_the_port_and_each_answers_its_own_probes(
        probe_dir: str) -> None:
    port = free_port()
    old = MetricsServer(lambda: NOT_READY, f"127.0.0.1:{port}",
                        probe_socket=probe_socket_path(probe_dir, "pod-old"), share_port=True)
    new = MetricsServer(lambda: READY, f"127.0.0.1:{port}",
                        probe_socket=probe_socket_path(probe_dir, "pod-new"), share_port=True)
    await old.start()
    try:
        await new.start()  # beside the old one: no "already in use"
        try:
            assert old.bound_port == new.bound_port == port
            for _ in range(3):
                assert (await asyncio.to_thread(
                    ask, probe_socket_path(probe_dir, "pod-old"), "/readyz", 2))[0] == 503
                status, body = await asyncio.to_thread(
                    ask, probe_socket_path(probe_dir, "pod-new"), "/readyz", 2)
                assert (status, body) == (200, "registered with the kubelet\n")
            assert (await get("127.0.0.1", port, "/metrics"))[0] == 200
        finally:
            await new.stop()
        assert not os.path.exists(probe_socket_path(probe_dir, "pod-new"))
        # The old one keeps the port when the new one goes first (a failed rollout): every
        # TCP answer is now the old one's.
        for _ in range(3):
            assert (await get("127.0.0.1", port, "/readyz"))[0] == 503
    finally:
        await old.stop()
    assert not os.path.exists(probe_socket_path(probe_dir, "pod-old"))


async def test_a_port_held_by_another_program_is_still_a_bind_error(probe_dir: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = MetricsServer(lambda: READY, f"127.0.0.1:{port}",
                               probe_socket=probe_socket_path(probe_dir, "pod-a"),
                               share_port=True)
        with pytest.raises(BindError, match="already in use"):
            await server.start()
    assert not os.path.exists(probe_socket_path(probe_dir, "pod-a"))


@pytest.mark.parametrize(("first", "second"), [(False, False), (True, False), (False, True)],
                         ids=["neither-shares", "second-does-not", "first-does-not"])
async def test_an_instance_that_does_not_share_is_refused_the_port(
        probe_dir: str, first: bool, second: bool) -> None:
    """Outside a DRA-alone rolling update (a second release, a second serve) the port is
    one instance's: the other is refused, never answering the first's probes."""
    port = free_port()
    running = MetricsServer(lambda: READY, f"127.0.0.1:{port}",
                            probe_socket=probe_socket_path(probe_dir, "pod-a"), share_port=first)
    await running.start()
    try:
        other = MetricsServer(lambda: NOT_READY, f"127.0.0.1:{port}",
                              probe_socket=probe_socket_path(probe_dir, "pod-b"),
                              share_port=second)
        with pytest.raises(BindError, match="already in use"):
            await other.start()
        assert not os.path.exists(probe_socket_path(probe_dir, "pod-b"))
        for _ in range(3):
            assert (await get("127.0.0.1", port, "/readyz"))[0] == 200
    finally:
        await running.stop()


async def test_a_socket_left_by_the_previous_container_is_replaced(probe_dir: str) -> None:
    path = probe_socket_path(probe_dir, "pod-a")
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(path)
    left.close()  # the file stays, nobody listens
    server = MetricsServer(lambda: READY, "127.0.0.1:0", probe_socket=path)
    await server.start()
    try:
        assert (await asyncio.to_thread(ask, path, "/healthz", 2))[0] == 200
        assert os.stat(path).st_mode & 0o777 == 0o600
    finally:
        await server.stop()


async def test_a_probe_socket_path_too_long_is_one_line(tmp_path: Path) -> None:
    path = str(tmp_path / ("d" * 120) / "x.sock")
    server = MetricsServer(lambda: READY, "127.0.0.1:0", probe_socket=path)
    with pytest.raises(BindError) as err:
        await server.start()
    assert "longer than 107 bytes" in str(err.value) and "TMPDIR" in str(err.value)
    assert server._server is None  # the TCP port went with it


async def test_probe_command_exit_statuses(probe_dir: str, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    ready = MetricsServer(lambda: READY, "127.0.0.1:0",
                          probe_socket=probe_socket_path(probe_dir, "pod-r"))
    waiting = MetricsServer(lambda: NOT_READY, "127.0.0.1:0",
                            probe_socket=probe_socket_path(probe_dir, "pod-w"))
    await ready.start()
    await waiting.start()
    try:
        monkeypatch.setenv("POD_UID", "pod-r")
        assert await asyncio.to_thread(probe.run, _args("readyz", probe_dir)) == 0
        assert capsys.readouterr().out == "registered with the kubelet\n"
        monkeypatch.setenv("POD_UID", "pod-w")
        assert await asyncio.to_thread(probe.run, _args("readyz", probe_dir)) == 1
        assert capsys.readouterr().err == \
            "not registered yet: the DRA driver (plugin watcher)\n"
        assert await asyncio.to_thread(probe.run, _args("healthz", probe_dir)) == 1
        assert capsys.readouterr().err.startswith("the health loop has not completed a pass")
    finally:
        await ready.stop()
        await waiting.stop()
    monkeypatch.setenv("POD_UID", "pod-r")  # its daemon is gone
    assert probe.run(_args("readyz", probe_dir)) == 1
    err = capsys.readouterr().err
    assert err.startswith("rdma-hca probe readyz: no probe socket at ") and err.count("\n") == 1
    monkeypatch.delenv("POD_UID")
    assert probe.run(_args("readyz", probe_dir)) == 2
    assert "POD_UID is not set" in capsys.readouterr().err


def test_a_socket_that_answers_no_http_is_a_probe_error(probe_dir: str) -> None:
    path = probe_socket_path(probe_dir, "pod-x")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        srv.listen()

        def answer() -> None:
            conn, _ = srv.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"hello")

        import threading
        t = threading.Thread(target=answer)
        t.start()
        with pytest.raises(ProbeError, match="gave no HTTP answer"):
            ask(path, "/readyz", 2)
        t.join()


async def test_the_charts_exec_command_runs_as_a_module(probe_dir: str) -> None:
    """What the chart's probes run, as the kubelet runs it: a process in the pod's env."""
    server = MetricsServer(lambda: READY, "127.0.0.1:0",
                           probe_socket=probe_socket_path(probe_dir, "pod-m"))
    await server.start()
    try:
        env = {**os.environ, "POD_UID": "pod-m", "TMPDIR": probe_dir}
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "rdma_hca.tools.probe", "readyz"],
            env=env, capture_output=True, text=True, timeout=30)
    finally:
        await server.stop()
    assert (done.returncode, done.stdout, done.stderr) == \
        (0, "registered with the kubelet\n", "")


async def test_rdma_hca_probe_is_the_same_command(
        probe_dir: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_hca import cli

    monkeypatch.setenv("POD_UID", "pod-elsewhere")  # main(env=...) is what counts
    server = MetricsServer(lambda: READY, "127.0.0.1:0",
                           probe_socket=probe_socket_path(probe_dir, "pod-c"))
    await server.start()
    try:
        code = await asyncio.to_thread(cli.main, ["probe", "readyz", "--dir", probe_dir],
                                       env={"POD_UID": "pod-c"})
    finally:
        await server.stop()
    assert code == 0 and capsys.readouterr().out == "registered with the kubelet\n"
    assert cli.main(["probe", "readyz", "--dir", probe_dir], env={}) == 2
    assert "POD_UID is not set" in capsys.readouterr().err
