"""A hostile or broken config file is one line naming the problem, and exit 2 from serve."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdma_hca.settings.config import load_settings
from rdma_hca.settings.file import MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES
from rdma_hca.settings.model import ConfigError


def alias_bomb(path: Path) -> None:
    """The "billion laughs": nine levels of nine aliases, 9**9 values once expanded."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"{name}: &{name} [" + ", ".join(["*" + prev] * 9) + "]")
        prev = name
    path.write_text("\n".join(lines) + "\n")


def doubling_bomb(path: Path) -> None:
    """Few aliases, each doubling the one before: 2**40 values from 80 aliases."""
    lines = ["a0: &a0 [x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]
    path.write_text("\n".join(lines) + "\n")


def fifty_megabytes(path: Path) -> None:
    with path.open("w") as f:
        f.write("resourceName: rdma/hca\n# ")
        f.write("x" * (50 << 20))


def deep_flow(path: Path) -> None:
    path.write_text("selectors: " + "[" * 100_000 + "]" * 100_000 + "\n")


def deep_block(path: Path) -> None:
    path.write_text("".join(" " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5)))


def huge_int(path: Path) -> None:
    path.write_text("rdmaHcaMax: " + "9" * 5000 + "\n")


def huge_tagged_int(path: Path) -> None:
    path.write_text("rdmaHcaMax: !!int '" + "9" * 5000 + "'\n")


def not_utf8(path: Path) -> None:
    path.write_bytes(b"resourceName: rdma/hca\nmode: \xff\xfeshared\n")


def many_values(path: Path) -> None:
    # Under 1 MiB, no alias, but more values than any config needs.
    with path.open("w") as f:
        for i in range(MAX_NODES // 4):
            f.write(f"- [{i}, {i}, {i}]\n")


def a_directory(path: Path) -> None:
    path.mkdir()


def a_fifo(path: Path) -> None:
    os.mkfifo(path)


def missing(path: Path) -> None:
    pass


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "alias-bomb": (alias_bomb, "once aliases are expanded"),
    "doubling-bomb": (doubling_bomb, "once aliases are expanded"),
    "50MB": (fifty_megabytes, "at most 1048576"),
    "deep-flow": (deep_flow, "nesting depth"),
    "deep-block": (deep_block, f"deeper than {MAX_DEPTH} levels"),
    "5000-digit-int": (huge_int, "a number of 5000 characters"),
    "5000-digit-tagged-int": (huge_tagged_int, "a number of 5000 characters"),
    "non-utf8": (not_utf8, "is not UTF-8"),
    "many-values": (many_values, f"more than {MAX_NODES} values"),
    "directory": (a_directory, "it is a directory"),
    "fifo": (a_fifo, "not a regular file"),
    "missing": (missing, "no such file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_is_one_config_error(tmp_path: Path, case: str) -> None:
    make, fragment = HOSTILE[case]
    path = tmp_path / "config.yaml"
    make(path)
    with pytest.raises(ConfigError) as err:
        load_settings(str(path), {}, {})
    text = str(err.value)
    assert fragment in text
    assert err.value.field_name == "--config"
    assert "\n" not in text and len(text) < 400


def test_non_utf8_error_says_where(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    not_utf8(path)
    with pytest.raises(ConfigError, match=r"byte 0xff at line 2 \(offset 29\)"):
        load_settings(str(path), {}, {})


def test_a_file_at_the_size_limit_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    head = "mode: exclusive\n#"
    path.write_text(head + "x" * (MAX_FILE_BYTES - len(head) - 1) + "\n")
    assert path.stat().st_size == MAX_FILE_BYTES
    assert str(load_settings(str(path), {}, {}).pools[0].mode) == "exclusive"


def test_a_few_aliases_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("selectors: &s {names: [mlx5_0]}\n"
                    "pools:\n  - {resourceName: a.io/x, selectors: *s}\n")
    assert load_settings(str(path), {}, {}).pools[0].selectors.names == ("mlx5_0",)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("mode: shared\n")
    path.chmod(0)
    code = ("import sys\nfrom rdma_hca.settings.config import load_settings\n"
            "from rdma_hca.settings.model import ConfigError\n"
            "try:\n    load_settings(sys.argv[1], {}, {})\n"
            "except ConfigError as exc:\n    print(exc)\n")

    def drop_to_nobody() -> None:  # root reads any file: check as an ordinary user
        if os.getuid() == 0:
            tmp_path.chmod(0o755)
            os.setgid(65534)
            os.setuid(65534)

    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                            text=True, timeout=30, preexec_fn=drop_to_nobody)
    assert "cannot be read (Permission denied)" in result.stdout, result.stderr


@pytest.mark.parametrize("case", ["alias-bomb", "50MB", "deep-flow", "5000-digit-int",
                                  "non-utf8", "directory"])
def test_serve_says_one_line_and_exits_2(tmp_path: Path, case: str) -> None:
    make, fragment = HOSTILE[case]
    path = tmp_path / "config.yaml"
    make(path)
    result = subprocess.run(
        [sys.executable, "-m", "rdma_hca.cli", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONUTF8": "1"})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rdma-hca serve: config error: --config:")
    assert fragment in lines[0]
    assert result.stdout == ""


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=200) | st.text(alphabet="[]{}:&*!- ,\n'\"#|>?%@`a1.", max_size=200)
       .map(str.encode))
def test_any_bytes_load_or_are_one_config_error(
        tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_bytes(data)
    try:
        load_settings(str(path), {}, {})
    except ConfigError as exc:
        assert "\n" not in str(exc)
