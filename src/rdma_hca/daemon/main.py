"""``rdma-hca serve`` as a process: limits, logging, signals, the event loop around the Daemon.

Signals: SIGTERM stops the daemon (exit 0), SIGINT too (exit 130, as for every command);
before the event loop takes them over, ``rdma_hca.cli`` ends the start the same way, with
the same statuses and one line. SIGHUP asks for a rescan
(rediscover the node now and check the kubelet's socket and ours), never a reload:
the configuration comes from a ConfigMap whose checksum annotation rolls the pods.
A root task that dies stops the daemon with exit status 1; an HTTP address that
cannot be listened on is a configuration error (exit 2), and so is another instance
serving the DRA driver's socket, met at start or taken while running.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
import sys

from rdma_hca.kit.exitcodes import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from rdma_hca.kit.logs import quiet_grpc_core, setup_logging

quiet_grpc_core()  # before anything below loads grpc

from rdma_hca.daemon.observe.httpserver import BindError  # noqa: E402
from rdma_hca.daemon.wiring import Daemon  # noqa: E402
from rdma_hca.settings.model import ConfigError, Settings  # noqa: E402

log = logging.getLogger(__name__)

EXIT_TASK_DIED = 1  # a root task ended by itself: the DaemonSet restarts the pod
# Reads of the machine parse on worker threads; with the interpreter's default of 5 ms a
# busy worker keeps the event loop waiting up to that long for the GIL at every switch.
SWITCH_INTERVAL = 0.001


def prefer_the_loop() -> float:
    """Hand the GIL back to the event loop sooner; returns the interval it replaced."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    return before


def settle_heap() -> None:
    """Put what start-up made out of the cyclic collector's reach.

    A full collection walks every tracked object holding the GIL, and it runs in
    whichever thread happens to allocate: after start-up that is some 40k objects
    (modules, gRPC, protobuf descriptors, the first inventory), 20 to 35 ms in which the
    event loop cannot run, seen as exactly such stalls during scrapes. Those objects live
    as long as the process, so walking them again finds nothing; after the freeze a full
    collection walks only what came later. Frozen objects are still freed by reference
    counting when they go (an old inventory does); only cycles among them that become
    garbage later stay: a one-time cost bounded by what start-up made, never a growing
    one. Garbage already there is collected first.
    """
    gc.collect()
    gc.freeze()


def started() -> None:
    """What serve does once the daemon has started and registered: settle the heap, then
    collect as usual again (``rdma_hca.cli`` turns the collector off for the start)."""
    settle_heap()
    gc.enable()


def raise_fd_limit() -> tuple[int, int] | None:
    """Raise the soft limit on open files to the hard one; the (old, new) soft limits.

    A container often starts with a soft limit of 1024, which a flood of HTTP clients
    could exhaust; discovery then fails for want of a file descriptor.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == hard:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        return None
    return soft, hard


def _config_errors() -> tuple[type[Exception], ...]:
    """ConfigError, and the DRA driver's configuration error when its modules are loaded:
    a daemon without the driver cannot raise it and need not import them."""
    options = sys.modules.get("rdma_hca.daemon.dra.kubeletplugin.options")
    return (ConfigError,) if options is None else (ConfigError, options.DraConfigError)


def serve(settings: Settings) -> int:
    """Run the daemon until SIGTERM or SIGINT; the exit status of the process."""
    setup_logging(settings.log_format.value, settings.log_level)
    prefer_the_loop()
    raised = raise_fd_limit()
    if raised is not None:
        log.info("raised the open-files limit from %d to %d", *raised)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        stopped_by: list[int] = []

        def on_stop(sig: int) -> None:
            stopped_by.append(sig)
            stop.set()

        # First of all: from here a stop signal ends the run through the daemon's own stop.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_stop, sig)
        daemon = Daemon(settings)
        loop.add_signal_handler(signal.SIGHUP, daemon.rescan)
        try:
            await daemon.run(stop, on_started=started)
        except BindError as exc:
            log.error("%s", exc)
            return EXIT_USAGE
        except _config_errors() as exc:
            # Found only once the node is known (e.g. an HCA both DRA and a pool select).
            log.error("config error: %s", exc)
            return EXIT_USAGE
        if daemon.supervisor.gave_way is not None:
            return EXIT_USAGE  # as when the start meets the other instance
        if daemon.failed:
            return EXIT_TASK_DIED
        return EXIT_INTERRUPTED if stopped_by[:1] == [signal.SIGINT] else EXIT_OK

    return asyncio.run(main())
