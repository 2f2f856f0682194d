"""The ``rdma-hca`` command: flags from the settings declaration, the same variables for
every subcommand, and one line with exit 2 for every bad input."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdma_hca import cli
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.settings.decl import BY_KEY, SETTINGS
from rdma_hca.settings.model import Settings


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    # Read only by these tests: one tree for the module keeps them fast.
    return sim.gpu_node(tmp_path_factory.mktemp("cli") / "node")


def run(capsys: pytest.CaptureFixture[str], argv: list[str],
        env: dict[str, str] | None = None) -> tuple[int, str, str]:
    code = cli.main(argv, env=env or {})
    out, err = capsys.readouterr()
    return code, out, err


def _subparser(name: str) -> object:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]  # type: ignore[index]


def test_serve_has_a_flag_for_every_declared_setting() -> None:
    serve = _subparser("serve")
    options = {o for a in serve._actions for o in a.option_strings}  # type: ignore[attr-defined]
    for s in SETTINGS:
        if s.flag:
            assert s.flag in options, s.flag
    assert {"--dra", "--no-dra", "--kubelet-root", "--node-name", "--read-deadline-seconds",
            "--http-max-connections", "--no-device-plugin", "--config"} <= options


def test_serve_flags_reach_the_settings() -> None:
    args = cli.build_parser().parse_args([
        "serve", "--kubelet-root", "/k", "--node-name", "gpu-7", "--dra",
        "--no-device-plugin", "--read-deadline-seconds", "1.5", "--cdi"])
    s = cli.settings_from_args(args, env={})
    assert (s.kubelet_root, s.plugins_registry_dir, s.node_name) == (
        "/k", "/k/plugins_registry", "gpu-7")
    assert (s.dra.enabled, s.pools, s.read_deadline_seconds, s.cdi.enabled) == (
        True, (), 1.5, True)


# --- the same variables for every subcommand ----------------------------------------------


def test_discover_honours_the_root_variables(capsys: pytest.CaptureFixture[str],
                                             gpu: SimNode) -> None:
    env = {"RDMA_HCA_SYSFS_ROOT": str(gpu.sysfs_root), "RDMA_HCA_DEV_ROOT": str(gpu.dev_root)}
    code, out, err = run(capsys, ["discover", "--json"], env)
    assert code == 0, err
    names = [h["name"] for h in json.loads(out)["hcas"]]
    assert names == gpu.hca_names
    # A flag still wins over the variable.
    code, _, err = run(capsys, ["discover", "--sysfs-root", str(gpu.root / "nope")], env)
    assert code == 2 and "--sysfs-root" in err


def test_doctor_node_honours_the_root_variables(capsys: pytest.CaptureFixture[str],
                                                gpu: SimNode, tmp_path: Path) -> None:
    env = {"RDMA_HCA_SYSFS_ROOT": str(gpu.sysfs_root), "RDMA_HCA_DEV_ROOT": str(gpu.dev_root),
           "RDMA_HCA_KUBELET_ROOT": str(tmp_path / "kubelet")}
    code, out, _err = run(capsys, ["doctor", "--node", "--json",
                                  "--readyz-url", "http://127.0.0.1:1/readyz"], env)
    report = json.loads(out)
    hcas = next(c for c in report["checks"] if c["name"] == "HCAs")
    assert hcas["ok"] and hcas["detail"].startswith(f"{len(gpu.hca_names)} found")
    kubelet = next(c for c in report["checks"] if c["name"] == "kubelet socket")
    assert str(tmp_path / "kubelet" / "device-plugins") in kubelet["detail"]
    assert code == 1  # no kubelet here: a check fails, the command ran


@pytest.mark.parametrize("argv", [["discover"], ["doctor", "--node"], ["check"]])
def test_every_tool_refuses_a_missing_root_from_the_variable(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]) -> None:
    code, out, err = run(capsys, argv, {"RDMA_HCA_SYSFS_ROOT": str(tmp_path / "gone")})
    assert code == 2
    gone = tmp_path / "gone"
    assert err.strip() == (f"rdma-hca {argv[0]}: sysfsRoot: '{gone}' (from environment "
                           f"variable RDMA_HCA_SYSFS_ROOT) is not valid: {gone} does not exist: "
                           "give the directory where sysfs is mounted")
    assert out == ""


def test_unknown_variables_are_warned_about(capsys: pytest.CaptureFixture[str],
                                            gpu: SimNode) -> None:
    env = {"RDMA_HCA_SYSFS_ROOT": str(gpu.sysfs_root), "RDMA_HCA_DEV_ROOT": str(gpu.dev_root),
           "RDMA_HCA_DEV_ROTO": "/x"}
    code, _, err = run(capsys, ["discover"], env)
    assert code == 0
    assert err.splitlines() == ["rdma-hca discover: warning: unknown environment variable "
                                "RDMA_HCA_DEV_ROTO is ignored; did you mean RDMA_HCA_DEV_ROOT?"]


def test_a_bad_shared_variable_is_a_usage_error(capsys: pytest.CaptureFixture[str],
                                                gpu: SimNode) -> None:
    env = {"RDMA_HCA_SYSFS_ROOT": str(gpu.sysfs_root), "RDMA_HCA_READ_DEADLINE_SECONDS": "x"}
    code, _, err = run(capsys, ["discover"], env)
    assert code == 2
    assert err.startswith("rdma-hca discover: readDeadlineSeconds: 'x' (from environment "
                          "variable RDMA_HCA_READ_DEADLINE_SECONDS)")


# --- roots ---------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--sysfs-root", "--dev-root"])
def test_nonexistent_root(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                          flag: str) -> None:
    code, out, err = run(capsys, ["discover", flag, str(tmp_path / "nope")])
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert f"(from flag {flag}) is not valid: {tmp_path / 'nope'} does not exist" in err


def test_root_that_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    code, _, err = run(capsys, ["discover", "--sysfs-root", str(tmp_path / "f")])
    assert code == 2 and "is not a directory" in err


def test_sysfs_root_one_level_too_high(capsys: pytest.CaptureFixture[str],
                                       gpu: SimNode) -> None:
    above = gpu.sysfs_root.parent
    code, _, err = run(capsys, ["discover", "--sysfs-root", str(above),
                                "--dev-root", str(gpu.dev_root)])
    assert code == 2
    assert err.strip().endswith(f"did you mean {gpu.sysfs_root}?")


def test_dev_root_one_level_too_high(capsys: pytest.CaptureFixture[str],
                                     gpu: SimNode) -> None:
    code, _, err = run(capsys, ["discover", "--sysfs-root", str(gpu.sysfs_root),
                                "--dev-root", str(gpu.dev_root.parent)])
    assert code == 2
    assert err.strip().endswith(f"did you mean {gpu.dev_root}?")


def test_a_root_without_infiniband_is_a_node_without_rdma(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "sys"
    empty.mkdir()
    code, out, err = run(capsys, ["discover", "--sysfs-root", str(empty),
                                  "--dev-root", str(tmp_path)])
    assert code == 0, err
    assert "0 found" in out


def test_serve_refuses_a_root_one_level_too_high(capsys: pytest.CaptureFixture[str],
                                                 gpu: SimNode) -> None:
    code, _, err = run(capsys, ["serve", "--sysfs-root", str(gpu.sysfs_root.parent)])
    assert code == 2
    assert err.startswith("rdma-hca serve: config error: sysfsRoot:")
    assert f"did you mean {gpu.sysfs_root}?" in err


@pytest.mark.parametrize("layer", ["flag", "variable"])
def test_serve_refuses_a_kubelet_root_that_is_a_file_at_once(
        capsys: pytest.CaptureFixture[str], gpu: SimNode, tmp_path: Path,
        layer: str) -> None:
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0\n")
    argv = ["serve", "--sysfs-root", str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root)]
    env = {}
    if layer == "flag":
        argv += ["--kubelet-root", str(a_file)]
    else:
        env["RDMA_HCA_KUBELET_ROOT"] = str(a_file)
    code, _, err = run(capsys, argv, env)
    assert code == 2
    where = "flag --kubelet-root" if layer == "flag" else "environment variable " \
        "RDMA_HCA_KUBELET_ROOT"
    assert err == (f"rdma-hca serve: config error: kubeletRoot: '{a_file}' (from {where}) is "
                   f"not valid: {a_file} is not a directory: give the kubelet's root "
                   "directory, e.g. /var/lib/kubelet\n")


def test_serve_names_the_config_variable_it_could_not_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, ["serve"], {"RDMA_HCA_CONFIG": str(tmp_path / "nope.yaml")})
    assert code == 2
    assert err.startswith(f"rdma-hca serve: config error: RDMA_HCA_CONFIG: "
                          f"'{tmp_path / 'nope.yaml'}' is not valid: the file cannot be read")


# --- serve's warnings go through the log format --------------------------------------------


def test_serve_logs_warnings_before_serving(capsys: pytest.CaptureFixture[str],
                                            gpu: SimNode,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Settings] = []

    def fake_serve(settings: Settings) -> int:
        served.append(settings)
        return 0

    monkeypatch.setattr(cli, "_command", lambda *_: fake_serve)
    root = logging.getLogger()
    # serve sets up logging on the root logger; give it back as it was after the test.
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    argv = ["serve", "--sysfs-root", str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root),
            "--log-format", "json"]
    code = cli.main(argv, env={"RDMA_HCA_MODEE": "exclusive"})
    err = capsys.readouterr().err
    assert code == 0 and len(served) == 1
    line = json.loads(err.strip().splitlines()[-1])
    assert line["level"] == "warning"
    assert "RDMA_HCA_MODEE is ignored; did you mean RDMA_HCA_MODE?" in line["message"]


def test_serve_starts_with_the_collector_off_and_main_gives_it_back(
        gpu: SimNode, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    seen: list[bool] = []

    def fake_serve(settings: Settings) -> int:
        seen.append(gc.isenabled())
        return 0

    monkeypatch.setattr(cli, "_command", lambda *_: fake_serve)
    assert gc.isenabled()
    argv = ["serve", "--sysfs-root", str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root)]
    assert cli.main(argv, env={}) == 0
    assert seen == [False]  # daemon.main turns it on once started (test_supervise)
    assert gc.isenabled()
    # Another command runs with the collector as it was.
    assert cli.main(["discover", "--sysfs-root", str(gpu.sysfs_root), "--dev-root",
                     str(gpu.dev_root), "--json"], env={}) == 0
    assert gc.isenabled()


# --- a closed pipe ----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["discover"], ["discover", "--json"], ["doctor", "--node"]])
def test_closed_stdout_exits_quietly(gpu: SimNode, argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: `| head` at its end
    try:
        result = subprocess.run(
            [sys.executable, "-m", "rdma_hca.cli", *argv, "--sysfs-root",
             str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141


# --- simulate -----------------------------------------------------------------------------------


def test_simulate_into_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, ["simulate", str(tmp_path / "f")])
    assert code == 2
    assert err.strip() == f"rdma-hca simulate: {tmp_path / 'f'} is a file: give a new or " \
                          "empty directory"


def test_simulate_under_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    code, _, err = run(capsys, ["simulate", str(tmp_path / "f" / "a" / "b")])
    assert code == 2
    assert f"{tmp_path / 'f'} is a file, not a directory" in err


def test_simulate_into_an_impossible_path(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, ["simulate", "/proc/rdma-hca-cannot-be-here"])
    assert code == 2
    assert err.count("\n") == 1 and "cannot be written" in err


def test_simulate_into_a_new_directory(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    code, out, err = run(capsys, ["simulate", "--kind", "no-rdma", str(tmp_path / "a" / "b")])
    assert code == 0, err
    assert out.startswith(f"--sysfs-root {tmp_path / 'a' / 'b'}")
    assert not list((tmp_path / "a" / "b").glob(".rdma-hca-*"))


def test_serve_uses_the_environment_given_to_main(capsys: pytest.CaptureFixture[str],
                                                  gpu: SimNode,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Settings] = []
    monkeypatch.setattr(cli, "_command", lambda *_: lambda s: served.append(s) or 0)
    monkeypatch.setenv("RDMA_HCA_MODE", "sideways")  # the process's own, not the one given
    argv = ["serve", "--sysfs-root", str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root)]
    assert cli.main(argv, env={}) == 0
    assert str(served[0].pools[0].mode) == "shared"
    code, _, err = run(capsys, argv, {"RDMA_HCA_MODE": "sideways"})
    assert code == 2 and "RDMA_HCA_MODE" in err


# --- usage errors name the subcommand and the likely flag ----------------------------------


@pytest.mark.parametrize(("argv", "usage", "hint"), [
    (["discover", "--jsn"], "usage: rdma-hca discover", "did you mean --json?"),
    (["serve", "--metrics-adress", ":1"], "usage: rdma-hca serve",
     "did you mean --metrics-address?"),
    (["doctor", "--node", "--kubelet-rot=/x"], "usage: rdma-hca doctor",
     "did you mean --kubelet-root?"),
    (["check", "--proc-rot", "/proc"], "usage: rdma-hca check", "did you mean --proc-root?"),
    (["config", "from-msdp", "f.json", "--valeus"], "usage: rdma-hca config from-msdp",
     "did you mean --values?"),
])
def test_an_unknown_flag_shows_the_subcommands_usage_and_the_closest_flag(
        capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, hint: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv, env={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    last = err.strip().splitlines()[-1]
    prog = usage.removeprefix("usage: ")
    assert last.startswith(f"{prog}: error: unrecognized arguments: ")
    assert last.endswith(hint)


def test_an_unknown_word_without_a_likely_flag_names_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["discover", "--zzzzzz"], env={})
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "rdma-hca discover: error: unrecognized arguments: --zzzzzz"


@pytest.mark.parametrize("url", ["notaurl", "ftp://x/readyz", "http:///readyz",
                                 "http://127.0.0.1:99999/readyz"])
def test_doctor_readyz_url_that_is_no_url_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], url: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["doctor", "--node", "--readyz-url", url], env={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: rdma-hca doctor")
    assert f"argument --readyz-url: {url!r} is not an http:// or https:// URL with a host" in err


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_check_proc_root_that_cannot_be_used_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    path = tmp_path / "proc"
    if kind == "file":
        path.write_text("")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--proc-root", str(path)], env={})
    assert exit_.value.code == 2
    why = "does not exist" if kind == "missing" else "is not a directory"
    assert (f"argument --proc-root: {path} {why}: give the directory where procfs is mounted"
            in capsys.readouterr().err)


def test_doctor_node_takes_the_kubelet_root(capsys: pytest.CaptureFixture[str],
                                            gpu: SimNode, tmp_path: Path) -> None:
    (tmp_path / "kubelet" / "device-plugins").mkdir(parents=True)
    code, out, _ = run(capsys, ["doctor", "--node", "--json", "--sysfs-root", str(gpu.sysfs_root),
                                "--dev-root", str(gpu.dev_root),
                                "--kubelet-root", str(tmp_path / "kubelet"),
                                "--readyz-url", "http://127.0.0.1:1/readyz"])
    kubelet = next(c for c in json.loads(out)["checks"] if c["name"] == "kubelet socket")
    assert str(tmp_path / "kubelet" / "device-plugins" / "kubelet.sock") in kubelet["detail"]
    assert code == 1
    (tmp_path / "a-file").write_text("")
    code, out, err = run(capsys, ["doctor", "--node", "--sysfs-root", str(gpu.sysfs_root),
                                  "--dev-root", str(gpu.dev_root),
                                  "--kubelet-root", str(tmp_path / "a-file")])
    assert code == 2 and out == ""
    a_file = tmp_path / "a-file"
    assert err.strip() == (f"rdma-hca doctor: kubeletRoot: '{a_file}' (from flag --kubelet-root) "
                           f"is not valid: {a_file} is not a directory: give the kubelet's root "
                           "directory, e.g. /var/lib/kubelet")


@pytest.mark.parametrize(("command", "sig", "status"), [
    ("serve", "SIGINT", 130), ("serve", "SIGTERM", 0),
    ("discover", "SIGINT", 130), ("discover", "SIGTERM", 143),
])
def test_one_status_per_signal_as_documented(command: str, sig: str, status: int) -> None:
    import signal

    assert cli.stop_status(command, signal.Signals[sig]) == status
    table = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    assert f"| {status} |" in table or status == 0


def test_serve_refuses_a_device_plugins_directory_that_is_a_file(
        capsys: pytest.CaptureFixture[str], gpu: SimNode, tmp_path: Path) -> None:
    (tmp_path / "device-plugins").write_text("")
    code, _, err = run(capsys, ["serve", "--sysfs-root", str(gpu.sysfs_root), "--dev-root",
                                str(gpu.dev_root), "--kubelet-root", str(tmp_path)])
    assert code == 2
    assert err == (f"rdma-hca serve: config error: kubeletDir: '{tmp_path}/device-plugins' "
                   "(from <kubeletRoot>/device-plugins, kubeletRoot from flag --kubelet-root) "
                   f"is not valid: {tmp_path}/device-plugins is not a directory: give the "
                   "kubelet's device-plugins directory, e.g. /var/lib/kubelet/device-plugins\n")


# --- one roots check, naming the layer load_settings recorded --------------------------------


def _fake_serve(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    served: list[Settings] = []
    monkeypatch.setattr(cli, "_command", lambda *_: lambda s: served.append(s) or 0)
    return served


def _given(key: str, value: str, layer: str) -> tuple[list[str], dict[str, str]]:
    s = BY_KEY[key]
    assert s.flag is not None
    return ([s.flag, value], {}) if layer == "flag" else ([], {s.env[0]: value})


def _layer_name(key: str, layer: str) -> str:
    s = BY_KEY[key]
    return f"flag {s.flag}" if layer == "flag" else f"environment variable {s.env[0]}"


def _prefix(command: list[str]) -> str:
    return "rdma-hca serve: config error: " if command == ["serve"] else \
        f"rdma-hca {command[0]}: "


@pytest.mark.parametrize("command", [["serve"], ["discover"], ["doctor", "--node"], ["check"]],
                         ids=" ".join)
@pytest.mark.parametrize("layer", ["flag", "variable"])
@pytest.mark.parametrize(("key", "kind"), [("sysfsRoot", "sysfs"), ("devRoot", "dev")])
def test_a_missing_root_names_the_layer_that_gave_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gpu: SimNode,
        tmp_path: Path, command: list[str], layer: str, key: str, kind: str) -> None:
    served = _fake_serve(monkeypatch)
    good = {"sysfsRoot": str(gpu.sysfs_root), "devRoot": str(gpu.dev_root)}
    bad = str(tmp_path / "gone")
    argv, env = _given(key, bad, layer)
    other = "devRoot" if key == "sysfsRoot" else "sysfsRoot"
    code, out, err = run(capsys, [*command, *argv, BY_KEY[other].flag or "", good[other]], env)
    assert (code, out, served) == (2, "", [])
    assert err == (f"{_prefix(command)}{key}: '{bad}' (from {_layer_name(key, layer)}) is not "
                   f"valid: {bad} does not exist: give the directory where {kind} is mounted\n")


@pytest.mark.parametrize("command", [["serve"], ["doctor", "--node"]], ids=" ".join)
@pytest.mark.parametrize("layer", ["flag", "variable"])
@pytest.mark.parametrize("key", ["kubeletRoot", "kubeletDir", "derived kubeletDir"])
def test_a_kubelet_directory_that_is_a_file_names_the_layer_that_gave_it(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, gpu: SimNode,
        tmp_path: Path, command: list[str], layer: str, key: str) -> None:
    served = _fake_serve(monkeypatch)
    machine = ["--sysfs-root", str(gpu.sysfs_root), "--dev-root", str(gpu.dev_root)]
    a_file = tmp_path / "device-plugins"
    a_file.write_text("")
    if key == "derived kubeletDir":  # <kubeletRoot>/device-plugins, from kubeletRoot's layer
        argv, env = _given("kubeletRoot", str(tmp_path), layer)
        where = ("<kubeletRoot>/device-plugins, kubeletRoot from "
                 + _layer_name("kubeletRoot", layer))
        key = "kubeletDir"
    else:
        argv, env = _given(key, str(a_file), layer)
        where = _layer_name(key, layer)
    what = "root" if key == "kubeletRoot" else "device-plugins"
    example = "/var/lib/kubelet" + ("/device-plugins" if what != "root" else "")
    code, out, err = run(capsys, [*command, *machine, *argv], env)
    assert (code, out, served) == (2, "", [])
    assert err == (f"{_prefix(command)}{key}: '{a_file}' (from {where}) is not valid: {a_file} "
                   f"is not a directory: give the kubelet's {what} directory, e.g. {example}\n")


def test_a_root_in_the_config_file_names_the_file(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    served = _fake_serve(monkeypatch)
    config = tmp_path / "config.yaml"
    config.write_text(f"sysfsRoot: {tmp_path}\n")
    code, _, err = run(capsys, ["serve", "--config", str(config)])
    assert (code, served) == (2, [])
    assert err.startswith(f"rdma-hca serve: config error: sysfsRoot: '{tmp_path}' (from config "
                          f"file {config}) is not valid: set by flag or variable only")
    assert err.count("\n") == 1
