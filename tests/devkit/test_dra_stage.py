"""The DRA stage's own manners: a driver whose stop never ends fails the stage's exit,
naming where it waits, instead of hanging the run; the rest of the stage still stops."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rdma_hca.daemon.dra.driver import DraDriver
from rdma_hca.devkit.dra.stage import DraStage
from rdma_hca.devkit.sim import nodes as sim


class StuckStop(DraDriver):
    """Stops as the driver does, then waits for something that never comes."""

    async def stop(self) -> None:
        await super().stop()
        await asyncio.Event().wait()


async def test_a_stop_that_never_ends_is_named_and_the_rest_of_the_stage_stops(
        tmp_path: Path) -> None:
    node = sim.gpu_node(tmp_path / "node", hcas=2, gid_table_size=8)
    stage = DraStage(node, tmp_path / "s", driver=StuckStop, stop_limit=0.5)
    await stage.__aenter__()
    assert stage.kubelet is not None and await stage.registered()
    # The stuck step is named: the driver's stop, waiting at StuckStop.stop's last line.
    with pytest.raises(RuntimeError, match=r"did not stop within 0\.5 s; tasks: .* at stop:"):
        await stage.__aexit__(None, None, None)
    assert stage.driver is None and not os.path.exists(stage.root)  # kubelet, root: gone
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.cancel()  # the stuck stop: this loop ends with the test
