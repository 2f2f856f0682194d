"""A unix-socket server whose path another process has taken since: stopping it leaves
the other's socket, and starting it puts its socket in place in one rename."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import grpc

from rdma_hca.kit.unixserver import UnixServer


def _nothing(server: grpc.aio.Server) -> None:
    pass


async def test_stopping_leaves_a_socket_another_process_put_on_the_path(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    server = UnixServer(path, _nothing, max_receive_bytes=1024)
    await server.start()
    os.unlink(path)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        other.bind(path)
        other.listen()
        ident = os.stat(path).st_ino
        await server.stop(0)  # gRPC removes the path it bound: not this one
        assert os.stat(path).st_ino == ident
    finally:
        other.close()


async def test_a_socket_left_on_the_path_is_replaced_in_one_rename(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(path)  # what a process killed with -9 leaves
    left.close()
    server = UnixServer(path, _nothing, max_receive_bytes=1024)
    await server.start()
    try:
        assert server.on_disk()
        assert os.listdir(tmp_path) == ["s.sock"]  # no hidden name left beside it
    finally:
        await server.stop(0)
    assert os.listdir(tmp_path) == []
