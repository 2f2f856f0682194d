"""Root tasks of the daemon, and what happens when one of them ends.

A root task (the health loop, the kubelet lifecycle's tasks) runs as long as the
daemon; one that ends by itself is a bug. It is logged at once, with its traceback,
and the daemon stops and exits non-zero, so the DaemonSet restarts the pod.

Why exit rather than restart the task in place: a task that raised left its
objects in whatever state it was in (a half-replaced server, a registration owed),
which a fresh process does not inherit; the kubelet's restart back-off already
spaces the restarts; and a restart is visible (`kubectl get pods` counts them, the
previous container's log holds the traceback) where a task quietly restarted
inside the process is not. Until the process has stopped, ``/healthz`` answers 503
naming the dead task, so the liveness probe agrees.

One task may end on purpose: the DRA driver's sockets, when another live instance took
the DRA socket's path while this one ran (:class:`SocketTaken`). It gave way rather than
fight, and said so in one line naming the other instance; the daemon then stops with the
exit status of the same contest met at start (2: the operator must stop one instance or
give each its POD_UID), without a traceback, since nothing is broken in this process.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine, Iterable
from typing import Any

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(self) -> None:
        self.dead: list[str] = []
        # Why this instance gave way to another (the DRA socket taken), once it has.
        self.gave_way: str | None = None
        self.failed = asyncio.Event()
        self._stopping = False

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self.watch([task])
        return task

    def watch(self, tasks: Iterable[asyncio.Task[Any]]) -> None:
        """Supervise tasks created elsewhere (they are not cancelled by :meth:`stop`)."""
        for task in tasks:
            task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if self._stopping:
            return
        if task.cancelled():
            self._died(task, None, "was cancelled")
            return
        exc = task.exception()
        self._died(task, exc, "failed" if exc is not None else "returned")

    def _died(self, task: asyncio.Task[Any], exc: BaseException | None, how: str) -> None:
        name = task.get_name()
        self.dead.append(name)
        if _socket_taken(exc):
            # Said already, in one line naming the other instance.
            self.gave_way = str(exc)
            log.info("task %s ended: another instance serves the DRA driver; stopping", name)
        elif exc is not None:
            log.critical("task %s %s; stopping so that the pod is restarted", name, how,
                         exc_info=(type(exc), exc, exc.__traceback__))
        else:
            log.critical("task %s %s unexpectedly; stopping so that the pod is restarted",
                         name, how)
        self.failed.set()

    def stopping(self) -> None:
        """From now on tasks end because we end them: nothing to report."""
        self._stopping = True


def _socket_taken(exc: BaseException | None) -> bool:
    """Another instance took the DRA driver's socket. That module is loaded only when the
    driver runs: a daemon without it has no socket to lose (and no need to load it)."""
    sockets = sys.modules.get("rdma_hca.daemon.dra.kubeletplugin.sockets")
    return sockets is not None and isinstance(exc, sockets.SocketTaken)
