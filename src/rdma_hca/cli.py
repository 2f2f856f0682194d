"""The ``rdma-hca`` command: wiring only; each subcommand's logic lives in its module."""

from __future__ import annotations

import gc
import os
import signal
import sys
from types import FrameType

# Run as the command (not imported by a test): a SIGINT or SIGTERM that comes while the
# modules below load is remembered, and main() ends with its status and one line instead of
# a KeyboardInterrupt traceback or a silent death.
_AS_COMMAND = __name__ == "__main__" or os.path.basename(sys.argv[0]) in (
    "rdma-hca", "kubectl-rdma_hca")
_pending: list[int] = []


def _remember(signum: int, frame: FrameType | None) -> None:
    _pending.append(signum)


def _first_word(words: Sequence[str]) -> str:
    """The subcommand as typed: the first word that is not a flag (the top level takes no
    values); "" when there is none."""
    return next((w for w in words if not w.startswith("-")), "")


if _AS_COMMAND:
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, _remember)
    # serve starts with the cyclic collector off from here, the modules below included
    # (see main()).
    if _first_word(sys.argv[1:]) == "serve":
        gc.disable()

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable, Mapping, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from rdma_hca import __version__  # noqa: E402
from rdma_hca.kit.exitcodes import (  # noqa: E402
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
)
from rdma_hca.kit.logs import setup_logging  # noqa: E402
from rdma_hca.kit.text import closest  # noqa: E402
from rdma_hca.settings.checks import ROOT_KEYS, check_roots  # noqa: E402
from rdma_hca.settings.config import env_warnings, load_settings  # noqa: E402
from rdma_hca.settings.decl import BY_KEY, add_flags, flag_values  # noqa: E402
from rdma_hca.settings.model import ConfigError, Settings  # noqa: E402

log = logging.getLogger("rdma_hca.settings.config")
COMMANDS = ("serve", "discover", "simulate", "demo", "bench", "doctor", "check", "config",
            "probe")
# The kinds of simulated node `rdma-hca simulate` writes (the devkit builds them).
SIM_KINDS = ("gpu", "gpu-ipv6", "infiniband", "erdma", "soft-roce", "no-rdma")


class MissingCommand(Exception):
    """A subcommand whose wing is not installed (the node image carries no devkit)."""


def _command(name: str, module: str, attr: str) -> Any:
    """Load a subcommand's entry by module name.

    The CLI reaches the daemon and the devkit only through this table of names: the tools
    wing imports neither, and the node image, which ships without the devkit, answers
    ``rdma-hca demo`` with one line instead of an import traceback.
    """
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            raise MissingCommand(
                f"rdma-hca {name}: not in this installation ({module} is missing); "
                "it is part of the development kit: run it from a source checkout "
                "(`make demo`) or `pip install rdma-hca`") from None
        raise
    return getattr(mod, attr)


# Settings the tools share with `serve` (the same flags, variables and defaults).
_MACHINE_KEYS = ("sysfsRoot", "devRoot", "kubeletRoot", "kubeletDir", "readDeadlineSeconds")


def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="YAML config file (docs/configuration.md; env RDMA_HCA_CONFIG)")
    add_flags(p)


def settings_from_args(args: argparse.Namespace,
                       env: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``serve``: its flags over ``RDMA_HCA_*`` over the config file."""
    return load_settings(getattr(args, "config", None), os.environ if env is None else env,
                         flag_values(args))


def machine_settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """The settings a tool shares with ``serve`` (roots, deadline): flags, then variables.

    The config file is not read: where the machine is comes from flags and variables only.
    """
    shared = {v for k in _MACHINE_KEYS for v in BY_KEY[k].env}
    flags = {k: v for k, v in flag_values(args).items() if k in _MACHINE_KEYS}
    return load_settings(None, {k: v for k, v in env.items() if k in shared}, flags)


def _fill_machine_defaults(args: argparse.Namespace, env: Mapping[str, str]) -> Settings | None:
    """Give the tools' root options not set on the command line the value ``serve`` would
    use, so RDMA_HCA_SYSFS_ROOT and friends mean the same for every subcommand.

    Returns the settings they came from (None: the command has none of them), which know
    the layer each value came from.
    """
    dests = ("sysfs_root", "dev_root", "kubelet_dir")
    deadline = "read_deadline_seconds"
    if not hasattr(args, deadline) and not any(getattr(args, d, "") is None for d in dests):
        return None
    machine = machine_settings(args, env)
    if hasattr(args, deadline):
        # Given as text by the flag or the variable; validated like serve's.
        setattr(args, deadline, machine.read_deadline_seconds)
    for dest in dests:
        if hasattr(args, dest) and getattr(args, dest) is None:
            setattr(args, dest, getattr(machine, dest))
    return machine


def _config_error_line(args: argparse.Namespace, env: Mapping[str, str], text: str) -> str:
    message = f"rdma-hca serve: config error: {text}"
    # Logging is not set up yet; honour a JSON log format asked for by flag or
    # environment (the config file itself may be what is broken).
    wanted = getattr(args, "log_format", None) or env.get("RDMA_HCA_LOG_FORMAT", "")
    if wanted.strip().lower() == "json":
        message = json.dumps({"level": "error", "logger": "rdma_hca.settings.config",
                              "message": message})
    return message


def cmd_serve(args: argparse.Namespace) -> int:
    given: Mapping[str, str] | None = getattr(args, "environ", None)
    env = os.environ if given is None else given
    try:
        settings = settings_from_args(args, env)
        check_roots(settings)
    except ConfigError as exc:
        print(_config_error_line(args, env, str(exc)), file=sys.stderr)
        return EXIT_USAGE
    if settings.warnings:
        # The same log format as the daemon's lines that follow.
        setup_logging(settings.log_format.value, settings.log_level)
        for line in settings.warnings:
            log.warning("%s", line)
    serve: Callable[[Settings], int] = _command("serve", "rdma_hca.daemon.main", "serve")
    return serve(settings)


def cmd_discover(args: argparse.Namespace) -> int:
    from rdma_hca.tools import report

    return report.run(args)


def _simulate_dir_problem(directory: str) -> str | None:
    """Why a simulated node cannot be written into ``directory``, or None (it is created)."""
    root = Path(directory)
    if root.exists() and not root.is_dir():
        return f"{root} is a file: give a new or empty directory"
    parent = root.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        return f"{root} cannot be made: {parent} is a file, not a directory"
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".rdma-hca-write-test"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        return (f"{root} cannot be written ({exc.strerror or exc}): give a new or empty "
                "directory you may write to")
    return None


def cmd_simulate(args: argparse.Namespace) -> int:
    why = _simulate_dir_problem(args.dir)
    if why:
        print(f"rdma-hca simulate: {why}", file=sys.stderr)
        return EXIT_USAGE
    simulate: Callable[[str, str], int] = _command(
        "simulate", "rdma_hca.devkit.commands", "simulate")
    try:
        return simulate(args.kind, args.dir)
    except OSError as exc:
        print(f"rdma-hca simulate: cannot write the node into {args.dir}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


def cmd_demo(args: argparse.Namespace) -> int:
    demo: Callable[[bool], int] = _command("demo", "rdma_hca.devkit.commands", "demo")
    return demo(args.verbose)


def cmd_bench(args: argparse.Namespace) -> int:
    bench: Callable[[str, bool], int] = _command("bench", "rdma_hca.devkit.commands", "bench")
    return bench(args.out_dir, args.quick)


def build_parser(serve_only: bool = False) -> argparse.ArgumentParser:
    """The command's parser; ``serve_only``: with the ``serve`` subcommand alone, for a
    command line that names it (the tools' parsers load the tools' modules: about 150 ms
    that a daemon starting would spend before registering)."""
    parser = argparse.ArgumentParser(
        prog="rdma-hca",
        description="Kubernetes device plugin offering the node's RDMA HCAs as rdma/hca.",
    )
    parser.add_argument("--version", action="version", version=f"rdma-hca {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the device plugin until SIGTERM or SIGINT")
    _serve_flags(serve)
    serve.set_defaults(func=cmd_serve)
    if serve_only:
        return parser

    disc = sub.add_parser("discover", help="print the node's RDMA HCAs, ports and device nodes")
    disc.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_flags(disc, [BY_KEY["sysfsRoot"], BY_KEY["devRoot"], BY_KEY["readDeadlineSeconds"]])
    disc.set_defaults(func=cmd_discover)

    simulate = sub.add_parser("simulate", help="write a simulated node's sysfs and /dev trees "
                                               "(to try discover, doctor --node, serve)")
    simulate.add_argument("--kind", default="gpu",
                          choices=SIM_KINDS)
    simulate.add_argument("dir", help="a new or empty directory")
    simulate.set_defaults(func=cmd_simulate)

    demo = sub.add_parser("demo", help="run the plugin on a simulated GPU node with a kubelet "
                                       "emulator")
    demo.add_argument("--verbose", action="store_true", help="also show the daemon's log")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="measure start-up, Allocate, health and discovery")
    bench.add_argument("--out-dir", default=".", metavar="DIR",
                       help="where BENCHMARKS.md and benchmarks.json are written")
    bench.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    bench.set_defaults(func=cmd_bench)

    from rdma_hca.tools import check, config, doctor, probe

    doctor.add_parser(sub)
    check.add_parser(sub)
    config.add_parser(sub)
    probe.add_parser(sub)
    for name, p in sub.choices.items():
        if name != "serve":
            # None means "not given": main fills these from RDMA_HCA_* as serve would.
            p.set_defaults(**{d: None for d in ("sysfs_root", "dev_root", "kubelet_dir")
                              if any(a.dest == d for a in p._actions)})
    return parser


def _quiet_stdout() -> None:
    # Later writes (and the flush at exit) go nowhere instead of raising again.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


class Stopped(BaseException):
    """SIGINT or SIGTERM before ``serve``'s event loop takes them over (or in a tool)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def stop_status(command: str, signum: int) -> int:
    """The documented status of a command stopped by ``signum``: SIGINT is 130 for every
    command; SIGTERM is serve's normal stop (0) and 143 for the others."""
    if signum == signal.SIGINT:
        return EXIT_INTERRUPTED
    return EXIT_OK if command == "serve" else EXIT_TERMINATED


def _stopped(command: str, signum: int) -> int:
    name = signal.Signals(signum).name
    who = "rdma-hca" if command == "rdma-hca" else f"rdma-hca {command}"
    line = (f"{who}: {name} while starting; stopped before serving anything"
            if command == "serve" else f"{who}: stopped by {name}")
    if logging.getLogger().handlers:
        # serve's log is set up: the line goes out in its format.
        logging.getLogger("rdma_hca.daemon").warning("%s", line)
    else:
        print(line, file=sys.stderr)
    return stop_status(command, signum)


def _unknown_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace,
                       extra: Sequence[str]) -> None:
    """Exit 2 with the subcommand's usage and the flag most like an unknown one."""
    target = parser
    while True:  # down to the innermost subcommand given (`config from-msdp`)
        sub = next((a for a in target._actions if isinstance(a, argparse._SubParsersAction)),
                   None)
        chosen = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or chosen not in sub.choices:
            break
        target = sub.choices[chosen]
    flags = [f for f in target._option_string_actions if f.startswith("--")]
    message = "unrecognized arguments: " + " ".join(extra)
    for word in extra:
        if word.startswith("-"):
            hint = closest(word.partition("=")[0], flags)
            if hint:
                message += f"; did you mean {hint}?"
                break
    target.error(message)


def main(argv: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """``rdma-hca ARGV...``; the exit status (docs/configuration.md lists them)."""
    # Named before anything else: a signal may come while the parser is still being built.
    words = list(sys.argv[1:] if argv is None else argv)
    command = [_first_word(words)]
    if command[0] not in COMMANDS:
        command[0] = "rdma-hca"
    # serve's start makes tens of thousands of objects that live as long as the process and
    # next to no garbage (some 600 objects before it registers): the collector's passes over
    # them while its modules load and it starts (60 to 80 of them, 10-20 ms) find next to
    # nothing. It is off until the daemon has started (daemon.main turns it on again as it
    # settles its heap), and as it was when main returns.
    collecting = gc.isenabled()
    if command[0] == "serve":
        gc.disable()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # Inside the try: the handler may fire the moment it is installed.
        for signum in previous:
            signal.signal(signum, _raise_stopped)
        return _main(argv, env, command)
    except Stopped as exc:
        return _stopped(command[0], exc.signum)
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(signum, handler)
        if collecting and not gc.isenabled():
            gc.enable()


def _main(argv: Sequence[str] | None, env: Mapping[str, str] | None,
          named: list[str]) -> int:
    env = os.environ if env is None else env
    # The subcommand is the first word that is not a flag (the top level takes no values).
    parser = build_parser(serve_only=named[0] == "serve")
    # argparse's own output (--help, usage errors) already ignores a closed pipe.
    args, extra = parser.parse_known_args(argv)
    if extra:
        _unknown_arguments(parser, args, extra)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    command = args.command
    named[0] = command
    if _pending:
        raise Stopped(_pending[0])
    args.environ = env  # what cmd_serve reads, so main(env=...) means the same everywhere
    try:
        if command != "serve":
            for line in env_warnings(env):
                print(f"rdma-hca {command}: warning: {line}", file=sys.stderr)
            machine = _fill_machine_defaults(args, env)
            if machine is not None and (command in ("discover", "check")
                                        or getattr(args, "node", False)):
                # The roots this command reads; a ConfigError names the layer.
                check_roots(machine, [k for k in ROOT_KEYS if hasattr(args, BY_KEY[k].dest)])
        result: int = args.func(args)
        sys.stdout.flush()
    except ConfigError as exc:
        print(f"rdma-hca {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except MissingCommand as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `rdma-hca discover | head`: the reader has what it wanted.
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        # Where SIGINT could not be taken over (main() called off the main thread).
        return _stopped(command, signal.SIGINT)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
