"""Processes the benchmark starts, and what it reads about them from /proc.

Both the daemon (``rdma-hca serve``) and the bare baseline server run as child processes
so that latency, memory and CPU are those of a process of their own, as in production,
not of a coroutine sharing the benchmark's event loop. Every child is stopped on the way
out, whatever happened, and its stderr goes to a file so a full pipe can never stall it
and a failure can quote its last lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, TypeVar

T = TypeVar("T")

STOP_GRACE = 5.0
_LOG_TAIL_LINES = 15


class BenchError(RuntimeError):
    """A measurement could not be taken; the message says what happened and where to look."""


@dataclass(frozen=True)
class ProcSample:
    """One look at a process: resident memory and CPU time used so far."""

    rss_kib: int
    cpu_ticks: int


def sample_process(pid: int, proc_root: str = "/proc") -> ProcSample:
    """Read VmRSS from ``status`` and utime+stime from ``stat`` of one process."""
    base = os.path.join(proc_root, str(pid))
    try:
        with open(os.path.join(base, "status"), encoding="ascii", errors="replace") as fh:
            status = fh.read()
        with open(os.path.join(base, "stat"), encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError as exc:
        raise BenchError(f"cannot read {base}: {exc.strerror} (did process {pid} exit?)") from None
    return ProcSample(rss_kib=parse_vmrss(status, base), cpu_ticks=parse_cpu_ticks(stat, base))


def parse_vmrss(status: str, where: str = "status") -> int:
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    raise BenchError(f"no readable VmRSS line in {where}/status")


def parse_cpu_ticks(stat: str, where: str = "stat") -> int:
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    # What follows starts at field 3 (state); utime and stime are fields 14 and 15.
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        raise BenchError(f"{where}/stat has no utime/stime fields: {stat[:80]!r}") from None


def cpu_percent(before: ProcSample, after: ProcSample, seconds: float) -> float:
    """CPU used between two samples as a percentage of one core."""
    if seconds <= 0:
        raise ValueError(f"the window must be positive seconds, got {seconds}")
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    return (after.cpu_ticks - before.cpu_ticks) / ticks_per_second / seconds * 100.0


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the daemon's config does not accept port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def compile_package() -> int:
    """Compile our modules' bytecode beside them, as pip does when it installs the wheel
    (the image's): a run from a source tree under PYTHONDONTWRITEBYTECODE would otherwise
    compile every module at each start of every child, a cost and a heap no node has.
    Returns how many modules failed to compile (none expected)."""
    import compileall

    import rdma_hca

    ok = compileall.compile_dir(os.path.dirname(rdma_hca.__file__), quiet=1)
    return 0 if ok else 1


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment without RDMA_HCA_* variables, which would change the daemon's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RDMA_HCA_")}
    env.update(extra or {})
    return env


class Child:
    """One child process; ``stop`` is safe to call any number of times."""

    def __init__(self, name: str, argv: Sequence[str], log_path: str,
                 *, ready_line: str | None = None,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.env = env
        self.argv = list(argv)
        self.log_path = log_path
        self.ready_line = ready_line
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise BenchError(f"{self.name} was never started")
        return self.proc.pid

    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    async def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        stdout = asyncio.subprocess.PIPE if self.ready_line else self._log
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=stdout, stderr=self._log,
            env=child_env(self.env),
        )

    async def wait_ready(self, timeout: float) -> None:
        """Wait for the child's ready line on stdout (only for children that print one)."""
        proc = self.proc
        if proc is None or proc.stdout is None or self.ready_line is None:
            raise BenchError(f"{self.name} prints no ready line")
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = await proc.stdout.readline()
                    if not line:
                        await proc.wait()
                        raise BenchError(f"{self.name} exited with status {proc.returncode} "
                                         f"before it was ready{self.log_tail()}")
                    if line.decode(errors="replace").strip() == self.ready_line:
                        return
        except TimeoutError:
            raise BenchError(f"{self.name} was not ready after {timeout:g} s"
                             f"{self.log_tail()}") from None

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is still there after a grace period."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self) -> str:
        """The last lines of the child's log, formatted to follow an error message."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                lines = fh.read().splitlines()[-_LOG_TAIL_LINES:]
        except OSError:
            return ""
        if not lines:
            return f" ({self.log_path} is empty)"
        body = "\n    ".join(lines)
        return f"; last lines of {self.log_path}:\n    {body}"

    async def race(self, awaitable: Awaitable[T], what: str) -> T:
        """Await ``awaitable`` but fail at once if the child exits meanwhile."""
        proc = self.proc
        if proc is None:
            raise BenchError(f"{self.name} was never started")
        work = asyncio.ensure_future(awaitable)
        died = asyncio.ensure_future(proc.wait())
        try:
            await asyncio.wait({work, died}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not died.done():
                died.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
        raise BenchError(f"{self.name} exited with status {proc.returncode} while {what}"
                         f"{self.log_tail()}")


def serve_argv(sysfs_root: str, dev_root: str, kubelet_dir: str, metrics_address: str,
               extra: Sequence[str] = ()) -> list[str]:
    """``rdma-hca serve`` with default settings except paths and the metrics address."""
    return [sys.executable, "-m", "rdma_hca.cli", "serve",
            "--sysfs-root", sysfs_root, "--dev-root", dev_root, "--kubelet-dir", kubelet_dir,
            "--metrics-address", metrics_address, *extra]


def bare_argv(socket_path: str, response_path: str) -> list[str]:
    return [sys.executable, "-m", "rdma_hca.devkit.bench_bare",
            "--socket", socket_path, "--response", response_path]


async def scrape_once(address: str, timeout: float = 10.0) -> bytes:
    """One ``GET /metrics`` on ``HOST:PORT``; the body (a BenchError unless 200)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise BenchError(f"GET /metrics on {address}: {head[:80]!r}")
    return body
