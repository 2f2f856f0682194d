"""``rdma-hca serve`` as a process: logging, signals, the event loop around the Daemon."""

from __future__ import annotations

import asyncio
import signal

from rdma_hca.kit.logs import quiet_grpc_core, setup_logging

quiet_grpc_core()  # before anything below loads grpc

from rdma_hca.daemon.config import Settings  # noqa: E402
from rdma_hca.daemon.wiring import Daemon  # noqa: E402


def serve(settings: Settings) -> int:
    """Run the daemon until SIGTERM or SIGINT; the exit status of the process."""
    setup_logging(settings.log_format.value, settings.log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await Daemon(settings).run(stop)

    asyncio.run(main())
    return 0
