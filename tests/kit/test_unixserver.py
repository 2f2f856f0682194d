"""The one unix-socket gRPC server both front ends serve the kubelet with."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import grpc
import pytest

from rdma_hca.kit.unixserver import UNIX_PATH_MAX, UnixServer, socket_path_problem


def _nothing(server: grpc.aio.Server) -> None:
    pass


async def test_the_socket_is_0600_even_at_umask_000(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        server = UnixServer(str(tmp_path / "s.sock"), _nothing, max_receive_bytes=1024)
        await server.start()
    finally:
        os.umask(old)
    try:
        mode = os.stat(server.path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        # The narrowed umask was only for the bind.
        assert os.umask(old) == old
    finally:
        await server.stop(0)
    assert not os.path.exists(server.path)


async def test_a_path_over_the_limit_is_named_before_bind(tmp_path: Path) -> None:
    path = "/tmp/" + "d" * (UNIX_PATH_MAX - 10) + "/s.sock"
    assert socket_path_problem(path) is not None
    server = UnixServer(path, _nothing, max_receive_bytes=1024, hint="use a shorter root")
    with pytest.raises(OSError, match=r"over the unix socket limit of 107; use a shorter root"):
        await server.start()


async def test_stop_leaves_a_file_someone_else_put_on_our_name(tmp_path: Path) -> None:
    server = UnixServer(str(tmp_path / "s.sock"), _nothing, max_receive_bytes=1024)
    await server.start()
    os.unlink(server.path)
    Path(server.path).write_text("not ours")
    assert not server.on_disk()
    await server.stop(0)
    assert Path(server.path).read_text() == "not ours"
