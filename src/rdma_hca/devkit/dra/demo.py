"""The DRA part of ``make demo``: the real driver on a simulated GPU node.

A kubelet emulator registers the driver through its plugin watcher, a fake API server
over HTTP stores the ResourceSlices and ResourceClaims. The walkthrough shows the slice
appearing with each HCA's PCIe root and bandwidth, a claim being prepared into a CDI
device, the guide's ``rdma/hca: 1`` getting every HCA through the extended-resource class,
two claims sharing one HCA by bandwidth, a port going down and the slice changing, and the
kubelet restarting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from rdma_hca.contract.dra import (
    BANDWIDTH,
    HCA_COUNT,
    HCA_NAME,
    LINK_STATE,
    NODE_DEVICE,
    NUMA_NODE,
    PCIE_ROOT,
    SLOTS,
    qualified,
)
from rdma_hca.devkit.demo import run_walkthrough
from rdma_hca.devkit.dra.extended import extended_claim
from rdma_hca.devkit.dra.stage import DraStage, share_result
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.kit.text import text_table

DRIVER = "rdma-hca.io"
NODE = "gpu-node-1"


def _value(device: dict[str, Any], key: str) -> str:
    attr = device.get("attributes", {}).get(key)
    return "-" if attr is None else str(next(iter(attr.values())))


def _bandwidth(device: dict[str, Any]) -> str:
    cap = device.get("capacity", {}).get(qualified(DRIVER, BANDWIDTH))
    return "-" if cap is None else str(cap["value"])


def _gbps(bits: int) -> str:
    return f"{bits / 1e9:g}G"


def _slice_summary(stage: DraStage) -> str:
    (only,) = stage.slices()
    pool = only["spec"]["pool"]
    return (f"ResourceSlice {only['metadata']['name']}: node {only['spec']['nodeName']}, "
            f"pool {pool['name']} generation {pool['generation']}, "
            f"{len(only['spec']['devices'])} devices")


async def _demo(out: TextIO, workdir: Path) -> None:
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    node = gpu_node(workdir / "node", gid_table_size=16)
    async with DraStage(node, workdir / "stage", node_name=NODE) as stage:
        assert stage.kubelet is not None
        say("== DRA: the node's HCAs as ResourceSlices (resource.k8s.io/v1) ==")
        if not await stage.registered() or not await stage.until(lambda: bool(stage.devices())):
            raise TimeoutError("the driver did not register and publish its slice")
        say(f"The kubelet's plugin watcher found {DRIVER}-reg.sock and registered the driver "
            f"({stage.kubelet.plugins[DRIVER].service}).")
        say(_slice_summary(stage))
        gpus = node.gpus_by_root()
        rows: list[tuple[str, ...]] = [
            ("DEVICE", "HCA", "pcieRoot", "GPUs UNDER IT", "NUMA", "NETDEV", "LINK",
             "BANDWIDTH")]
        for name, d in sorted(stage.devices().items()):
            root = _value(d, PCIE_ROOT)
            hca = (f"every usable ({_value(d, qualified(DRIVER, HCA_COUNT))})"
                   if name == NODE_DEVICE else _value(d, qualified(DRIVER, HCA_NAME)))
            rows.append((name, hca, root,
                         str(len(gpus.get(root, []))) if root != "-" else "-",
                         _value(d, NUMA_NODE),
                         _value(d, f"{DRIVER}/netdev"), _value(d, qualified(DRIVER, LINK_STATE)),
                         _bandwidth(d)))
        say("\n".join(text_table(rows, indent="  ")))
        say("A claim with matchAttribute resource.kubernetes.io/pcieRoot over a GPU request "
            "and an HCA request gets both from one row's root complex; all-hcas is what "
            f"the {DRIVER}-extended class (rdma/hca) selects.")
        say()

        say("== A claim is prepared ==")
        uid = stage.api.add_claim("training", "gpu-and-hca", [
            {"request": "hca", "driver": DRIVER, "pool": NODE, "device": "mlx5-2"}])
        resp = await stage.kubelet.prepare(DRIVER, [("training", uid, "gpu-and-hca")])
        entry = resp.claims[uid]
        if entry.error:
            raise TimeoutError(f"prepare failed: {entry.error}")
        cdi_id = entry.devices[0].cdi_device_ids[0]
        say(f"NodePrepareResources(training/gpu-and-hca) -> device mlx5-2, CDI ID {cdi_id}")
        spec = json.loads(next(stage.cdi_dir.iterdir()).read_text())
        edits = spec["devices"][0]["containerEdits"]
        say(f"CDI spec {next(stage.cdi_dir.iterdir()).name}: "
            f"{', '.join(n['path'] for n in edits['deviceNodes'])} + "
            f"{spec['containerEdits']['deviceNodes'][0]['path']}; env {', '.join(edits['env'])}")
        say()

        say("== The guide's Job asks rdma/hca: 1, served by DRA ==")
        claim, ext = extended_claim(stage.api, "default", "hps-benchmark-x7k2p", driver=DRIVER,
                                    pool=NODE, device=NODE_DEVICE,
                                    device_class=f"{DRIVER}-extended",
                                    consumed={qualified(DRIVER, SLOTS): "1"})
        resp = await stage.kubelet.prepare(DRIVER, [("default", ext, claim)])
        entry = resp.claims[ext]
        if entry.error:
            raise TimeoutError(f"prepare failed: {entry.error}")
        (device,) = entry.devices
        say(f"The scheduler's claim {claim}: request {device.request_names[0]}, one device "
            f"of {DRIVER}-extended -> {device.device_name}")
        spec = json.loads((stage.cdi_dir / f"{DRIVER}-claim-{ext}.json").read_text())
        edits = spec["devices"][0]["containerEdits"]
        env = dict(e.split("=", 1) for e in edits["env"])
        say(f"  the container gets {len(edits['deviceNodes'])} HCAs' device nodes + rdma_cm, "
            f"RDMA_HCA_DEVICES={env['RDMA_HCA_DEVICES']}: what the device plugin's "
            "rdma/hca: 1 gives")
        await stage.kubelet.unprepare(DRIVER, [("default", ext, claim)])
        say()

        await _shares(stage, say)

        say("== A port goes down ==")
        node.set_port("mlx5_3", up=False)
        if not await stage.until(lambda: "taints" in stage.devices().get("mlx5-3", {})):
            raise TimeoutError("the slice did not change")
        d = stage.devices()["mlx5-3"]
        taint = d["taints"][0]
        say(f"mlx5_3 port 1 DOWN -> {_slice_summary(stage)}")
        say(f"  mlx5-3: linkState {_value(d, f'{DRIVER}/linkState')}, taint "
            f"{taint['key']}={taint['value']}:{taint['effect']} (no new claims placed on it)")
        events = stage.kubelet.events.health
        await stage.until(lambda: bool(events) and
                          events[-1].devices.get(f"{NODE}/mlx5-3") == "UNHEALTHY")
        say(f"  health stream to the kubelet: {NODE}/mlx5-3 "
            f"{events[-1].devices.get(f'{NODE}/mlx5-3')}")
        node.set_port("mlx5_3", up=True)
        await stage.until(lambda: "taints" not in stage.devices().get("mlx5-3", {"taints": 1}))
        say(f"mlx5_3 port 1 up again -> taint cleared, {_slice_summary(stage)}")
        say()

        say("== The kubelet restarts ==")
        await stage.kubelet.restart()
        say("The starting kubelet deleted the node's slices and re-registered the driver ...")
        if not await stage.registered(2) or not await stage.until(lambda: bool(stage.devices())):
            raise TimeoutError("the driver did not publish again")
        say(f"... which published again: {_slice_summary(stage)}")
        resp = await stage.kubelet.unprepare(DRIVER, [("training", uid, "gpu-and-hca")])
        say(f"NodeUnprepareResources(training/gpu-and-hca): "
            f"{resp.claims[uid].error or 'done'}, CDI spec removed")


async def _shares(stage: DraStage, say: Any) -> None:
    """Two claims hold 150G and 250G of one 400G HCA: nothing is left for a third."""
    assert stage.kubelet is not None and stage.driver is not None
    say("== Two claims share one HCA by bandwidth (DRAConsumableCapacity) ==")
    policy = stage.devices()["mlx5-0"]["capacity"][qualified(DRIVER, BANDWIDTH)]
    say(f"mlx5-0 publishes {DRIVER}/bandwidth: {policy['value']}, requestPolicy "
        f"{json.dumps(policy['requestPolicy'], sort_keys=True)}")
    refs = []
    for name, ask in (("allreduce-a", "150G"), ("allreduce-b", "250G")):
        uid = stage.api.add_claim("training", name, [
            share_result("hca", "mlx5-0", NODE, bandwidth=ask)])
        refs.append(("training", uid, name))
        resp = await stage.kubelet.prepare(DRIVER, [refs[-1]])
        if resp.claims[uid].error:
            raise TimeoutError(f"prepare failed: {resp.claims[uid].error}")
        spec = json.loads(next(p for p in stage.cdi_dir.iterdir() if uid in p.name)
                          .read_text())
        env = [e for e in spec["devices"][0]["containerEdits"]["env"]
               if e.startswith("RDMA_HCA_BANDWIDTH=")]
        say(f"NodePrepareResources(training/{name}, asked {ask}) -> share of mlx5-0; "
            f"{env[0] if env else 'no RDMA_HCA_BANDWIDTH'}")
    held = stage.driver.stats().bandwidth_held["mlx5_0"]
    total = stage.driver.stats().bandwidth_capacity["mlx5_0"]
    say(f"rdma_hca_dra_bandwidth_held{{hca=\"mlx5_0\"}} {held:g} of "
        f"{total:g} ({_gbps(held)} of {_gbps(total)}): a third claim asking for bandwidth "
        "of mlx5-0 stays Pending (\"cannot allocate all claims\"); one asking none still fits")
    resp = await stage.kubelet.unprepare(DRIVER, refs)
    errors = [e.error for e in resp.claims.values() if e.error]
    if errors:
        raise TimeoutError(f"unprepare failed: {errors[0]}")
    say(f"NodeUnprepareResources(both) -> held on mlx5_0: "
        f"{_gbps(stage.driver.stats().bandwidth_held['mlx5_0'])}")
    say()


def run_dra_demo(verbose: bool = False, out: TextIO | None = None) -> int:
    """Print the DRA walkthrough; returns the exit code (0, or 1 when a step failed)."""
    return run_walkthrough(_demo, name="DRA demo", verbose=verbose, out=out)
