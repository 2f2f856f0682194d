"""What ``rdma-hca serve`` writes to stderr: JSON or text lines, each thing said once.

Log collectors parse the JSON lines one by one, and operators read the text ones; a
port that stays down must not repeat itself on every poll.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import sys
from datetime import datetime
from pathlib import Path

import pytest
from test_serve_process import (
    R,
    ServeProcess,
    serve,
    serve_argv,
    wait_registered,
)

from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.kit.logs import JsonFormatter

WATCH = "rdma_hca.daemon.watch.health"
POOL = "rdma_hca.daemon.deviceplugin.runtime"
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) +rdma_hca(\.\w+)+: \S.*$")
LEVELS = {"debug", "info", "warning", "error", "critical"}


async def run_through_a_day(proc: ServeProcess, node: SimNode, plugin_dir: Path) -> None:
    """No kubelet, then a kubelet, a port down and up, a pod, then SIGTERM."""
    await proc.wait_line(lambda line: "kubelet.sock" in line)
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    try:
        await wait_registered(kubelet)
        node.set_port("mlx5_1", 1, up=False)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
        node.set_port("mlx5_1", 1, up=True)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        await kubelet.admit_pod(R, 1)
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    finally:
        await kubelet.stop()


def json_line(line: str) -> dict[str, str]:
    try:
        doc = json.loads(line)
    except ValueError:
        pytest.fail(f"not a JSON line: {line!r}")
    assert isinstance(doc, dict), line
    assert {"time", "level", "logger", "message"} <= doc.keys(), line
    assert doc["level"] in LEVELS
    assert doc["logger"].startswith(("rdma_hca", "grpc", "asyncio")), line
    assert isinstance(doc["message"], str) and doc["message"]
    stamp = datetime.strptime(doc["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert stamp.year >= 2024
    return doc


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_json_format_every_line_is_an_object(level: str, node: SimNode,
                                                   plugin_dir: Path) -> None:
    argv = serve_argv(node, plugin_dir, "--log-format", "json", "--log-level", level)
    async with serve(argv) as proc:
        await run_through_a_day(proc, node, plugin_dir)
    assert proc.lines
    docs = [json_line(line) for line in proc.lines]
    stopping = [d for d in docs if d["message"].startswith("stopping:")]
    assert len(stopping) == 1 and stopping[0]["level"] == "info"
    seen = {d["level"] for d in docs}
    assert {"info", "warning"} <= seen
    assert ("debug" in seen) is (level == "debug")
    messages = [d["message"] for d in docs]
    assert any("registered with the kubelet" in m for m in messages)
    assert any("waiting for the kubelet" in m for m in messages), messages
    allocate = [d for d in docs if d["logger"] == "rdma_hca.daemon.deviceplugin.plugin"
                and "Allocate" in d["message"]]
    assert bool(allocate) is (level == "debug"), messages
    assert all(d["resource"] == R for d in allocate)
    # Port changes and pool problems carry the fields to filter on.
    ports = [d for d in docs if d["logger"] == WATCH and " port " in d["message"]]
    assert ports and all(isinstance(d["port"], int) and d["hca"] for d in ports), ports
    pool = [d for d in docs if d["logger"] == POOL]
    assert pool and all(d["resource"] == R for d in pool), pool
    assert any(d.get("hca") and d["level"] == "warning" for d in pool), pool


async def test_text_format_is_the_readable_default(node: SimNode, plugin_dir: Path) -> None:
    async with serve(serve_argv(node, plugin_dir)) as proc:
        await run_through_a_day(proc, node, plugin_dir)
    lines = proc.lines
    assert lines
    for line in lines:
        assert TEXT_LINE.match(line), f"unexpected line: {line!r}"
        assert not line.lstrip().startswith("{")
    assert any(" WARNING " in line for line in lines)
    assert not any(" DEBUG " in line for line in lines)  # info is the default level


async def test_warning_level_keeps_only_warnings(node: SimNode, plugin_dir: Path) -> None:
    async with serve(serve_argv(node, plugin_dir, "--log-level", "warning")) as proc:
        await run_through_a_day(proc, node, plugin_dir)
    lines = proc.lines
    assert lines, "the missing kubelet and the port down are warnings"
    assert all(" WARNING " in line or " ERROR " in line for line in lines)


async def test_a_port_down_is_logged_once_and_its_recovery_once(node: SimNode,
                                                                plugin_dir: Path) -> None:
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    try:
        async with serve(serve_argv(node, plugin_dir, poll="0.05")) as proc:
            await wait_registered(kubelet)

            def mentions(start: int, logger: str = POOL) -> list[str]:
                return [line for line in proc.lines[start:]
                        if "mlx5_6" in line and f" {logger}: " in line]

            mark = len(proc.lines)
            node.set_port("mlx5_6", 1, up=False)
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
            # About twenty polls see the same down port.
            await asyncio.sleep(1.0)
            down = mentions(mark)
            assert len(down) == 1, down
            assert " WARNING " in down[0] and "DOWN" in down[0].upper()
            # The watcher says what the port did, once too.
            assert [line.split(": ", 1)[1] for line in mentions(mark, WATCH)] == [
                "mlx5_6 port 1 is down (DOWN/Disabled)"]

            mark = len(proc.lines)
            node.set_port("mlx5_6", 1, up=True)
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
            await asyncio.sleep(1.0)
            up = mentions(mark)
            assert len(up) == 1, up
            assert " INFO " in up[0] and "resolved" in up[0]
            assert [line.split(": ", 1)[1] for line in mentions(mark, WATCH)] == [
                "mlx5_6 port 1 is up (ACTIVE/LinkUp)"]
            proc.send(signal.SIGTERM)
            assert await proc.wait_exit() == 0
    finally:
        await kubelet.stop()


# --- the formatter itself ------------------------------------------------------------------


def record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad value in /sys/class/infiniband/mlx5_0/ports/1/rate")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("rdma_hca.sysfs", logging.WARNING, __file__, 1, msg, args,
                             exc_info)


def test_json_formatter_keeps_one_line_per_record() -> None:
    fmt = JsonFormatter()
    out = fmt.format(record("first\nsecond %s", "\u00e9\u4e2d\x00"))
    assert "\n" not in out
    doc = json.loads(out)
    assert doc["message"] == "first\nsecond \u00e9\u4e2d\x00"
    assert doc["level"] == "warning" and doc["logger"] == "rdma_hca.sysfs"
    assert doc["time"].endswith("Z")

    out = fmt.format(record("cannot read %s", "rate", exc=True))
    assert "\n" not in out
    doc = json.loads(out)
    assert doc["message"] == "cannot read rate"
    assert "ValueError: bad value" in doc["exception"]


def test_json_formatter_gives_the_fields_a_record_carries() -> None:
    rec = record("mlx5_0 port 1 is down")
    rec.__dict__.update(hca="mlx5_0", port=1, resource="rdma/hca", claim="ns/c", other="x")
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["hca"] == "mlx5_0" and doc["port"] == 1
    assert doc["resource"] == "rdma/hca" and doc["claim"] == "ns/c"
    assert "other" not in doc  # only the fields logs are filtered on
    plain = json.loads(JsonFormatter().format(record("nothing extra")))
    assert not {"hca", "port", "resource", "claim"} & plain.keys()


def test_json_formatter_survives_odd_arguments() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd \udcff value"

    doc = json.loads(JsonFormatter().format(record("got %s", Odd())))
    assert doc["message"].startswith("got odd")


def test_config_error_follows_the_json_log_format() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rdma_hca.cli", "serve", "--log-format", "json",
         "--rdma-hca-max", "0", "--kubelet-dir", "/nonexistent"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    doc = json.loads(line)
    assert doc["level"] == "error"
    assert "rdmaHcaMax: '0' (from flag --rdma-hca-max)" in doc["message"]
