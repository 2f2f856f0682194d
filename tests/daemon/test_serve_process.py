"""``rdma-hca serve`` as a real process: signals, kill -9, config errors, kubelet restarts.

The daemon runs as a child process on a simulated node; the kubelet emulator runs in
the test's own event loop, so the two talk over real unix sockets exactly as the plugin
and a kubelet do. Waits have generous timeouts only so a broken build fails instead of
hanging; every assertion is about an outcome (exit status, files, what the kubelet saw).

The process helpers here (``ServeProcess``, ``serve``, ``http_get``...) are shared with
``test_metrics.py``, ``test_logs.py`` and ``test_netlink.py``, which import them from
this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from rdma_hca.daemon.deviceplugin.registration import socket_name
from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import gpu_node
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.settings.model import Settings

R = "rdma/hca"
SOCKET = socket_name(R)
WAIT = 10.0  # upper bound for anything to happen; only reached when something is broken


# --- helpers shared with the other process tests ------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment without any ``RDMA_HCA_*`` setting that could leak in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RDMA_HCA_")}
    # A child that hangs can then be made to print every thread's stack (SIGABRT).
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


def serve_argv(node: SimNode, plugin_dir: Path, *extra: str,
               metrics_port: int | None = None, poll: str | None = "0.05") -> list[str]:
    """The command line of ``rdma-hca serve`` on a sim node (no metrics unless a port is given).

    ``poll`` None leaves the poll interval to the environment or the default.
    """
    address = "" if metrics_port is None else f"127.0.0.1:{metrics_port}"
    argv = [
        sys.executable, "-m", "rdma_hca.cli", "serve",
        "--sysfs-root", str(node.sysfs_root),
        "--dev-root", str(node.dev_root),
        "--kubelet-dir", str(plugin_dir),
        "--metrics-address", address,
    ]
    if poll is not None:
        argv += ["--health-poll-seconds", poll]
    return argv + list(extra)


class ServeProcess:
    """One child process; its stderr is collected line by line while it runs."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.env = child_env() if env is None else env
        self.lines: list[str] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    @property
    def proc(self) -> asyncio.subprocess.Process:
        assert self._proc is not None, "start() first"
        return self._proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self.argv, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        async for raw in self._proc.stderr:
            async with self._changed:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._changed.notify_all()
        async with self._changed:
            self._changed.notify_all()

    def count(self, predicate: Callable[[str], bool]) -> int:
        return sum(1 for line in self.lines if predicate(line))

    async def wait_line(self, predicate: Callable[[str], bool], timeout: float = WAIT) -> str:
        """The first stderr line for which ``predicate`` holds, waiting for it if need be."""

        def found() -> str | None:
            return next((line for line in self.lines if predicate(line)), None)

        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(
                    lambda: found() is not None or (self._reader is not None
                                                    and self._reader.done()))
        except TimeoutError:
            pass
        line = found()
        if line is None:
            raise AssertionError(f"no such line on stderr of {self.argv[3:5]}; got:\n"
                                 + self.stderr)
        return line

    def send(self, sig: int) -> None:
        self.proc.send_signal(sig)

    async def wait_exit(self, timeout: float = WAIT) -> int:
        """The exit status; the stderr pipe is drained to its end first.

        A child still running after ``timeout`` fails the test with its thread stacks.
        """
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), WAIT)
            raise AssertionError(f"still running after {timeout:g} s; its stacks and stderr:\n"
                                 + self.stderr) from None
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout)
        return code

    async def close(self) -> None:
        """Kill the process if it still runs; never leaves a child behind."""
        if self._proc is None:
            return
        if self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._reader, WAIT)


@contextlib.asynccontextmanager
async def serve(argv: Sequence[str], env: dict[str, str] | None = None
                ) -> AsyncIterator[ServeProcess]:
    proc = ServeProcess(argv, env)
    await proc.start()
    try:
        yield proc
    finally:
        await proc.close()


async def http_request(port: int, path: str, method: str = "GET",
                       raw: bytes | None = None) -> tuple[int, dict[str, str], str]:
    """One HTTP/1.1 request on a fresh connection: status, headers (lower-case), body."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    try:
        request = raw if raw is not None else (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), WAIT)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for h in header_lines:
        name, _, value = h.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body.decode()


async def http_get(port: int, path: str) -> tuple[int, str]:
    status, _, body = await http_request(port, path)
    return status, body


async def wait_http(port: int, timeout: float = WAIT) -> None:
    """Wait until something accepts connections on ``port`` (the daemon starting up)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        return


def metric_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Families by name (as the parser names them) -> (labels, value) of every sample."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
        out.setdefault(family.name, [])
    return out


def build_gpu_node(root: Path, **kw: bool) -> SimNode:
    # Small GID tables: the daemon's start-up discovery stays cheap on a test machine.
    return gpu_node(root, gid_table_size=8, **kw)


async def wait_registered(kubelet: KubeletEmulator, *, more_than: int = 0,
                          timeout: float = WAIT) -> None:
    await kubelet.wait_for(lambda: kubelet.registrations(R) > more_than
                           and kubelet.allocatable(R) == 1000, timeout=timeout)


# --- fixtures -----------------------------------------------------------------------------


# --- signals --------------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)],
                         ids=["TERM", "INT"])
async def test_signal_stops_cleanly(sig: signal.Signals, status: int, node: SimNode,
                                    plugin_dir: Path, kubelet: KubeletEmulator) -> None:
    async with serve(serve_argv(node, plugin_dir)) as proc:
        await wait_registered(kubelet)
        assert kubelet.node_status() == {"capacity": {R: "1k"}, "allocatable": {R: "1k"}}
        assert (plugin_dir / SOCKET).is_socket()
        proc.send(sig)
        assert await proc.wait_exit(WAIT) == status
    assert not (plugin_dir / SOCKET).exists(), "the plugin left its socket behind"
    # The kubelet saw the stream end: no device is allocatable any more.
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "shutdown took" not in proc.stderr
    assert proc.count(lambda line: "stopping" in line) == 1


async def test_sigterm_while_kubelet_absent(node: SimNode, plugin_dir: Path) -> None:
    # The lifecycle is backing off between failed Registers: stopping must not wait for it.
    async with serve(serve_argv(node, plugin_dir)) as proc:
        await proc.wait_line(lambda line: "waiting for the kubelet" in line)
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit(WAIT) == 0
    assert not (plugin_dir / SOCKET).exists()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "shutdown took" not in proc.stderr


async def test_kill9_then_start_again(node: SimNode, plugin_dir: Path,
                                      kubelet: KubeletEmulator) -> None:
    sock = plugin_dir / SOCKET
    async with serve(serve_argv(node, plugin_dir)) as first:
        await wait_registered(kubelet)
        ids = [d.ID for d in kubelet.devices(R)]
        registrations = kubelet.registrations(R)
        first.send(signal.SIGKILL)
        assert await first.wait_exit() == -signal.SIGKILL
    await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
    # kill -9 leaves a socket file that nobody listens on.
    assert sock.is_socket()
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(ConnectionRefusedError):
        s.connect(str(sock))

    async with serve(serve_argv(node, plugin_dir)) as second:
        await wait_registered(kubelet, more_than=registrations)
        assert [d.ID for d in kubelet.devices(R)] == ids
        # The name is the same but something listens on it now.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(sock))
        resp = await kubelet.admit_pod(R, 1)
        assert resp.envs["RDMA_HCA_DEVICES"].split(",") == node.hca_names
        second.send(signal.SIGTERM)
        assert await second.wait_exit() == 0
    assert "Traceback" not in first.stderr + second.stderr
    assert "shutdown took" not in first.stderr + second.stderr


# --- configuration errors --------------------------------------------------------------------

# (name, extra flags, extra env, config file text or None, texts stderr must hold)
CONFIG_ERRORS: list[tuple[str, list[str], dict[str, str], str | None, list[str]]] = [
    ("file-bad-value", [], {}, "mode: sideways\n",
     ["mode", "'sideways'", "config file", "shared or exclusive"]),
    ("file-unknown-key", [], {}, "resourceNmae: rdma/hca\n",
     ["resourceNmae", "unknown key", "resourceName"]),
    ("file-bad-yaml", [], {}, "mode: [shared\n", ["--config", "not valid YAML", "line"]),
    ("file-missing", ["--config", "/nonexistent/rdma-hca.yaml"], {}, None,
     ["--config", "/nonexistent/rdma-hca.yaml", "cannot be read"]),
    ("flag-max", ["--rdma-hca-max", "0"], {}, None,
     ["rdmaHcaMax", "'0'", "flag --rdma-hca-max", "from 1 to 100000"]),
    ("flag-address", ["--metrics-address", "localhost"], {}, None,
     ["metricsAddress", "'localhost'", "HOST:PORT"]),
    ("flag-unknown", ["--bogus"], {}, None, ["unrecognized arguments: --bogus"]),
    ("env-poll", [], {"RDMA_HCA_HEALTH_POLL_SECONDS": "fast"}, None,
     ["healthPollSeconds", "'fast'", "RDMA_HCA_HEALTH_POLL_SECONDS"]),
    ("env-resource", [], {"RDMA_HCA_RESOURCE_NAME": "hca"}, None,
     ["resourceName", "'hca'", "RDMA_HCA_RESOURCE_NAME", "<domain>/<name>"]),
    # Only discovery shows mlx5_0 in both pools: refused once the node is known.
    ("exclusive-overlap", [], {},
     "pools:\n- resourceName: rdma/hca\n  selectors: {names: ['mlx5_[0-3]']}\n"
     "- resourceName: rdma/storage\n  mode: exclusive\n  selectors: {names: ['mlx5_?']}\n",
     ["config error: pools: 'mlx5_0, mlx5_1, mlx5_2, mlx5_3' is not valid: the HCAs mlx5_0, "
      "mlx5_1, mlx5_2, mlx5_3 are in the exclusive pool rdma/storage and in the pool "
      "rdma/hca"]),
    ("file-string-boolean", [], {}, 'nonHostNetwork: "yes"\n',
     ["nonHostNetwork: 'yes'", "a YAML boolean without quotes"]),
    ("file-duplicate-key", [], {}, "rdmaHcaMax: 10\nrdmaHcaMax: 20\n",
     ["the key 'rdmaHcaMax' is given twice, at line 1 and at line 2"]),
    ("env-config-missing", [], {"RDMA_HCA_CONFIG": "/nonexistent/rdma-hca.yaml"}, None,
     ["RDMA_HCA_CONFIG: '/nonexistent/rdma-hca.yaml'", "cannot be read"]),
]


@pytest.mark.parametrize(("flags", "env", "file_text", "expected"),
                         [c[1:] for c in CONFIG_ERRORS], ids=[c[0] for c in CONFIG_ERRORS])
async def test_config_error_exits_2_before_serving(
        flags: list[str], env: dict[str, str], file_text: str | None, expected: list[str],
        node: SimNode, plugin_dir: Path, kubelet: KubeletEmulator, tmp_path: Path) -> None:
    # No poll flag: a flag would win over the environment variable under test.
    argv = serve_argv(node, plugin_dir, *flags, poll=None)
    if file_text is not None:
        config = tmp_path / "config.yaml"
        config.write_text(file_text)
        argv += ["--config", str(config)]
    async with serve(argv, child_env(**env)) as proc:
        assert await proc.wait_exit() == 2
    for text in expected:
        assert text in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "shutdown took" not in proc.stderr
    assert sorted(os.listdir(plugin_dir)) == ["kubelet.sock"], "a socket was created anyway"
    assert kubelet.resources() == [] and kubelet.registrations(R) == 0


# --- the kubelet coming and going ------------------------------------------------------------


async def test_kubelet_absent_then_started_then_restarted(node: SimNode,
                                                          plugin_dir: Path) -> None:
    async with serve(serve_argv(node, plugin_dir)) as proc:
        await proc.wait_line(lambda line: "waiting for the kubelet" in line)
        kubelet = KubeletEmulator(plugin_dir)
        await kubelet.start()
        try:
            await wait_registered(kubelet)
            # The "kubelet absent" warning was given once, not on every retry.
            assert proc.count(lambda line: "waiting for the kubelet" in line
                              and "kubelet.sock does not exist" in line) == 1
            # A kubelet restart wipes the directory and creates kubelet.sock anew.
            before = kubelet.registrations(R)
            await kubelet.restart(delay=0.2)
            await wait_registered(kubelet, more_than=before)
            # A kubelet that dies without cleaning up, then comes back.
            before = kubelet.registrations(R)
            await kubelet.stop()
            await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
            await kubelet.start()
            await wait_registered(kubelet, more_than=before)
            assert proc.proc.returncode is None
        finally:
            await kubelet.stop()
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "shutdown took" not in proc.stderr


# --- garbage in the sysfs tree of a running daemon --------------------------------------------

GARBAGE = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.sampled_from([b"", b"\n", b"4: ACTIVE", b"5: LinkUp\n", b"-1\n", b"99999999999999999999\n",
                     b"400 Gb/sec\n", b"Gb/sec (4X NDR)\n", b"\xff\xfe\x00", b"1: DOWN\x00junk",
                     b"nan Gb/sec (4X)\n", b"-400 Gb/sec (4X NDR)\n"]),
)
FILES = ("state", "phys_state", "rate", "numa_node", "counters/port_rcv_data")


async def test_garbage_in_sysfs_keeps_the_daemon_serving(node: SimNode, plugin_dir: Path,
                                                         kubelet: KubeletEmulator) -> None:
    port = free_port()
    d = Daemon(Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                        kubelet_dir=str(plugin_dir), metrics_address=f"127.0.0.1:{port}",
                        health_poll_seconds=0.05), netlink=False)
    # The toggles below only make the daemon re-read the node: not a flap to hold.
    d.health.flaps.changes = 10**9
    await d.start()
    loop = asyncio.get_running_loop()
    victim = "mlx5_bond_0"  # discovered last, so a re-read that sees the toggle sees this too
    pci = node.pci_dir(victim)
    assert pci is not None
    paths = {name: (pci / name if name == "numa_node" else node.port_dir(victim) / name)
             for name in FILES}
    originals = {name: p.read_bytes() for name, p in paths.items()}
    toggle = [True]

    async def check() -> None:
        # Make the daemon re-read the whole node: flip mlx5_0's port, then wait for it.
        toggle[0] = not toggle[0]
        node.set_port("mlx5_0", 1, up=toggle[0])

        def toggled() -> bool:
            inv = d.inventory
            return inv is not None and any(h.name == "mlx5_0" and h.ports[0].is_up == toggle[0]
                                           for h in inv.hcas)

        async with asyncio.timeout(WAIT):
            while not toggled():
                await asyncio.sleep(0.02)
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert metric_samples(body)["rdma_hca_pool_devices"] == [({"resource": R}, 1000.0)]
        assert (await http_get(port, "/healthz"))[0] == 200
        assert kubelet.capacity(R) == 1000 and kubelet.options(R) is not None
        resp = await kubelet.allocate(R, [["hca-0001"]])
        assert len(resp.container_responses) == 1

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(FILES), GARBAGE)
    def garbage(name: str, content: bytes) -> None:
        try:
            paths[name].write_bytes(content)
            asyncio.run_coroutine_threadsafe(check(), loop).result(WAIT * 2)
        finally:
            paths[name].write_bytes(originals[name])

    try:
        await wait_registered(kubelet)
        # Hypothesis drives from a worker thread so the daemon keeps its event loop.
        await asyncio.to_thread(garbage)
        # With every file back as it was, the node is whole again.
        node.set_port("mlx5_0", 1, up=True)
        await wait_registered(kubelet)
    finally:
        await d.stop()


# --- SIGHUP and limits --------------------------------------------------------------------


async def test_sighup_rescans_and_keeps_serving(node: SimNode, plugin_dir: Path,
                                                kubelet: KubeletEmulator) -> None:
    # A poll of a minute: only the rescan can explain the kubelet seeing the port down.
    async with serve(serve_argv(node, plugin_dir, poll="60")) as proc:
        await wait_registered(kubelet)
        registrations = kubelet.registrations(R)
        node.set_port("mlx5_4", 1, up=False)
        proc.send(signal.SIGHUP)
        await proc.wait_line(lambda line: "rescan asked (SIGHUP)" in line)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 0)
        line = await proc.wait_line(lambda x: "rescan asked (SIGHUP)" in x)
        assert "kubelet.sock is there" in line
        # Each SIGHUP is one rescan and one line; the daemon keeps serving.
        node.set_port("mlx5_4", 1, up=True)
        proc.send(signal.SIGHUP)
        await kubelet.wait_for(lambda: kubelet.allocatable(R) == 1000)
        assert kubelet.registrations(R) == registrations, "a rescan is no re-registration"
        assert proc.proc.returncode is None, "SIGHUP must not end the daemon"
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit() == 0
    assert proc.count(lambda line: "rescan asked (SIGHUP)" in line) == 2
    assert "Traceback" not in proc.stderr


async def test_serve_raises_its_open_files_limit(node: SimNode, plugin_dir: Path,
                                                 kubelet: KubeletEmulator) -> None:
    # Start the daemon as a container often starts it: soft limit far below the hard one.
    argv = serve_argv(node, plugin_dir)
    launcher = (
        "import resource, runpy, sys\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_module('rdma_hca.cli', run_name='__main__')\n"
    )
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= 256:
        pytest.skip("the hard limit on open files is too low to see it raised")
    async with serve([sys.executable, "-c", launcher, "rdma-hca", *argv[3:]]) as proc:
        await wait_registered(kubelet)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
        await proc.wait_line(lambda x: f"raised the open-files limit from 256 to {hard}" in x)
        proc.send(signal.SIGTERM)
        assert await proc.wait_exit() == 0
