"""What the driver had prepared, at start: the checkpoint, or the CDI specs when it is lost.

While running beside another instance (a rolling update), the other instance's writes of
the checkpoint are followed by ``follow.CheckpointFollower``.
"""

from __future__ import annotations

import contextlib
import logging
import os

from rdma_hca.contract.checkpoint import CHECKPOINT_VERSION, CheckpointError, Claims
from rdma_hca.daemon.dra import files
from rdma_hca.daemon.dra.checkpoint import Checkpoint
from rdma_hca.daemon.dra.config import DriverConfig
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
