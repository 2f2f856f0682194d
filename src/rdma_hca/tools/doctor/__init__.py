"""``rdma-hca doctor``: say what is wrong with RDMA in a cluster or on a node, and how to fix it.

Without ``--node`` (or with ``--cluster``) it asks the API server about the DaemonSet, its
pods, every node's ``rdma/hca`` count, the DRA driver's ResourceSlices and the fabric the
daemons heard by LLDP, with any kubeconfig kubectl accepts (also as ``kubectl rdma-hca
doctor``); with ``--node`` it inspects the local machine (HCAs,
device nodes, kubelet sockets, netns mode, IPv6 GIDs, the plugin's readiness).

Exit status: 0 when every check passes, 1 when one fails, 2 when the command cannot run
(bad flags, no or broken kubeconfig, credentials refused, API server unreachable).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pwd
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from rdma_hca.kit.exitcodes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from rdma_hca.kit.names import is_dns_subdomain, resource_name_problem
from rdma_hca.kube.credentials import load_credentials
from rdma_hca.kube.errors import KubeconfigError, KubeError, UnreachableError
from rdma_hca.settings.decl import BY_KEY, add_flags
from rdma_hca.tools.arguments import http_url
from rdma_hca.tools.doctor import cluster, clusterfetch, kubeapi, render, slices
from rdma_hca.tools.doctor.result import DEFAULT_READYZ_URL, parse_command


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``doctor`` subcommand; its ``func`` returns the exit status."""
    p = subparsers.add_parser(
        "doctor",
        help="find out why RDMA does not work, cluster-wide or (--node) on this node",
        description="Say what is wrong with RDMA in the cluster (default) or on this node "
        "(--node), and how to fix it. Exit 0: all checks pass; 1: a check fails; "
        "2: the command cannot run (flags, kubeconfig, credentials, API server).",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    cl = p.add_argument_group("cluster view")
    cl.add_argument("--cluster", action="store_true",
                    help="check the cluster (the default without --node): the DaemonSet, "
                    "every node, the DRA driver's slices and the fabric's cables")
    cl.add_argument(kubeapi.KUBECONFIG_FLAG, dest="kubeconfig",
                    help=f"kubeconfig file (default: {kubeapi.CREDENTIALS.fallbacks()})")
    cl.add_argument(kubeapi.CONTEXT_FLAG, dest="context",
                    help="kubeconfig context (default: current-context)")
    cl.add_argument("--namespace", default="kube-system", help="namespace of the DaemonSet")
    cl.add_argument("--name", default="ack-rdma-dp-ds", help="name of the DaemonSet")
    cl.add_argument("--resource", default="rdma/hca", help="extended resource name to check")
    cl.add_argument("--dra-driver", default=slices.DEFAULT_DRIVER, metavar="NAME",
                    help="DRA driver whose ResourceSlices to check (default: %(default)s)")
    cl.add_argument("--timeout", type=float, default=kubeapi.DEFAULT_TIMEOUT,
                    help="seconds to wait for each API request")
    nd = p.add_argument_group("node view")
    nd.add_argument("--node", action="store_true", help="check this node instead of the cluster")
    nd.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted")
    nd.add_argument("--dev-root", default="/dev", help="where device nodes live")
    add_flags(nd, [BY_KEY["readDeadlineSeconds"]])
    add_flags(nd, [BY_KEY["kubeletRoot"]])
    nd.add_argument("--kubelet-dir", default="/var/lib/kubelet/device-plugins",
                    help="the kubelet's device-plugins directory (default "
                    "<kubelet root>/device-plugins)")
    nd.add_argument("--plugins-dir",
                    help="the kubelet's plugins directory, where the DRA driver (--dra-driver) "
                    "keeps its checkpoint: who holds how much of each HCA (default "
                    "<kubelet root>/plugins, the root from RDMA_HCA_KUBELET_ROOT as for "
                    "serve, else /var/lib/kubelet)")
    nd.add_argument("--config", help="the plugin's YAML config (read for nonHostNetwork)")
    nd.add_argument("--non-host-network", action="store_true", default=None,
                    help="RDMA for non-hostNetwork pods is on (needs IPv6 GIDs)")
    add_flags(nd, [BY_KEY["devicePlugin.enabled"]])
    nd.add_argument("--readyz-url", type=http_url,
                    help="the plugin's readiness URL (200 = registered with the kubelet; "
                    "default: in the plugin's pod (POD_UID set) its own probe socket, "
                    f"else {DEFAULT_READYZ_URL})")
    p.set_defaults(func=run)


def run(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    in_cluster_root: Path = Path("/"),
    now: dt.datetime | None = None,
    out: TextIO | None = None,
) -> int:
    """Run the view the flags ask for; the keyword arguments exist so tests can pin the
    environment, the home directory, the service-account root and the clock.

    Run by the CLI, the environment is the one ``cli.main`` was given (``args.environ``):
    credentials, the kubeconfig's home and the node view's settings all come from it."""
    stream = out if out is not None else sys.stdout
    given: Mapping[str, str] | None = getattr(args, "environ", None)
    environ = env if env is not None else given if given is not None else os.environ
    if args.node and getattr(args, "cluster", False):
        return _fail(stream, args.json, EXIT_USAGE,
                     "--cluster and --node ask for two different views: give one of them")
    if args.node:
        # Imported here: the node view needs discovery and config, the cluster view neither.
        from rdma_hca.tools.doctor import node

        return node.run(args, out=stream, env=environ)
    return run_cluster(
        args,
        env=environ,
        home=_home(environ) if home is None else home,
        in_cluster_root=in_cluster_root,
        now=now or dt.datetime.now(dt.UTC),
        out=stream,
    )


def _home(env: Mapping[str, str]) -> Path:
    """``~`` as kubectl finds it: ``$HOME`` of the given environment, else the account's."""
    home = env.get("HOME")
    if home:
        return Path(home)
    try:
        # Not Path.home(): it reads the process's $HOME, which the given environment replaces.
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid without a passwd entry (a container's arbitrary user)
        return Path.home()


def run_cluster(
    args: argparse.Namespace,
    *,
    env: Mapping[str, str],
    home: Path,
    in_cluster_root: Path,
    now: dt.datetime,
    out: TextIO,
) -> int:
    why = resource_name_problem(args.resource)
    if why:
        return _fail(out, args.json, EXIT_USAGE,
                     f"--resource {args.resource!r} is not an extended resource name: {why}")
    if not is_dns_subdomain(args.dra_driver):
        return _fail(out, args.json, EXIT_USAGE,
                     f"--dra-driver {args.dra_driver!r} is not a DRA driver name: it must be a "
                     "lower-case DNS subdomain such as rdma-hca.io")
    if not args.timeout > 0:
        return _fail(out, args.json, EXIT_USAGE, f"--timeout must be above 0, not {args.timeout}")
    try:
        creds = load_credentials(
            kubeconfig=args.kubeconfig, context=args.context, env=env, home=home,
            in_cluster_root=in_cluster_root, accepts=kubeapi.CREDENTIALS,
        )
        client = kubeapi.KubeClient(creds, timeout=args.timeout)
        try:
            data = clusterfetch.fetch(client, args.namespace, args.name, args.dra_driver)
        finally:
            client.close()
    except (KubeconfigError, UnreachableError, clusterfetch.AccessError) as exc:
        return _fail(out, args.json, EXIT_USAGE, str(exc))
    except KubeError as exc:
        return _fail(out, args.json, EXIT_FAIL, str(exc))
    report = cluster.evaluate(data, args.resource, now)
    if args.json:
        out.write(json.dumps(render.cluster_json(report), indent=2, ensure_ascii=False) + "\n")
    else:
        out.write(render.cluster_text(report))
    return EXIT_OK if report.ok else EXIT_FAIL


def _fail(out: TextIO, as_json: bool, status: int, message: str) -> int:
    """One line that says what is wrong; JSON callers get it as ``error``."""
    if as_json:
        doc: dict[str, Any] = {"ok": False, "error": message, "checks": []}
        out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        print(f"rdma-hca doctor: {message}", file=sys.stderr)
    return status


def main(
    argv: list[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    in_cluster_root: Path = Path("/"),
    now: dt.datetime | None = None,
) -> int:
    """``rdma-hca doctor ARGV...`` as a function: returns the exit status, never raises
    ``SystemExit`` (argparse's usage errors come back as 2)."""
    args = parse_command("doctor", add_parser, argv)
    if isinstance(args, int):
        return args
    return run(args, env=env, home=home, in_cluster_root=in_cluster_root, now=now)
