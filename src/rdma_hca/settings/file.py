"""Reading the config file with bounds, so a hostile or broken file is one line, fast.

The file comes from a ConfigMap (at most 1 MiB) or a path given by hand. Before anything
is built from it, the YAML event stream is walked once (libyaml's parser keeps its own
stack, so this is safe at any depth) and refused when it is too deep, when aliases would
expand it beyond what any config needs (the "billion laughs"), or when a number is longer
than any setting takes. Only then is it constructed, at a depth Python can recurse to.

PyYAML (about 15 ms and 1.3 MiB) is loaded when a file is read, not with this module: a
daemon given no config file never needs it.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rdma_hca.settings.model import ConfigError

if TYPE_CHECKING:
    import yaml

MAX_FILE_BYTES = 1 << 20  # a ConfigMap holds at most 1 MiB
MAX_DEPTH = 32  # the deepest real key is pools[i].selectors.names[j]: depth 5
MAX_NODES = 100_000  # scalars and collections after alias expansion
MAX_ALIASES = 100
MAX_NUMBER_CHARS = 64

_NUMERIC_TAGS = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
# A plain scalar that YAML 1.1 could read as a number (int, float, sexagesimal, hex, octal).
_NUMBERISH = re.compile(r"[-+]?(0[xXoObB])?[0-9a-fA-F_.:]*[0-9][0-9a-fA-F_.:eE+-]*")


def _loader() -> type[yaml.SafeLoader]:
    """libyaml's safe loader where PyYAML was built with it, else the Python one."""
    import yaml

    loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return loader


def _error(path: str, why: str) -> ConfigError:
    return ConfigError("--config", path, why)


def _read_bytes(path: str) -> bytes:
    # O_NONBLOCK: a FIFO given as the config file must not block the open.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise _error(path, "the file cannot be read: there is no such file; give the "
                               "path of the YAML config file") from None
        if exc.errno == errno.EISDIR:
            raise _error(path, "the file cannot be read: it is a directory; give the YAML "
                               "file in it, e.g. DIR/config.yaml") from None
        raise _error(path, f"the file cannot be read ({exc.strerror or exc}): check the path "
                           "and its permissions") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _error(path, "the file cannot be read: it is a directory; give the YAML "
                               "file in it, e.g. DIR/config.yaml")
        if not stat.S_ISREG(st.st_mode):
            raise _error(path, "the file cannot be read: it is not a regular file; give a "
                               "YAML file")
        if st.st_size > MAX_FILE_BYTES:
            raise _error(path, f"the file has {st.st_size} bytes; a config file may have at most "
                               f"{MAX_FILE_BYTES} (1 MiB)")
        chunks: list[bytes] = []
        total = 0
        # Read at most one byte past the limit: a file that grows while read stays bounded.
        while total <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_FILE_BYTES:
            raise _error(path, f"the file has more than {MAX_FILE_BYTES} bytes (1 MiB); "
                               "a config file may have at most that")
        return b"".join(chunks)
    except OSError as exc:
        raise _error(path, f"the file cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _error(path, f"byte 0x{data[exc.start]:02x} at line {line} (offset {exc.start}) is "
                           "not UTF-8: save the file as UTF-8") from None


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


class _Keys:
    """The keys seen so far in one open mapping, and whether the next node is a key."""

    __slots__ = ("seen", "want_key")

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}  # key -> its line (1-based)
        self.want_key = True


def _check_key(path: str, frame: _Keys | None, event: Any) -> None:
    """A node inside a mapping: refuse a key given twice (YAML would keep the last)."""
    if frame is None:
        return
    import yaml

    if frame.want_key and isinstance(event, yaml.ScalarEvent) and event.value != "<<":
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        first = frame.seen.get(event.value)
        if first is not None:
            raise _error(path, f"the key {event.value!r} is given twice, at line {first} and "
                               f"at line {line}: keep one (YAML would silently take the last)")
        frame.seen[event.value] = line
    frame.want_key = not frame.want_key


def _check_events(path: str, text: str) -> None:
    """Refuse depth, expansion, number sizes and duplicated keys no config needs, before
    constructing."""
    import yaml

    depth = 0
    aliases = 0
    anchored: dict[str, int] = {}
    # One frame per open collection: [expanded size so far, its anchor].
    stack: list[list[Any]] = [[0, None]]
    # One per open collection: the keys of a mapping, None for a sequence (or the stream).
    keys: list[_Keys | None] = [None]
    for event in yaml.parse(text, Loader=_loader()):
        if isinstance(event, yaml.NodeEvent):
            _check_key(path, keys[-1], event)
        if isinstance(event, yaml.MappingStartEvent):
            keys.append(_Keys())
        elif isinstance(event, yaml.SequenceStartEvent):
            keys.append(None)
        elif isinstance(event, yaml.CollectionEndEvent):
            keys.pop()
        size = 0
        anchor = None
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _error(path, f"it nests deeper than {MAX_DEPTH} levels"
                                   f"{_where(event.start_mark)}; no setting needs that")
            stack.append([1, event.anchor])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            size, anchor = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
            value = event.value
            numeric = event.tag in _NUMERIC_TAGS or (
                event.implicit[0] and not event.style and _NUMBERISH.fullmatch(value))
            if numeric and len(value) > MAX_NUMBER_CHARS:
                raise _error(path, f"a number of {len(value)} characters"
                                   f"{_where(event.start_mark)}: no setting takes more than "
                                   f"{MAX_NUMBER_CHARS}")
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise _error(path, f"it uses more than {MAX_ALIASES} aliases (*name)"
                                   f"{_where(event.start_mark)}: write the values out")
            size = anchored.get(event.anchor or "", 1)
        else:
            continue
        if anchor is not None:
            anchored[anchor] = size
        stack[-1][0] += size
        if stack[-1][0] > MAX_NODES or sum(f[0] for f in stack) > MAX_NODES:
            raise _error(path, f"it holds more than {MAX_NODES} values once aliases are "
                               f"expanded{_where(event.start_mark)}: no config needs that many")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    what = f" ({' '.join(str(problem).split())[:80]})" if problem else ""
    return f"it is not valid YAML{_where(getattr(exc, 'problem_mark', None))}{what}: fix the syntax"


def read_config_file(path: str | Path, name: str = "--config") -> dict[str, Any]:
    """Parse the YAML file; anything unreadable, oversized or malformed is a ConfigError.

    ``name`` is how errors name what gave the path (``--config``, ``RDMA_HCA_CONFIG``).
    """
    path = str(path)
    try:
        return _read(path)
    except ConfigError as exc:
        if name == exc.field_name:
            raise
        raise ConfigError(name, exc.value, exc.allowed, exc.source) from None


def _read(path: str) -> dict[str, Any]:
    return parse_config_text(path, _decode(path, _read_bytes(path)))


def parse_config_text(path: str, text: str) -> dict[str, Any]:
    """The mapping YAML (or JSON) ``text`` holds, with the file's bounds and checks;
    errors name ``path`` (the file the text came from)."""
    import yaml

    try:
        _check_events(path, text)
    except yaml.YAMLError as exc:
        raise _error(path, _yaml_problem(exc)) from None
    try:
        data = yaml.load(text, Loader=_loader())  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        raise _error(path, _yaml_problem(exc)) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        # Constructors that reject a value (a date like 2024-13-45, an over-long int).
        raise _error(path, f"a value cannot be read ({type(exc).__name__}): fix it") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _error(path, "the file must hold a YAML mapping (key: value lines)")
    return data
