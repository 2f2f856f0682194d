"""``rdma-hca config``: work with rdma-hca's config file.

``config from-msdp FILE [--values]`` prints the config (or the chart's Helm values) that
offers what the Mellanox k8s-rdma-shared-dev-plugin's config FILE offers (``rdma-hca.tools.msdp``).
"""

from __future__ import annotations

import argparse
import sys

from rdma_hca.kit.exitcodes import EXIT_OK
from rdma_hca.tools import msdp


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("config", help="convert another plugin's config to rdma-hca's",
                              description="Work with rdma-hca's config file.")
    sub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    m = sub.add_parser(
        "from-msdp", help="from the Mellanox k8s-rdma-shared-dev-plugin's config",
        description="Print the rdma-hca config that offers what the Mellanox "
        "k8s-rdma-shared-dev-plugin config FILE offers (its config.json, the ConfigMap "
        "holding it, or the NVIDIA Network Operator's NicClusterPolicy): each resource "
        "under the name the plugin advertised. An unknown or unsupported key is refused "
        "(status 2). docs/migration-from-mellanox.md has the steps to swap the plugins "
        "node by node.")
    m.add_argument("file", metavar="FILE",
                   help="the plugin's config.json, its ConfigMap or a NicClusterPolicy")
    m.add_argument("--values", action="store_true",
                   help="print Helm values of the ack-rdma-device-plugin chart instead")
    m.set_defaults(func=run_from_msdp)


def run_from_msdp(args: argparse.Namespace) -> int:
    converted = msdp.convert(msdp.read(args.file), args.file)
    text = (msdp.values_yaml if args.values else msdp.config_yaml)(converted, args.file)
    sys.stdout.write(text)
    return EXIT_OK
