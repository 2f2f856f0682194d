"""Instances of the driver on one node: one writer per socket path, no sockets left by
dead instances, and a second instance following the checkpoint the other writes."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dra_support import DRIVER, NODE

from rdma_hca.contract.checkpoint import Claims, PreparedClaim, PreparedDevice, Share
from rdma_hca.daemon.dra.checkpoint import Checkpoint, write_file
from rdma_hca.daemon.dra.claims import ClaimRef
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.daemon.dra.follow import CheckpointFollower
from rdma_hca.daemon.dra.kubeletplugin import sockets as sockets_module
from rdma_hca.daemon.dra.kubeletplugin.options import DraConfigError
from rdma_hca.daemon.dra.kubeletplugin.services import (
    RegistrationService,
    add_registration_service,
)
from rdma_hca.daemon.dra.kubeletplugin.sockets import KubeletSockets, SocketInUse, SocketTaken
from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.dra.stage import DraStage, share_result
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.kit.aio import cancel_all
from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kit.unixserver import UnixServer
from rdma_hca.settings.config import DraConfig
from rdma_hca.settings.model import Settings

UID_A = "6f1c2b3a-0000-4000-8000-00000000000a"
UID_B = "6f1c2b3a-0000-4000-8000-00000000000b"
SHARE = "0b0a1c2d-0000-4000-8000-00000000000a"


@pytest.fixture
def root() -> Iterator[str]:
    """A kubelet root short enough for unix socket paths."""
    path = tempfile.mkdtemp(prefix="dra-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(root: str, pod_uid: str = "") -> DriverConfig:
    settings = Settings(kubelet_root=root, node_name=NODE, pod_uid=pod_uid,
                        dra=DraConfig(enabled=True))
    return DriverConfig.from_settings(settings)


def _listening(path: str) -> socket.socket:
    """A live instance's socket: bound and listening at ``path``, put there in one rename."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    hidden = os.path.join(os.path.dirname(path), ".live")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(hidden)
    sock.listen()
    os.rename(hidden, path)
    return sock


def _dead(path: str) -> None:
    """What a process killed with -9 leaves: a socket file nothing listens on."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen()
    sock.close()


def _inode(path: str) -> int:
    return os.lstat(path).st_ino


# --- one writer per socket path ----------------------------------------------------------


async def test_a_second_instance_without_pod_uid_refuses_to_start_and_names_the_first(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api) as s:
        assert s.driver is not None and s.watcher is not None and await s.registered()
        first = s.driver
        serves, endpoint = first.helper.sockets.serves, first.config.endpoint
        ident = _inode(endpoint), _inode(first.config.registration_socket)
        second = DraDriver(s.config())
        try:
            with pytest.raises(DraConfigError) as refused:
                await second.start(s.watcher.inventory)
        finally:
            await second.stop()
        message = str(refused.value)
        assert endpoint in message and f"pid {os.getpid()}" in message
        assert "stop the other instance" in message and "POD_UID" in message
        assert "\n" not in message
        # The first was not disturbed: same sockets, not served again, still registered.
        assert (_inode(endpoint), _inode(first.config.registration_socket)) == ident
        assert first.helper.sockets.serves == serves and first.stats().registered
        assert s.kubelet is not None and s.kubelet.events.registered.count(DRIVER) == 1


async def test_a_live_registration_socket_alone_refuses_the_start(root: str) -> None:
    config = _config(root)
    other = _listening(config.registration_socket)
    try:
        sockets = KubeletSockets(config, lambda server: None)
        with pytest.raises(SocketInUse) as refused:
            await sockets.start()
        assert config.registration_socket in str(refused.value)
        assert not os.path.exists(config.endpoint)  # nothing served, nothing touched
        assert os.path.exists(config.registration_socket)
    finally:
        other.close()


async def test_a_dra_socket_replaced_by_a_live_instance_is_not_taken_back(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with DraStage(dra_node, tmp_path / "s", api=api) as s:
        assert s.driver is not None and await s.registered()
        sockets = s.driver.helper.sockets
        serves = sockets.serves
        (keeper,) = [t for t in sockets.tasks if t.get_name() == "dra-sockets"]
        endpoint = s.driver.config.endpoint
        other = _listening(endpoint)  # an instance that did not check
        try:
            ident = _inode(endpoint)
            done, _ = await asyncio.wait({keeper}, timeout=30)
            assert keeper in done and isinstance(keeper.exception(), SocketTaken)
            assert f"pid {os.getpid()}" in str(keeper.exception())
            # Given way: nothing re-created, the other's socket kept, ours gone.
            assert sockets.serves == serves and not sockets.registered
            assert sockets.gave_way is not None
            assert _inode(endpoint) == ident
            assert not os.path.exists(s.driver.config.registration_socket)
            await s.stop_driver()  # and its stop leaves the other's socket alone
            assert _inode(endpoint) == ident
        finally:
            other.close()


async def test_a_registration_socket_held_by_a_live_instance_is_not_fought_over(
        root: str) -> None:
    config = dataclasses.replace(_config(root), socket_check_seconds=0.05)
    sockets = KubeletSockets(config, lambda server: None)
    await sockets.start()
    try:
        serves = sockets.serves
        other = _listening(config.registration_socket)
        try:
            ident = _inode(config.registration_socket)
            for _ in range(2000):
                if sockets.waiting_for is not None:
                    break
                await asyncio.sleep(0.005)
            assert sockets.waiting_for == config.registration_socket
            assert _inode(config.registration_socket) == ident and sockets.serves == serves
        finally:
            other.close()
            os.unlink(config.registration_socket)  # that instance goes
        # Gone: ours is served again at once.
        for _ in range(2000):
            if sockets.serves > serves:
                break
            await asyncio.sleep(0.005)
        assert sockets.serves == serves + 1
        assert os.path.exists(config.registration_socket)
        assert all(not t.done() for t in sockets.tasks)
    finally:
        await sockets.stop()


async def test_two_instances_started_at_one_moment_end_with_one_serving(
        root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(root)
    first = KubeletSockets(config, lambda server: None)
    second = KubeletSockets(config, lambda server: None)
    # Both look before either serves, and so neither sees the other at first.
    monkeypatch.setattr(sockets_module, "peer_at", lambda path: None)
    await first.start()
    await second.start()
    monkeypatch.undo()
    try:
        keepers = {next(t for t in k.tasks if t.get_name() == "dra-sockets"): k
                   for k in (first, second)}
        done, _ = await asyncio.wait(keepers, timeout=30,
                                     return_when=asyncio.FIRST_COMPLETED)
        (ended,) = done
        assert isinstance(ended.exception(), SocketTaken)
        loser = keepers[ended]
        winner = second if loser is first else first
        assert loser.gave_way is not None and not loser.registered
        # The other serves both paths, and keeps serving.
        assert winner._dra is not None and winner._dra.on_disk()
        assert winner._reg is not None and winner._reg.on_disk()
        assert all(not t.done() for t in winner.tasks) and winner.gave_way is None
    finally:
        await first.stop()
        await second.stop()


# --- one driver per node ------------------------------------------------------------------


async def _keeper_ends(sockets: KubeletSockets) -> BaseException | None:
    (keeper,) = [t for t in sockets.tasks if t.get_name() == "dra-sockets"]
    done, _ = await asyncio.wait({keeper}, timeout=30)
    assert keeper in done
    return keeper.exception()


async def test_a_host_instance_refuses_to_start_beside_the_pods(root: str) -> None:
    pod = KubeletSockets(_config(root, pod_uid=UID_A), lambda server: None)
    await pod.start()
    try:
        host_config = _config(root)
        host = KubeletSockets(host_config, lambda server: None)
        with pytest.raises(SocketInUse) as refused:
            await host.start()
        message = str(refused.value)
        # Its DRA socket, whatever its name, and who serves it.
        assert pod.endpoint in message and f"pid {os.getpid()}" in message
        assert "one driver per node" in message and "\n" not in message
        assert not os.path.exists(host_config.endpoint)
        assert not os.path.exists(host_config.registration_socket)
        # A rolling update (a pod UID on both) serves beside it, as before.
        update = KubeletSockets(_config(root, pod_uid=UID_B), lambda server: None)
        await update.start()
        await update.stop()
        assert all(not t.done() for t in pod.tasks)
    finally:
        await pod.stop()


async def test_a_registration_naming_our_driver_is_another_instance_whatever_its_name(
        root: str) -> None:
    config = _config(root)
    registry = os.path.dirname(config.registration_socket)

    async def no_status(registered: bool, error: str) -> None:
        return None

    def registration(name: str, driver: str) -> UnixServer:
        service = RegistrationService(driver, "/nowhere/dra.sock", no_status)
        return UnixServer(os.path.join(registry, name),
                          lambda s: add_registration_service(s, service),
                          max_receive_bytes=1024 * 1024)

    # Another driver's registration and a dead socket are no instance of ours.
    other = registration("other.example.com-reg.sock", "other.example.com")
    await other.start()
    _dead(os.path.join(registry, "leftover.sock"))
    try:
        host = KubeletSockets(config, lambda server: None)
        await host.start()
        await host.stop()
        ours = registration("renamed.sock", DRIVER)
        await ours.start()
        try:
            with pytest.raises(SocketInUse) as refused:
                await KubeletSockets(config, lambda server: None).start()
            assert os.path.join(registry, "renamed.sock") in str(refused.value)
            assert f"pid {os.getpid()}" in str(refused.value)
        finally:
            await ours.stop(None)
    finally:
        await other.stop(None)


async def test_a_running_host_instance_steps_aside_when_the_pod_starts(root: str) -> None:
    host_config = dataclasses.replace(_config(root), socket_check_seconds=0.05)
    host = KubeletSockets(host_config, lambda server: None)
    await host.start()
    pod = KubeletSockets(_config(root, pod_uid=UID_A), lambda server: None)
    try:
        for _ in range(2000):  # both directories watched
            if host.watches >= 2:
                break
            await asyncio.sleep(0.005)
        await pod.start()
        ended = await _keeper_ends(host)
        assert isinstance(ended, SocketTaken)
        assert "one driver per node" in str(ended) and f"pid {os.getpid()}" in str(ended)
        assert pod.endpoint in str(ended) or pod.registration_socket in str(ended)
        # The host's sockets are gone, the pod's serve on.
        assert not host.registered and host.gave_way is not None
        assert not os.path.exists(host_config.registration_socket)
        await host.stop()
        assert not os.path.exists(host_config.endpoint)
        assert os.path.exists(pod.endpoint) and os.path.exists(pod.registration_socket)
        assert all(not t.done() for t in pod.tasks)
    finally:
        await host.stop()
        await pod.stop()


# --- dead instances leave nothing behind -------------------------------------------------


def _plant(config: DriverConfig) -> tuple[list[str], list[str], list[socket.socket]]:
    """Dead and live sockets of this driver, and others' sockets: (dead, kept, live)."""
    registry = os.path.dirname(config.registration_socket)
    plugin = os.path.dirname(config.endpoint)
    other_plugin = os.path.join(os.path.dirname(plugin), "other.example.com")
    dead = [
        os.path.join(registry, f"{DRIVER}-{UID_A}-reg.sock"),  # SIGKILLed, a pod UID
        os.path.join(plugin, f"dra-{UID_A}.sock"),
        os.path.join(registry, f"{DRIVER}-pod-x-reg.sock"),  # a UID of any shape, paired
        os.path.join(plugin, "dra-pod-x.sock"),
        os.path.join(registry, f"{DRIVER}-reg.sock"),  # a host run's
        os.path.join(plugin, "dra.sock"),
    ]
    for path in dead:
        _dead(path)
    others_dead = [
        os.path.join(registry, "other.example.com-reg.sock"),
        os.path.join(registry, f"{DRIVER}-test-reg.sock"),  # driver "<ours>-test"
        os.path.join(other_plugin, "dra.sock"),
    ]
    for path in others_dead:
        _dead(path)
    not_a_socket = os.path.join(plugin, "dra-file.sock")
    Path(not_a_socket).write_text("")
    live_paths = [os.path.join(registry, f"{DRIVER}-{UID_B}-reg.sock"),
                  os.path.join(plugin, f"dra-{UID_B}.sock")]
    live = [_listening(p) for p in live_paths]
    return dead, [*others_dead, not_a_socket, *live_paths], live


async def test_at_start_the_sockets_of_gone_instances_are_removed_and_only_those(
        root: str) -> None:
    config = _config(root, pod_uid="pod-new")
    dead, kept, live = _plant(config)
    sockets = KubeletSockets(config, lambda server: None)
    try:
        await sockets.start()
        try:
            assert sorted(p for p in dead if os.path.lexists(p)) == []
            assert all(os.path.lexists(p) for p in kept)
            assert sockets.dead_removed == len(dead)
            assert os.path.exists(config.endpoint) and os.path.exists(
                config.registration_socket)
        finally:
            await sockets.stop()
    finally:
        for sock in live:
            sock.close()


async def test_a_new_instance_appearing_makes_a_running_one_remove_the_dead(
        root: str) -> None:
    config = _config(root, pod_uid="pod-old")
    sockets = KubeletSockets(config, lambda server: None)
    await sockets.start()
    live: list[socket.socket] = []
    try:
        for _ in range(2000):  # both directories watched
            if sockets.watches >= 2:
                break
            await asyncio.sleep(0.005)
        assert sockets.watches == 2
        registry = os.path.dirname(config.registration_socket)
        plugin = os.path.dirname(config.endpoint)
        dead = [os.path.join(registry, f"{DRIVER}-{UID_A}-reg.sock"),
                os.path.join(plugin, f"dra-{UID_A}.sock")]
        for path in dead:  # an instance killed while this one runs
            _dead(path)
        # A new instance starts: the dead ones go, the new one and ours stay.
        new = os.path.join(registry, f"{DRIVER}-{UID_B}-reg.sock")
        live.append(_listening(new))
        for _ in range(2000):
            if not any(os.path.lexists(p) for p in dead):
                break
            await asyncio.sleep(0.005)
        assert not any(os.path.lexists(p) for p in dead)
        assert os.path.exists(new) and os.path.exists(config.registration_socket)
        assert os.path.exists(config.endpoint)
    finally:
        await sockets.stop()
        for sock in live:
            sock.close()


# --- instances agree -----------------------------------------------------------------------


def _claim(uid: str, bandwidth: int = 0) -> PreparedClaim:
    shares = (Share(SHARE, bandwidth),) if bandwidth else ()
    return PreparedClaim("ns", uid, (PreparedDevice(("hca",), NODE, "mlx5-0", "mlx5_0",
                                                    (f"{DRIVER}/claim-{uid}=mlx5-0",),
                                                    shares),))


async def test_the_follower_hands_on_what_the_other_instance_wrote(tmp_path: Path) -> None:
    path, lock = str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock")
    a, b = Checkpoint(path, lock), Checkpoint(path, lock)
    seen: list[tuple[Claims | None, bool]] = []
    io = OffLoop(5.0)
    follower = CheckpointFollower(b, io.run, lambda c, f: seen.append((c, f)), backstop=60.0)
    try:
        a.update(lambda c: c.__setitem__("x", _claim("x")), {})
        assert await follower.look()
        assert seen[-1] == ({"x": _claim("x")}, True)
        assert not await follower.look()  # the same version: nothing new
        # B writes after A wrote again: A's entry, read under the lock, is handed on too,
        # as another instance's although the file is B's now.
        a.update(lambda c: c.__setitem__("z", _claim("z")), {})
        b.update(lambda c: c.__setitem__("y", _claim("y")), {})
        assert await follower.look()
        claims, foreign = seen[-1]
        assert claims is not None and set(claims) == {"x", "y", "z"} and foreign
        # B's own write alone: handed on, not as another's.
        b.update(lambda c: c.pop("x"), {})
        assert await follower.look()
        assert seen[-1] == ({"y": _claim("y"), "z": _claim("z")}, False)
    finally:
        a.close()
        b.close()


async def test_the_follower_skips_its_own_writes_and_hands_on_the_others(
        tmp_path: Path) -> None:
    path, lock = str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock")
    a, b = Checkpoint(path, lock), Checkpoint(path, lock)
    seen: list[tuple[Claims | None, bool]] = []
    io = OffLoop(5.0)
    a.update(lambda c: c.__setitem__("x", _claim("x")), {})
    follower = CheckpointFollower(b, io.run, lambda c, f: seen.append((c, f)), backstop=60.0)
    task = asyncio.create_task(follower.run())
    try:
        assert await wait_until(lambda: follower.handed == 1, 5.0)  # the look at start
        # B's own write: its rename is not read back.
        await io.run("b writes", lambda: b.update(lambda c: c.__setitem__("y", _claim("y")), {}))
        assert await wait_until(lambda: follower.own_skipped == 1, 5.0)
        assert follower.handed == 1
        # A's write still wakes it, and carries B's entry read under the lock.
        await io.run("a writes", lambda: a.update(lambda c: c.__setitem__("z", _claim("z")), {}))
        assert await wait_until(lambda: follower.handed == 2, 5.0)
        claims, foreign = seen[-1]
        assert claims is not None and set(claims) == {"x", "y", "z"} and foreign
        assert follower.own_skipped == 1
    finally:
        await cancel_all([task])
        a.close()
        b.close()


async def test_a_write_of_ours_that_fails_after_its_rename_is_still_followed(
        tmp_path: Path) -> None:
    path, lock = str(tmp_path / "checkpoint.json"), str(tmp_path / "claims.lock")

    def renamed_then_failed(where: str, text: str) -> None:
        write_file(where, text)
        raise OSError(errno.EIO, "the directory's fsync failed")

    b = Checkpoint(path, lock, write=renamed_then_failed)
    seen: list[tuple[Claims | None, bool]] = []
    io = OffLoop(5.0)
    follower = CheckpointFollower(b, io.run, lambda c, f: seen.append((c, f)), backstop=60.0)
    task = asyncio.create_task(follower.run())
    try:
        await asyncio.sleep(0.1)  # the watch is up; no file yet: nothing handed on
        with pytest.raises(OSError):
            await io.run("b writes",
                         lambda: b.update(lambda c: c.__setitem__("y", _claim("y")), {}))
        # Whether its rename landed is not known to the writer: the follower looks.
        assert await wait_until(lambda: follower.handed == 1, 5.0)
        assert seen[-1][0] == {"y": _claim("y")}
        assert b.renames == 0
    finally:
        await cancel_all([task])
        b.close()


@contextlib.asynccontextmanager
async def _two_instances(dra_node: SimNode, path: Path, api: FakeApiServer
                         ) -> AsyncIterator[tuple[DraStage, DraDriver, str]]:
    """A stage's instance (pod-old) with a second (pod-new) started beside it, both
    registered, and a claim of 100G of mlx5-0: (the stage, the old instance, the claim's
    UID). The kubelet's calls go to the new instance, the last to register."""
    async with DraStage(dra_node, path, api=api, pod_uid="pod-old") as s:
        assert s.kubelet is not None and s.driver is not None and s.watcher is not None
        assert await s.registered()
        new = DraDriver(dataclasses.replace(s.config(), pod_uid="pod-new"))
        await new.start(s.watcher.inventory)
        try:
            assert await s.registered(2)
            uid = api.add_claim("ns", "c", [
                share_result("hca", "mlx5-0", NODE, bandwidth="100G", share_id=SHARE)])
            yield s, s.driver, uid
        finally:
            await new.stop()


async def test_a_claim_prepared_by_one_instance_is_held_by_the_other(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer) -> None:
    async with _two_instances(dra_node, tmp_path / "s", api) as (s, old, uid):
        assert s.kubelet is not None
        resp = await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])  # to the new one
        assert resp.claims[uid].error == ""
        assert await s.until(lambda: uid in old.prepared)
        assert old.stats().bandwidth_held["mlx5_0"] == 100 * 10**9
        assert (await s.kubelet.unprepare(DRIVER, [("ns", uid, "c")])).claims[uid] \
            .error == ""
        assert await s.until(lambda: uid not in old.prepared)
        assert old.stats().bandwidth_held["mlx5_0"] == 0


@pytest.mark.parametrize("readable", [True, False])
async def test_a_claim_the_other_instance_prepared_unseen_here_is_answered_from_its_entry(
        dra_node: SimNode, tmp_path: Path, api: FakeApiServer, readable: bool) -> None:
    """A claim this instance has not followed onto its record yet is read and planned at
    once; the record, read under the file lock when its entry would be written, has the
    other instance's entry: that is the answer, and nothing of this instance is written.
    A claim that cannot be read (deleted meanwhile) is answered from the record too."""
    async with _two_instances(dra_node, tmp_path / "s", api) as (s, old, uid):
        assert s.kubelet is not None
        answer = (await s.kubelet.prepare(DRIVER, [("ns", uid, "c")])).claims[uid]
        assert answer.error == ""  # by the new instance
        assert await s.until(lambda: uid in old.prepared)
        spec = next(p for p in s.cdi_dir.iterdir() if uid in p.name)
        written = (spec.stat().st_ino, spec.stat().st_mtime_ns, spec.read_text())
        old.prepared.followed({}, False)  # as if the old one had not followed it yet
        assert uid not in old.prepared
        if not readable:
            api.delete("resourceclaims", "ns", "c")
        writes, reads = old.prepared.checkpoint.writes, api.count("GET", "/resourceclaims/c")
        result = (await old.helper.prepare([ClaimRef("ns", uid, "c")]))[uid]
        assert result.error == ""
        assert [(d.device, d.cdi_ids) for d in result.devices] == [
            (d.device_name, tuple(d.cdi_device_ids)) for d in answer.devices]
        assert old.prepared.checkpoint.writes == writes  # no entry of its own
        assert (spec.stat().st_ino, spec.stat().st_mtime_ns, spec.read_text()) == written
        assert old.prepared.verified(uid) is not None and uid in old.prepared
        assert api.count("GET", "/resourceclaims/c") == reads + 1  # read at once

# --- as processes ----------------------------------------------------------------------------


async def _serve(dra_node: SimNode, root: str, env: dict[str, str]
                 ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rdma_hca.cli", "serve", "--dra", "--no-device-plugin",
        "--sysfs-root", str(dra_node.sysfs_root), "--dev-root", str(dra_node.dev_root),
        "--kubelet-root", root, "--metrics-address", "", "--dra-start-jitter-seconds", "0",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


def _serve_env(api: FakeApiServer, tmp_path: Path) -> dict[str, str]:
    """What a `serve` process of these tests runs with: the fake API server's kubeconfig."""
    return {**os.environ, "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "NODE_NAME": NODE, "TMPDIR": str(tmp_path)}


def _slice_writes(api: FakeApiServer) -> list[str]:
    return [f"{r.method} {r.path}" for r in api.requests
            if r.method != "GET" and "/resourceslices" in r.path]


async def test_two_serve_processes_without_pod_uid_the_second_exits_2_naming_the_first(
        dra_node: SimNode, root: str, tmp_path: Path, api: FakeApiServer) -> None:
    kubelet = DraKubelet(root, NODE)
    await kubelet.start()
    env = _serve_env(api, tmp_path)
    env.pop("POD_UID", None)
    first = await _serve(dra_node, root, env)
    try:
        assert await kubelet.wait_registered(DRIVER, timeout=30.0)
        assert await wait_until(lambda: len(api.slices(NODE)) == 1, 30.0)
        written = _slice_writes(api)
        second = await _serve(dra_node, root, env)
        try:
            out, _ = await asyncio.wait_for(second.communicate(), 60.0)
        finally:
            await _end(second)
        text = out.decode()
        assert second.returncode == 2, text
        assert "Traceback" not in text
        (error,) = [line for line in text.splitlines() if " ERROR " in line]
        assert f"pid {first.pid}" in error and os.path.join(root, "plugins") in error
        assert "POD_UID" in error
        # The first kept serving, registered once, its slice not written again.
        assert first.returncode is None
        assert kubelet.events.registered.count(DRIVER) == 1
        assert _slice_writes(api) == written
        assert os.path.exists(os.path.join(root, "plugins", DRIVER, "dra.sock"))
    finally:
        await _end(first)
        await kubelet.stop()


async def test_a_host_serve_beside_the_pods_exits_2_naming_it(
        dra_node: SimNode, root: str, tmp_path: Path, api: FakeApiServer) -> None:
    kubelet = DraKubelet(root, NODE)
    await kubelet.start()
    env = _serve_env(api, tmp_path)
    pod = await _serve(dra_node, root, {**env, "POD_UID": UID_A})
    try:
        assert await kubelet.wait_registered(DRIVER, timeout=30.0)
        assert await wait_until(lambda: len(api.slices(NODE)) == 1, 30.0)
        written = _slice_writes(api)
        host_env = dict(env)
        host_env.pop("POD_UID", None)
        host = await _serve(dra_node, root, host_env)
        try:
            out, _ = await asyncio.wait_for(host.communicate(), 60.0)
        finally:
            await _end(host)
        text = out.decode()
        assert host.returncode == 2, text
        assert "Traceback" not in text
        (error,) = [line for line in text.splitlines() if " ERROR " in line]
        assert f"pid {pod.pid}" in error and "one driver per node" in error
        assert os.path.join(root, "plugins", DRIVER, f"dra-{UID_A}.sock") in error
        # The pod kept serving, registered once, its slice not written by the host.
        assert pod.returncode is None
        assert kubelet.events.registered.count(DRIVER) == 1
        assert _slice_writes(api) == written
    finally:
        await _end(pod)
        await kubelet.stop()


async def test_an_instance_killed_with_9_leaves_no_socket_once_the_next_one_starts(
        dra_node: SimNode, root: str, tmp_path: Path, api: FakeApiServer) -> None:
    kubelet = DraKubelet(root, NODE)
    await kubelet.start()
    env = _serve_env(api, tmp_path)
    registry, plugin = os.path.join(root, "plugins_registry"), os.path.join(root, "plugins",
                                                                            DRIVER)
    killed = await _serve(dra_node, root, {**env, "POD_UID": UID_A})
    try:
        assert await kubelet.wait_registered(DRIVER, timeout=30.0)
        killed.kill()  # OOM, or a force-deleted pod
        await killed.wait()
        left = sorted(os.listdir(registry)), sorted(os.listdir(plugin))
        assert left[0] == [f"{DRIVER}-{UID_A}-reg.sock"] and f"dra-{UID_A}.sock" in left[1]
        nxt = await _serve(dra_node, root, {**env, "POD_UID": UID_B})
        try:
            assert await kubelet.wait_registered(DRIVER, count=2, timeout=30.0)
            assert sorted(os.listdir(registry)) == [f"{DRIVER}-{UID_B}-reg.sock"]
            assert [n for n in os.listdir(plugin) if n.endswith(".sock")] == \
                [f"dra-{UID_B}.sock"]
        finally:
            await _end(nxt)
    finally:
        await _end(killed)
        await kubelet.stop()


async def test_a_serve_process_whose_socket_another_took_exits_2_and_leaves_it_alone(
        dra_node: SimNode, root: str, tmp_path: Path, api: FakeApiServer) -> None:
    kubelet = DraKubelet(root, NODE)
    await kubelet.start()
    env = _serve_env(api, tmp_path)
    env.pop("POD_UID", None)
    endpoint = os.path.join(root, "plugins", DRIVER, "dra.sock")
    proc = await _serve(dra_node, root, env)
    other: socket.socket | None = None
    try:
        assert await kubelet.wait_registered(DRIVER, timeout=30.0)
        other = _listening(endpoint)  # an instance that did not look first
        ident = _inode(endpoint)
        out, _ = await asyncio.wait_for(proc.communicate(), 60.0)
        text = out.decode()
        # The exit status of the same contest met at start, in one line naming the other.
        assert proc.returncode == 2, text
        assert "Traceback" not in text and " CRITICAL " not in text
        (line,) = [x for x in text.splitlines() if " ERROR " in x]
        assert "replaced" in line
        assert endpoint in line and f"pid {os.getpid()}" in line and "POD_UID" in line
        # Stopping, and exiting, left the other's socket where it was.
        assert _inode(endpoint) == ident
        assert not os.path.exists(os.path.join(root, "plugins_registry",
                                               f"{DRIVER}-reg.sock"))
    finally:
        await _end(proc)
        if other is not None:
            other.close()
        await kubelet.stop()
