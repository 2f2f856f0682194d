"""The two cheap reads of the node polled often: port states and port counters.

The health watcher polls ``read_port_states`` and the metrics read ``read_port_counters``;
``discover_node`` (in ``node.inventory``) reads everything else. They read in the calling
thread with no deadline; ``node.deadline_reader.NodeReader`` runs them off the event loop
with one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from rdma_hca.kit.text import natural_key
from rdma_hca.node.file_reads import Reads, ReadStalled, check_exhausted
from rdma_hca.node.inventory import is_port_entry
from rdma_hca.node.sysfs_values import (
    MAX_COUNTER,
    UNKNOWN,
    attribute_text,
    display_name,
    is_number,
    phys_state,
    port_state,
    safe_name,
)
from rdma_hca.node.sysfs_walk import StrPath

PortStates = dict[tuple[str, int], tuple[str, str]]


def _listdir(path: str) -> list[str] | None:
    try:
        return os.listdir(path)
    except OSError as err:
        check_exhausted(err)
        return None


def _read_state(io: Reads, path: str, phys: bool) -> str | None:
    """The state a file gives; UNKNOWN when it cannot be read or understood, None when
    there is no such file (a port directory without a state file is not a port)."""
    try:
        raw = io.read(path)
    except FileNotFoundError:
        return None
    except ReadStalled:
        return UNKNOWN
    except OSError as err:
        check_exhausted(err)
        return UNKNOWN
    return phys_state(raw) if phys else port_state(raw)


def port_states_of(
    sysfs_root: StrPath,
    hcas: Iterable[tuple[str, str]],
    io: Reads,
    unknown: frozenset[str] | set[str] = frozenset(),
) -> PortStates:
    """States of the ports of ``hcas`` (pairs of shown name and directory name).

    Quiet: an HCA or port that vanished is absent; a port whose files cannot be read or
    understood reads UNKNOWN, as does every port of an HCA named in ``unknown`` (one of
    its files is stuck, so its state cannot be trusted).
    """
    root = os.fspath(sysfs_root)
    states: PortStates = {}
    for name, dirname in hcas:
        if not safe_name(dirname):
            continue
        ports_dir = os.path.join(root, "class", "infiniband", dirname, "ports")
        entries = _listdir(ports_dir)
        if entries is None:
            continue
        io.working_on(name)
        for entry in entries:
            if not is_port_entry(entry):
                continue
            port_dir = os.path.join(ports_dir, entry)
            if name in unknown:
                states[(name, int(entry))] = (UNKNOWN, UNKNOWN)
                continue
            state = _read_state(io, os.path.join(port_dir, "state"), phys=False)
            if state is None:
                continue
            phys = _read_state(io, os.path.join(port_dir, "phys_state"), phys=True)
            states[(name, int(entry))] = (state, phys or UNKNOWN)
    io.working_on(None)
    return states


def read_port_states(sysfs_root: StrPath, hca_names: Iterable[str]) -> PortStates:
    """``(hca, port) -> (state, phys_state)``, e.g. ``("ACTIVE", "LinkUp")``.

    The health watcher polls this often, so it reads only the two state files per port
    and stays quiet: an HCA or port that vanished is simply absent, a port whose state
    cannot be read or understood reads ``UNKNOWN`` (discovery is where such content gets
    reported).
    """
    return port_states_of(sysfs_root, ((n, n) for n in hca_names), Reads())


def listed_hcas(sysfs_root: StrPath) -> list[tuple[str, str]]:
    """(shown name, directory name) of every entry of ``class/infiniband``."""
    names = _listdir(os.path.join(os.fspath(sysfs_root), "class", "infiniband")) or []
    return [(display_name(n), n) for n in sorted(names, key=natural_key)]


HW_PREFIX = "hw_counters/"
"""Keys of ``hw_counters/`` files in a port's counter dict start with this (a slash is in
no file name, so they never collide with the names of ``counters/``)."""
# hw_counters holds one file that is not a counter: how long the driver caches the
# others, in milliseconds (drivers/infiniband/core/sysfs.c).
NOT_COUNTERS = frozenset({"lifespan"})
MAX_COUNTER_NAME = 64


def _counter_name(name: str) -> bool:
    # The name becomes a label value: printable ASCII of a sane length, nothing else.
    return (len(name) <= MAX_COUNTER_NAME and name.isascii() and name.isprintable()
            and not name.startswith(".") and name not in NOT_COUNTERS)


def _read_counters(io: Reads, directory: str, prefix: str, into: dict[str, int]) -> None:
    names = _listdir(directory)
    if not names:
        return
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        check_exhausted(err)
        return
    try:
        for name in sorted(names):
            if not _counter_name(name):
                continue
            try:
                raw = io.read_at(dir_fd, directory, name)
            except OSError as err:
                check_exhausted(err)
                continue  # some counters answer EOPNOTSUPP on some devices; stuck ones too
            text = attribute_text(raw)
            if text is not None and len(text) <= 20 and is_number(text):
                value = int(text)
                if value <= MAX_COUNTER:
                    into[prefix + name] = value
    finally:
        os.close(dir_fd)


def port_counters_of(sysfs_root: StrPath, dirname: str, port: int, io: Reads) -> dict[str, int]:
    """Every integer counter of one port: the files of ``counters/`` by name, those of
    ``hw_counters/`` prefixed with :data:`HW_PREFIX`. A file that cannot be read, is not
    a number or is past 64 bits is left out; a stuck one is the reads' business."""
    if not safe_name(dirname):
        return {}
    port_dir = os.path.join(
        os.fspath(sysfs_root), "class", "infiniband", dirname, "ports", str(port))
    counters: dict[str, int] = {}
    _read_counters(io, os.path.join(port_dir, "counters"), "", counters)
    _read_counters(io, os.path.join(port_dir, "hw_counters"), HW_PREFIX, counters)
    return counters


def read_port_counters(sysfs_root: StrPath, hca: str, port: int) -> dict[str, int]:
    """The integer counters of ``ports/<port>/counters`` and ``hw_counters``; anything
    else is left out."""
    return port_counters_of(sysfs_root, hca, port, Reads())
