"""The one atomic write: whole file or old file, the mode asked for, no temp left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rdma_hca.kit.files import write_atomic


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_creates_the_directory_and_writes_the_file_0644(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "spec.json"
    write_atomic(str(target), "{}\n")
    assert target.read_text() == "{}\n"
    assert _mode(target) == 0o644
    assert os.listdir(target.parent) == ["spec.json"]


def test_replaces_the_old_content_with_the_mode_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint"
    target.write_text("old and longer than the new\n")
    target.chmod(0o644)
    old_umask = os.umask(0o077)
    try:
        write_atomic(str(target), "néw\n", mode=0o600)
        assert _mode(target) == 0o600
        write_atomic(str(target), "again\n", mode=0o644)
        # The mode is the one asked for whatever the umask says.
        assert _mode(target) == 0o644
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"again\n"
    assert os.listdir(tmp_path) == ["checkpoint"]


def test_a_relative_path_is_written_in_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_atomic("here.json", "1\n")
    assert (tmp_path / "here.json").read_text() == "1\n"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    target.write_text("old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(str(target), "half \udcff")  # a lone surrogate cannot be UTF-8
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["spec.json"]


def test_a_failed_rename_raises_the_os_error_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)  # a non-empty directory cannot be replaced
    with pytest.raises(OSError):
        write_atomic(str(target), "x")
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert target.is_dir()


def test_a_directory_that_cannot_be_made_raises(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):  # makedirs: a file already has the name
        write_atomic(str(tmp_path / "file" / "spec.json"), "x")
