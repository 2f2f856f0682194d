"""``rdma-hca demo``: the real daemon on a simulated GPU node, talking to a kubelet emulator.

It walks through what an operator checks after installing (the seed's
``kubectl get node -o yaml`` showing ``rdma/hca: 1k``), what a pod gets, and what
happens when a port goes down and comes back, and when the kubelet restarts.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TextIO

from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.kit.text import text_table
from rdma_hca.node.model import NodeInventory
from rdma_hca.settings.model import Settings

RESOURCE = "rdma/hca"


def _hca_table(inventory: NodeInventory) -> str:
    rows = [("HCA", "NETDEV", "NUMA", "RATE", "PORT", "DEVICE NODE")]
    for h in inventory.hcas:
        p = h.ports[0] if h.ports else None
        rows.append((
            h.name,
            ",".join(h.netdevs) or "-",
            "-" if h.numa_node is None else str(h.numa_node),
            p.rate.split(" (")[0] if p else "-",
            ("up" if p.is_up else "DOWN") if p else "-",
            h.uverbs.path if h.uverbs else "-",
        ))
    return "\n".join(text_table(rows, indent="  "))


def _node_yaml(kubelet: KubeletEmulator) -> str:
    status = kubelet.node_status()
    lines = ["  ...", "  allocatable:"]
    lines += [f"    {k}: {v}" for k, v in sorted(status["allocatable"].items())]
    lines.append("  capacity:")
    lines += [f"    {k}: {v}" for k, v in sorted(status["capacity"].items())]
    lines.append("  ...")
    return "\n".join(lines)


async def _demo(out: TextIO, workdir: Path) -> None:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    node = gpu_node(workdir / "node")
    plugin_dir = workdir / "device-plugins"
    plugin_dir.mkdir()
    settings = Settings(
        sysfs_root=str(node.sysfs_root),
        dev_root=str(node.dev_root),
        kubelet_dir=str(plugin_dir),
        metrics_address="",
        health_poll_seconds=0.2,
    )
    kubelet = KubeletEmulator(plugin_dir)
    await kubelet.start()
    daemon = Daemon(settings, netlink=False)
    started = time.perf_counter()
    await daemon.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1000, timeout=10)
        took = time.perf_counter() - started
        inv = daemon.inventory
        assert inv is not None
        say("1. The plugin found these RDMA HCAs on the simulated GPU node:")
        say()
        say(_hca_table(inv))
        say()
        say(f"2. It registered {RESOURCE} with the kubelet in {took * 1000:.0f} ms. "
            "`kubectl get node <node> -o yaml` would show:")
        say()
        say(_node_yaml(kubelet))
        say()
        resp = await kubelet.admit_pod(RESOURCE, 1, pod_uid="hps-benchmark")
        say("3. A pod asking `rdma/hca: 1` (the seed's hps-benchmark Job) gets these device "
            "nodes:")
        say()
        for d in resp.devices:
            say(f"     {d.container_path}  ({d.permissions})")
        say("   and environment:")
        for k, v in sorted(resp.envs.items()):
            say(f"     {k}={v}")
        say()
        victim = inv.hcas[3].name
        node.set_port(victim, 1, up=False)
        t0 = time.perf_counter()
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 0, timeout=10)
        say(f"4. Port 1 of {victim} went down. {(time.perf_counter() - t0) * 1000:.0f} ms later "
            "the kubelet saw every device Unhealthy, so no new pod lands on a broken rail:")
        say()
        say(_node_yaml(kubelet))
        say()
        node.set_port(victim, 1, up=True)
        t0 = time.perf_counter()
        await kubelet.wait_for(lambda: kubelet.allocatable(RESOURCE) == 1000, timeout=10)
        say(f"5. The port came back; {(time.perf_counter() - t0) * 1000:.0f} ms later "
            f"allocatable is {kubelet.node_status()['allocatable'][RESOURCE]} again.")
        say()
        before = kubelet.registrations(RESOURCE)
        t0 = time.perf_counter()
        await kubelet.restart()
        await kubelet.wait_for(
            lambda: kubelet.registrations(RESOURCE) > before
            and kubelet.allocatable(RESOURCE) == 1000,
            timeout=10,
        )
        say(f"6. The kubelet restarted (and deleted our socket). The plugin served and "
            f"registered again in {(time.perf_counter() - t0) * 1000:.0f} ms; allocatable: "
            f"{kubelet.node_status()['allocatable'][RESOURCE]}.")
        say()
        say("Done: the same daemon runs on a real node with `rdma-hca serve`.")
    finally:
        await daemon.stop()
        await kubelet.stop()


def run_walkthrough(walk: Callable[[TextIO, Path], Coroutine[Any, Any, None]], *, name: str,
                    verbose: bool = False, out: TextIO | None = None) -> int:
    """Run ``walk(out, workdir)`` on an event loop of its own in a fresh temp directory.

    Returns the exit code: 0, or 1 when a step timed out (said on stderr as
    "<name> failed: ..."). Without ``verbose`` only errors are logged, and the log level
    is given back afterwards, so a caller in the same process logs as before.
    """
    out = out or sys.stdout
    root = logging.getLogger()
    level = root.level
    if verbose:
        from rdma_hca.kit.logs import setup_logging

        setup_logging("text", "info")
    else:
        root.setLevel(logging.ERROR)
    try:
        prefix = "rdma-hca-" + name.lower().replace(" ", "-") + "-"
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            try:
                asyncio.run(walk(out, Path(tmp)))
            except TimeoutError as exc:
                print(f"{name} failed: {exc}", file=sys.stderr)
                return 1
        return 0
    finally:
        if not verbose:
            root.setLevel(level)


def run_demo(verbose: bool = False, out: TextIO | None = None) -> int:
    return run_walkthrough(_demo, name="demo", verbose=verbose, out=out)
