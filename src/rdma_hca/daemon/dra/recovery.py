"""What the driver had prepared, at start: the checkpoint, or the CDI specs when it is lost.

And, while running beside another instance (a rolling update), its writes of the
checkpoint: what this instance prepared may have been unprepared by the other one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from rdma_hca.contract.checkpoint import CHECKPOINT_VERSION, CheckpointError, Claims
from rdma_hca.daemon.dra import files
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.config import DriverConfig
from rdma_hca.kit.dirwatch import watch_dir
from rdma_hca.kit.offloop import OffLoop

log = logging.getLogger(__name__)


async def recover(config: DriverConfig, checkpoint: Checkpoint, io: OffLoop) -> Claims:
    """Open the lock file and read the checkpoint; rebuild it from our CDI specs when it is
    lost or corrupt, and write it in the current version when it is older."""
    path = config.checkpoint
    await io.run(f"opening {config.lock_path}", checkpoint.open)
    try:
        claims, version = await io.run(f"reading the checkpoint {path}", checkpoint.read)
        problem = None
    except CheckpointError as exc:
        claims, version, problem = {}, CHECKPOINT_VERSION, str(exc)
        aside = path + ".corrupt"
        with contextlib.suppress(OSError):
            await io.run(f"moving {path} aside", lambda: os.replace(path, aside))
        problem += f" (moved aside to {aside})"
    if problem is not None or not claims:
        specs = await io.run(
            f"reading the CDI specs in {config.cdi_spec_dir}",
            lambda: files.read_claim_specs(config.cdi_spec_dir, config.driver_name))
        if problem is not None or specs:
            log.error("%s; rebuilt %d prepared claim(s) from this driver's CDI specs in %s",
                      problem or f"the checkpoint {path} is missing",
                      len(specs), config.cdi_spec_dir)
            claims = await _save_merged(config, checkpoint, io, specs)
    elif version != CHECKPOINT_VERSION:
        claims = await _save_merged(config, checkpoint, io, claims)
        log.info("checkpoint %s migrated from version %d to %d", path, version,
                 CHECKPOINT_VERSION)
    if claims:
        log.info("%d prepared claim(s) in the checkpoint", len(claims))
    return dict(claims)


async def _save_merged(config: DriverConfig, checkpoint: Checkpoint, io: OffLoop,
                       claims: Claims) -> Claims:
    def merge(on_disk: Claims) -> None:
        for uid, c in claims.items():
            on_disk.setdefault(uid, c)

    return await io.run(f"writing the checkpoint {config.checkpoint}",
                        lambda: checkpoint.update(merge, claims, force=True))


async def follow_checkpoint(config: DriverConfig, checkpoint: Checkpoint, io: OffLoop,
                            on_foreign_write: Callable[[], None]) -> None:
    """Tell ``on_foreign_write`` of every write of the checkpoint by another instance (or
    of a checkpoint that cannot be looked at: then nothing in memory is to be trusted)."""
    path = config.checkpoint
    name = os.path.basename(path)
    async for event in watch_dir(os.path.dirname(path)):
        if not (event.watching or event.gone or event.name == name):
            continue
        try:
            foreign = await io.run(f"looking at {path}", checkpoint.written_by_another)
        except Exception:  # a stuck disk: trust nothing from memory
            foreign = True
        if foreign:
            on_foreign_write()
