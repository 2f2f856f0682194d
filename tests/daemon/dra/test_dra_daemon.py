"""The DRA driver inside the daemon: `rdma-hca serve` with `dra.enabled`, alone or beside
the device plugin, against the DRA kubelet emulator and the fake API server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_serve_process import metric_samples

from rdma_hca.daemon.dra.claimstatus import REFUSALS
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.dra.kubelet import DraKubelet
from rdma_hca.devkit.dra.stage import admin_result
from rdma_hca.devkit.kube.apiserver import FakeApiServer
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.settings.model import (
    CdiConfig,
    ConfigError,
    DraConfig,
    PoolConfig,
    Selectors,
    Settings,
)

DRIVER = "rdma-hca.io"
NODE = "node-a"


@pytest.fixture
def kubelet_root() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: a short root under /tmp.
    root = tempfile.mkdtemp(prefix="dra-d-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, resp.read().decode()


def _settings(node: SimNode, root: str, tmp: Path, **kw: object) -> Settings:
    base: dict[str, object] = {
        "sysfs_root": str(node.sysfs_root), "dev_root": str(node.dev_root),
        "kubelet_root": root, "node_name": NODE, "metrics_address": "127.0.0.1:0",
        "device_plugin_enabled": False,
        "dra": DraConfig(enabled=True, start_jitter_seconds=0),
        # Claims' CDI specs go to the test's own directory, never the machine's /var/run/cdi.
        "cdi": CdiConfig(spec_dir=str(tmp / "cdi")),
    }
    base.update(kw)
    settings = Settings(**base)  # type: ignore[arg-type]
    os.makedirs(settings.kubelet_dir, exist_ok=True)
    return settings


async def test_dra_alone_publishes_registers_and_reports(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    daemon = Daemon(_settings(dra_node, kubelet_root, tmp_path), netlink=False)
    try:
        await daemon.start()
        assert await kubelet.wait_registered(DRIVER)
        assert await wait_until(lambda: len(api.slices(NODE)) == 1, 10.0)
        (published,) = api.slices(NODE)
        names = {d["name"] for d in published["spec"]["devices"]}
        assert "mlx5-0" in names
        assert not daemon.runtimes  # DRA alone: no device plugin pool
        assert await wait_until(lambda: daemon.ready(), 10.0)
        assert daemon.http is not None
        url = f"http://127.0.0.1:{daemon.http.bound_port}"
        status, text = await asyncio.to_thread(_get, url + "/metrics")
        assert "rdma_hca_dra_registered 1.0" in text
        assert "rdma_hca_dra_prepared_claims 0.0" in text
        status, text = await asyncio.to_thread(_get, url + "/readyz")
        assert status == 200, text
        # A port going down reaches the slice through the daemon's own health loop.
        dra_node.set_port("mlx5_0", up=False)

        def tainted() -> bool:
            devices = {d["name"]: d for s in api.slices(NODE) for d in s["spec"]["devices"]}
            return bool(devices.get("mlx5-0", {}).get("taints"))

        assert await wait_until(tainted, 10.0)
    finally:
        await daemon.stop()
        await kubelet.stop()
    registry = os.path.join(kubelet_root, "plugins_registry")
    assert not [n for n in os.listdir(registry) if n.endswith(".sock")]


async def test_the_claim_status_writers_counts_are_in_the_daemons_metrics(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused and dropped status writes, and claims whose write is still to go out, as
    /metrics of the daemon shows them: at 0 from the start, then as the API server does."""
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    daemon = Daemon(_settings(dra_node, kubelet_root, tmp_path), netlink=False)

    async def sample(name: str) -> float:
        assert daemon.http is not None
        _, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{daemon.http.bound_port}"
                                                "/metrics")
        ((labels, value),) = metric_samples(text)[name]
        assert labels == {}
        return value

    async def prepare(name: str) -> None:
        uid = api.add_claim("ns", name, [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-0"}])
        assert kubelet is not None
        answer = await kubelet.prepare(DRIVER, [("ns", uid, name)])
        assert answer.claims[uid].error == ""

    async def until(name: str, value: float) -> bool:
        for _ in range(400):
            if await sample(name) == value:
                return True
            await asyncio.sleep(0.05)
        return False

    refused = "rdma_hca_dra_claim_status_refused_total"
    dropped = "rdma_hca_dra_claim_status_dropped_total"
    pending = "rdma_hca_dra_claim_status_pending"
    try:
        await daemon.start()
        assert await kubelet.wait_registered(DRIVER)
        for name in (refused, dropped, pending):
            assert await sample(name) == 0.0, name
        # A 4xx: the same state sent a few times, each refusal counted; others go on.
        api.fail(422, method="PATCH", path="/bad/status", times=100)
        await prepare("bad")
        assert await until(refused, float(REFUSALS))
        # The feature gate off: the entries come back dropped.
        api.cluster.claim_device_status = False
        await prepare("off")
        assert await until(dropped, 1.0)
        api.cluster.claim_device_status = True
        # A write the API server holds unanswered is pending until it is answered.
        slow = api.hold(method="PATCH", path="/slow/status")
        await prepare("slow")
        assert await until(pending, 1.0)
        slow.release()
        assert await until(pending, 0.0)
        assert len(api.claim("ns", "slow")["status"]["devices"]) == 1
        assert await sample(refused) == float(REFUSALS) and await sample(dropped) == 1.0
        # A claim with admin access to a device: counted apart, as the snapshot carries it.
        assert await sample("rdma_hca_dra_admin_access_prepared") == 0.0
        api.add_namespace("fabric", {"resource.kubernetes.io/admin-access": "true"})
        uid = api.add_claim("fabric", "watch", [admin_result("hca", "mlx5-0", NODE)])
        answer = await kubelet.prepare(DRIVER, [("fabric", uid, "watch")])
        assert answer.claims[uid].error == ""
        assert await sample("rdma_hca_dra_admin_access_prepared") == 1.0
    finally:
        await daemon.stop()
        await kubelet.stop()


async def test_an_hca_both_dra_and_a_pool_select_stops_the_start(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path) -> None:
    settings = _settings(
        dra_node, kubelet_root, tmp_path, device_plugin_enabled=True,
        pools=(PoolConfig(selectors=Selectors(names=("mlx5_0", "mlx5_1"))),),
        dra=DraConfig(enabled=True, selectors=Selectors(names=("mlx5_[12]",))))
    daemon = Daemon(settings, netlink=False)
    try:
        with pytest.raises(ConfigError) as caught:
            await daemon.start()
    finally:
        await daemon.stop()
    assert "mlx5_1 (pool rdma/hca and dra)" in str(caught.value)
    assert "mlx5_0" not in str(caught.value)


async def test_serve_with_dra_ends_on_sigterm_and_removes_its_sockets(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer) -> None:
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    env = {**os.environ, "KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
           "NODE_NAME": NODE}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rdma_hca.cli", "serve", "--dra", "--no-device-plugin",
        "--sysfs-root", str(dra_node.sysfs_root), "--dev-root", str(dra_node.dev_root),
        "--kubelet-root", kubelet_root, "--metrics-address", "",
        "--dra-start-jitter-seconds", "0",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert await kubelet.wait_registered(DRIVER, timeout=20.0)
        assert await wait_until(lambda: len(api.slices(NODE)) == 1, 10.0)
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 10.0)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await kubelet.stop()
    assert proc.returncode == 0, out.decode()
    assert "Traceback" not in out.decode()
    for sub in ("plugins_registry", os.path.join("plugins", DRIVER)):
        leftover = [n for n in os.listdir(os.path.join(kubelet_root, sub)) if n.endswith(".sock")]
        assert leftover == [], (sub, leftover)


def _opened(path: Path) -> int:
    """How many descriptors of this process have ``path`` open now."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += os.readlink(fd) == str(path)
        except OSError:
            continue
    return count


async def test_a_stuck_cdi_directory_does_not_delay_a_dra_slice_update(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rdma_hca.daemon.offer.cdi import SPEC_FILE

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    cdi_dir = tmp_path / "cdi"
    settings = _settings(dra_node, kubelet_root, tmp_path, metrics_address="",
                         health_poll_seconds=0.05, cdi=CdiConfig(True, str(cdi_dir)))
    # A read deadline far beyond the waits below: a CDI write that held up the DRA
    # driver would hold it up for all of it.
    daemon = Daemon(settings, netlink=False, read_deadline=120.0)
    spec = cdi_dir / SPEC_FILE
    writer = -1
    try:
        await daemon.start()
        assert await wait_until(lambda: len(api.slices(NODE)) == 1, 10.0)
        # The spec becomes a FIFO whose write end the test holds: the next spec write
        # reads the file first and hangs there until the end closes, as on a hung
        # filesystem.
        spec.unlink()
        os.mkfifo(spec)
        writer = os.open(spec, os.O_RDWR | os.O_NONBLOCK)
        dra_node.set_port("mlx5_0", up=False)
        assert await wait_until(lambda: _opened(spec) > 1, 10.0), "the CDI write never began"

        def tainted() -> bool:
            devices = {d["name"]: d for s in api.slices(NODE) for d in s["spec"]["devices"]}
            return bool(devices.get("mlx5-0", {}).get("taints"))

        assert await wait_until(tainted, 10.0)
        assert _opened(spec) > 1, "the taint came only once the CDI write had ended"
        os.close(writer)  # EOF for the blocked read: the write goes on and replaces the FIFO
        writer = -1
        assert await wait_until(lambda: spec.is_file(), 10.0)
    finally:
        if writer >= 0:
            os.close(writer)
        await daemon.stop()
        await kubelet.stop()


async def test_serve_with_dra_and_no_credentials_says_so_in_one_line_and_exits_2(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env.update({"HOME": str(tmp_path / "home"), "NODE_NAME": NODE})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rdma_hca.cli", "serve", "--dra", "--no-device-plugin",
        "--sysfs-root", str(dra_node.sysfs_root), "--dev-root", str(dra_node.dev_root),
        "--kubelet-root", kubelet_root, "--metrics-address", "",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30.0)
    text = out.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1, text
    assert "no usable API server credentials" in errors[0]
    assert "in-cluster service account (KUBERNETES_SERVICE_HOST is not set)" in errors[0]
    assert "KUBECONFIG" in errors[0] and ".kube/config" in errors[0]


async def test_dra_alone_waits_for_no_device_plugins_directory_and_is_ready_only_once_published(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    settings = _settings(dra_node, kubelet_root, tmp_path)
    os.rmdir(settings.kubelet_dir)  # a DRA-only pod mounts no device-plugins directory
    refuse = True

    def slices_refused(record: object) -> None:
        if refuse and getattr(record, "path", "").endswith("resourceslices") and \
                getattr(record, "method", "") == "POST":
            raise ValueError("refused for the test")

    api.on_request = slices_refused  # a slice write fails: 400 from the fake server
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()
    daemon = Daemon(settings, netlink=False)
    try:
        await daemon.start()
        assert await kubelet.wait_registered(DRIVER)
        assert daemon.dra is not None
        assert await wait_until(lambda: daemon.dra is not None and
                                daemon.dra.stats().publish_error is not None, 10.0)
        status = daemon.status()
        assert not status.ready
        assert "the DRA driver's ResourceSlice (none published since start)" in status.waiting
        refuse = False
        assert await wait_until(lambda: daemon.ready(), 15.0)
    finally:
        api.on_request = None
        await daemon.stop()
        await kubelet.stop()
    assert not any("device-plugins" in r.getMessage() for r in caplog.records)


def _claim(device: str) -> list[dict[str, str]]:
    return [{"request": "hca", "driver": DRIVER, "pool": NODE, "device": device}]


async def test_a_rolling_update_on_one_node_two_daemons_one_metrics_port(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DRA alone, as the chart runs a surge: the new daemon starts beside the old one on the
    same metrics port, each answers its own probe socket, claims are prepared throughout,
    and the new one unprepares what the old one prepared once the old one is gone."""
    from rdma_hca.kit.probe import ask

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    probe_dir = tempfile.mkdtemp(prefix="probe-", dir="/tmp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubelet = DraKubelet(kubelet_root, NODE)
    await kubelet.start()

    def daemon(uid: str) -> Daemon:
        # The CDI specs go to the test's own directory, not the machine's /var/run/cdi.
        return Daemon(_settings(dra_node, kubelet_root, tmp_path, pod_uid=uid,
                                metrics_address=f"127.0.0.1:{port}",
                                cdi=CdiConfig(spec_dir=str(tmp_path / "cdi"))),
                      netlink=False, probe_dir=probe_dir)

    async def readyz(d: Daemon) -> int:
        assert d.probe_socket is not None
        return (await asyncio.to_thread(ask, d.probe_socket, "/readyz", 2))[0]

    old, new = daemon("pod-old"), daemon("pod-new")
    try:
        await old.start()
        assert await kubelet.wait_registered(DRIVER)
        assert await wait_until(lambda: old.ready(), 10.0) and await readyz(old) == 200
        before = api.add_claim("ns", "before", _claim("mlx5-0"))
        assert (await kubelet.prepare(DRIVER, [("ns", before, "before")])).claims[before] \
            .error == ""
        def slice_writes() -> list[str]:
            return [f"{r.method} {r.path}" for r in api.requests
                    if r.method != "GET" and "/resourceslices" in r.path]

        written = slice_writes()
        await new.start()  # the same port: no "already in use"
        assert new.http is not None and new.http.bound_port == port
        assert await kubelet.wait_registered(DRIVER, count=2)
        assert await wait_until(lambda: new.ready(), 10.0) and await readyz(new) == 200
        during = api.add_claim("ns", "during", _claim("mlx5-1"))
        assert (await kubelet.prepare(DRIVER, [("ns", during, "during")])).claims[during] \
            .error == ""
        assert new.dra is not None
        checkpoint = Path(new.dra.config.checkpoint)
        assert set(json.loads(checkpoint.read_text())["claims"]) == {before, during}
        # The two publish the same slice: the new one found it as it would write it.
        assert slice_writes() == written
        await old.stop()  # the old pod goes once the new one is ready
        assert old.probe_socket is not None and not os.path.exists(old.probe_socket)
        status, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "rdma_hca_dra_registered 1.0" in text
        assert await readyz(new) == 200
        gone = await kubelet.unprepare(DRIVER, [("ns", before, "before")])
        assert gone.claims[before].error == ""
        assert set(json.loads(checkpoint.read_text())["claims"]) == {during}
    finally:
        await new.stop()
        await old.stop()
        await kubelet.stop()
        shutil.rmtree(probe_dir, ignore_errors=True)


@pytest.mark.parametrize(("pod_uid", "device_plugin"), [("", False), ("pod-b", True)],
                         ids=["dra-alone-without-pod-uid", "dra-beside-the-device-plugin"])
async def test_the_metrics_port_is_shared_only_in_a_dra_alone_rolling_update(
        dra_node: SimNode, kubelet_root: str, tmp_path: Path, api: FakeApiServer,
        monkeypatch: pytest.MonkeyPatch, pod_uid: str, device_plugin: bool) -> None:
    """Beside an instance that shares the port, a daemon whose pods never overlap (no pod
    UID, or the device plugin on) is refused it before it serves anything."""
    from rdma_hca.daemon.observe.httpserver import BindError, MetricsServer
    from rdma_hca.daemon.observe.status import Status

    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    running = MetricsServer(lambda: Status(version="other"), "127.0.0.1:0", share_port=True)
    await running.start()
    apart: dict[str, object] = {} if not device_plugin else {
        "pools": (PoolConfig(selectors=Selectors(names=("mlx5_0",))),),
        "dra": DraConfig(enabled=True, start_jitter_seconds=0,
                         selectors=Selectors(names=("mlx5_[123]",)))}
    daemon = Daemon(_settings(dra_node, kubelet_root, tmp_path, pod_uid=pod_uid,
                              device_plugin_enabled=device_plugin,
                              metrics_address=f"127.0.0.1:{running.bound_port}", **apart),
                    netlink=False)
    try:
        with pytest.raises(BindError, match="already in use"):
            await daemon.start()
        assert daemon.http is None
        assert api.slices(NODE) == []
    finally:
        await daemon.stop()
        await running.stop()
