"""``rdma-hca doctor --node`` inside a DRA-alone pod: readiness from this pod's own daemon (its
probe socket, named after POD_UID), never from whichever instance holds the shared TCP port,
and no device-plugin sockets demanded when the device plugin is off."""

from __future__ import annotations

import asyncio
import json
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rdma_hca.daemon.observe.httpserver import MetricsServer
from rdma_hca.daemon.observe.status import DraStatus, Status
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.probe import probe_socket_path
from rdma_hca.tools.doctor import main

READY = Status(version="new", dra=DraStatus(registered=True, registrations=1,
                                            prepared_claims=0, publish_error=None),
               health_stale_after=float("inf"))
NOT_READY = Status(version="old", dra=DraStatus(registered=False, registrations=0,
                                                prepared_claims=0, publish_error=None),
                   health_stale_after=float("inf"))
REGISTERED = "registered with the kubelet"
_nodes: dict[Path, SimNode] = {}  # one sim tree per test, made at its first doctor


class Instance:
    """One daemon's real HTTP endpoints (TCP port and probe socket) on a loop of its own."""

    def __init__(self, status: Status, address: str, probe_socket: str) -> None:
        # Two pods of a DRA-alone DaemonSet: the port is shared, as the daemon shares it.
        self.server = MetricsServer(lambda: status, address, probe_socket=probe_socket,
                                    share_port=True)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Instance:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def __exit__(self, *_: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def probe_dir() -> Iterator[str]:
    # Unix socket paths are limited to 107 bytes: a short directory under /tmp.
    with tempfile.TemporaryDirectory(prefix="probe-", dir="/tmp") as d:
        yield d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def doctor(tmp_path: Path, capsys: pytest.CaptureFixture[str], env: dict[str, str],
           *extra: str) -> tuple[int, dict[str, Any]]:
    node = _nodes.get(tmp_path)
    if node is None:
        node = _nodes[tmp_path] = gpu_node(tmp_path / "node", hcas=1, bond=False,
                                           gid_table_size=8)
    # The DRA-alone pod mounts no device-plugins directory: this one is empty.
    empty = tmp_path / "device-plugins"
    empty.mkdir(exist_ok=True)
    argv = ["--node", "--json", "--sysfs-root", str(node.sysfs_root), "--dev-root",
            str(node.dev_root), "--kubelet-dir", str(empty), "--plugins-dir",
            str(tmp_path / "plugins"), *extra]
    status = main(argv, env=env)
    return status, json.loads(capsys.readouterr().out)


def checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["checks"]}


def pod_env(probe_dir: str, uid: str, *, device_plugin: str = "false") -> dict[str, str]:
    """What the chart gives a DRA-alone pod, with its own scratch directory."""
    return {"POD_UID": uid, "TMPDIR": probe_dir, "RDMA_HCA_DRA_ENABLED": "true",
            "RDMA_HCA_DEVICE_PLUGIN_ENABLED": device_plugin, "NODE_NAME": "e01-cn-a"}


def test_each_pod_asks_its_own_instance_during_a_rolling_update(
        tmp_path: Path, probe_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with Instance(READY, address, probe_socket_path(probe_dir, "pod-old")), \
            Instance(NOT_READY, address, probe_socket_path(probe_dir, "pod-new")):
        status, doc = doctor(tmp_path, capsys, pod_env(probe_dir, "pod-new"))
        found = checks(doc)[REGISTERED]
        assert status == 1 and not found["ok"]
        new_socket = probe_socket_path(probe_dir, "pod-new")
        assert found["detail"] == (
            f"this pod's daemon (probe socket {new_socket}) answered 503: not registered "
            "yet: the DRA driver (plugin watcher)")
        status, doc = doctor(tmp_path, capsys, pod_env(probe_dir, "pod-old"))
        found = checks(doc)[REGISTERED]
        assert found["ok"], found
        assert found["detail"] == (
            f"this pod's daemon (probe socket {probe_socket_path(probe_dir, 'pod-old')}) "
            f"answered 200: {REGISTERED}")


def test_dra_alone_demands_no_device_plugin_sockets_and_says_so(
        tmp_path: Path, probe_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    with Instance(READY, f"127.0.0.1:{free_port()}", probe_socket_path(probe_dir, "pod-a")):
        status, doc = doctor(tmp_path, capsys, pod_env(probe_dir, "pod-a"))
    found = checks(doc)
    assert status == 0, doc["checks"]
    assert (doc["devicePlugin"], doc["probeSocket"]) == (False,
                                                         probe_socket_path(probe_dir, "pod-a"))
    assert "kubelet socket" not in found and "plugin socket" not in found
    assert found["device plugin"] == {
        "subject": "node", "name": "device plugin", "ok": True,
        "detail": "off (devicePlugin.enabled is false: the DRA driver alone), so the "
                  "kubelet's device-plugin sockets are not checked",
        "fix": None}


def test_the_device_plugin_setting_is_read_from_the_config_file_and_the_flag(
        tmp_path: Path, probe_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("devicePlugin:\n  enabled: false\ndra:\n  enabled: true\n")
    env = {"POD_UID": "pod-a", "TMPDIR": probe_dir, "NODE_NAME": "e01-cn-a"}
    with Instance(READY, f"127.0.0.1:{free_port()}", probe_socket_path(probe_dir, "pod-a")):
        status, doc = doctor(tmp_path, capsys, env, "--config", str(config))
        assert status == 0 and "device plugin" in checks(doc), doc["checks"]
        # The flag wins over the variable, as for serve.
        on = pod_env(probe_dir, "pod-a", device_plugin="true")
        status, doc = doctor(tmp_path, capsys, on, "--no-device-plugin")
        assert status == 0 and "device plugin" in checks(doc), doc["checks"]
        # With the device plugin on (the default), its sockets are demanded as before.
        status, doc = doctor(tmp_path, capsys, {"POD_UID": "pod-a", "TMPDIR": probe_dir})
    found = checks(doc)
    assert status == 1 and "device plugin" not in found
    assert not found["kubelet socket"]["ok"] and not found["plugin socket"]["ok"]
    assert found[REGISTERED]["ok"]


def test_no_probe_socket_says_which_and_how_to_fix(
        tmp_path: Path, probe_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, doc = doctor(tmp_path, capsys, pod_env(probe_dir, "pod-gone"))
    found = checks(doc)[REGISTERED]
    path = probe_socket_path(probe_dir, "pod-gone")
    assert status == 1
    assert found["detail"] == (f"cannot ask this pod's daemon: no probe socket at {path}: "
                               "the daemon has not started its HTTP endpoints yet, or runs in "
                               "another pod")
    assert "--readyz-url" in found["fix"] and "logs" in found["fix"]


def test_a_readyz_url_given_wins_over_the_probe_socket(
        tmp_path: Path, probe_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with Instance(NOT_READY, f"127.0.0.1:{port}", probe_socket_path(probe_dir, "pod-a")):
        url = f"http://127.0.0.1:{port}/readyz"
        _, doc = doctor(tmp_path, capsys, pod_env(probe_dir, "pod-a"), "--readyz-url", url)
    found = checks(doc)[REGISTERED]
    assert found["detail"].startswith(f"{url} answered 503: not registered yet")


def test_without_pod_uid_readiness_is_asked_over_tcp_as_before(
        tmp_path: Path, probe_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    env = pod_env(probe_dir, "")
    del env["POD_UID"]
    _, doc = doctor(tmp_path, capsys, env)
    found = checks(doc)[REGISTERED]
    assert "http://127.0.0.1:9478/readyz" in found["detail"]
    assert "probe socket" not in found["detail"]
    assert doc["probeSocket"] is None
