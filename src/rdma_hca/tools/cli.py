"""The ``rdma-hca`` command: wiring only; each subcommand's logic lives in its module."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rdma_hca import __version__
from rdma_hca.daemon.config import ConfigError, Settings, load_settings

EXIT_USAGE = 2
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


def _serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config file (docs/configuration.md)")
    p.add_argument("--sysfs-root", metavar="DIR", help="where sysfs is mounted (default /sys)")
    p.add_argument("--dev-root", metavar="DIR", help="where /dev is mounted (default /dev)")
    p.add_argument("--kubelet-dir", metavar="DIR",
                   help="the kubelet's device-plugins directory "
                        "(default /var/lib/kubelet/device-plugins)")
    p.add_argument("--resource-name", help="extended resource name (default rdma/hca)")
    p.add_argument("--rdma-hca-max", help="device IDs in shared mode, 1-100000 (default 1000)")
    p.add_argument("--mode", help="shared (default) or exclusive")
    p.add_argument("--unhealthy-when", help="any (default) or all")
    p.add_argument("--non-host-network", action=argparse.BooleanOptionalAction, default=None,
                   help="allow RDMA for non-hostNetwork pods (needs an IPv6 compute network)")
    p.add_argument("--nccl-env", action=argparse.BooleanOptionalAction, default=None,
                   help="set NCCL_IB_HCA to the allocated HCAs")
    p.add_argument("--health-poll-seconds", help="port poll interval, seconds (default 0.5)")
    p.add_argument("--resend-seconds", help="re-send the device list this often (default 30)")
    p.add_argument("--metrics-address", help="HOST:PORT for /metrics, /healthz, /readyz "
                                             "(default :9478; empty disables)")
    p.add_argument("--log-format", help="text (default) or json")
    p.add_argument("--log-level", help="debug, info (default), warning, error")
    p.add_argument("--cdi", action=argparse.BooleanOptionalAction, default=None,
                   help="return CDI device names from Allocate")
    p.add_argument("--cdi-spec-dir", help="where the CDI spec is written (default /var/run/cdi)")


_FLAG_KEYS = {
    "sysfs_root": "sysfsRoot", "dev_root": "devRoot", "kubelet_dir": "kubeletDir",
    "resource_name": "resourceName", "rdma_hca_max": "rdmaHcaMax", "mode": "mode",
    "unhealthy_when": "unhealthyWhen", "non_host_network": "nonHostNetwork",
    "nccl_env": "ncclEnv", "health_poll_seconds": "healthPollSeconds",
    "resend_seconds": "resendSeconds", "metrics_address": "metricsAddress",
    "log_format": "logFormat", "log_level": "logLevel", "cdi": "cdi.enabled",
    "cdi_spec_dir": "cdi.specDir",
}


def settings_from_args(args: argparse.Namespace,
                       env: Mapping[str, str] | None = None) -> Settings:
    flags = {key: getattr(args, attr, None) for attr, key in _FLAG_KEYS.items()}
    return load_settings(getattr(args, "config", None), os.environ if env is None else env, flags)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        message = f"rdma-hca serve: config error: {exc}"
        # Logging is not set up yet; honour a JSON log format asked for by flag or
        # environment (the config file itself may be what is broken).
        wanted = args.log_format or os.environ.get("RDMA_HCA_LOG_FORMAT", "")
        if wanted.strip().lower() == "json":
            message = json.dumps({"level": "error", "logger": "rdma_hca.daemon.config",
                                  "message": message})
        print(message, file=sys.stderr)
        return EXIT_USAGE
    serve: Callable[[Settings], int] = _command("serve", "rdma_hca.daemon.main", "serve")
    return serve(settings)


def cmd_discover(args: argparse.Namespace) -> int:
    from rdma_hca.tools import report

    return report.run(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    simulate: Callable[[str, str], int] = _command(
        "simulate", "rdma_hca.devkit.commands", "simulate")
    return simulate(args.kind, args.dir)


def cmd_demo(args: argparse.Namespace) -> int:
    demo: Callable[[bool], int] = _command("demo", "rdma_hca.devkit.commands", "demo")
    return demo(args.verbose)


def cmd_bench(args: argparse.Namespace) -> int:
    bench: Callable[[str, bool], int] = _command("bench", "rdma_hca.devkit.commands", "bench")
    return bench(args.out_dir, args.quick)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rdma-hca",
        description="Kubernetes device plugin offering the node's RDMA HCAs as rdma/hca.",
    )
    parser.add_argument("--version", action="version", version=f"rdma-hca {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the device plugin until SIGTERM or SIGINT")
    _serve_flags(serve)
    serve.set_defaults(func=cmd_serve)

    disc = sub.add_parser("discover", help="print the node's RDMA HCAs, ports and device nodes")
    disc.add_argument("--json", action="store_true", help="print JSON instead of tables")
    disc.add_argument("--sysfs-root", default="/sys", metavar="DIR")
    disc.add_argument("--dev-root", default="/dev", metavar="DIR")
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

    from rdma_hca.tools import check, doctor

    doctor.add_parser(sub)
    check.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        result: int = args.func(args)
    except MissingCommand as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    return result


if __name__ == "__main__":
    raise SystemExit(main())
