"""``rdma-hca probe healthz|readyz``: ask the daemon of this pod, and only it, how it is.

The chart's exec probes run ``python -m rdma_hca.tools.probe readyz`` (what ``rdma-hca
probe`` does, without loading the CLI): every few seconds on every node, in the pod's CPU
request, so what the probe imports is what it costs. The chart's command line (one
endpoint) is read without argparse, which with what it loads would double the probe's
start-up; any other command line goes to argparse. Nothing else is imported beyond what
the interpreter has loaded already (tests/daemon/observe/test_probe_cost.py holds it to
that). Exit 0 when the daemon answers 200, 1 when it answers otherwise or not at all
(its answer or why, in one line), 2 when this is not a pod of the plugin (no POD_UID).
"""

from __future__ import annotations

import os
import sys

from rdma_hca.kit.exitcodes import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from rdma_hca.kit.probe import ProbeError, ask, default_dir, probe_socket_path

# Not typing.TYPE_CHECKING: importing typing would cost the probe what it saves.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping, Sequence

ENDPOINTS = ("healthz", "readyz")
DEFAULT_TIMEOUT = 2.0  # below the chart's timeoutSeconds (3): the probe says why itself


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("endpoint", choices=ENDPOINTS,
                   help="healthz: alive (liveness); readyz: serving (readiness)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"how long to wait for the answer (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--dir", default=None, metavar="DIR",
                   help="where the daemon's probe socket is (default: $TMPDIR, else /tmp, "
                        "as for the daemon)")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "probe", help="ask this pod's daemon whether it is alive or ready (exec probes)",
        description="Ask the daemon of this pod (its probe socket, named after POD_UID) "
        "for /healthz or /readyz. Exit 0 when it answers 200, 1 otherwise, 2 without "
        "POD_UID.")
    _arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    given = getattr(args, "environ", None)  # what the CLI read, when it runs this
    env = given if given is not None else os.environ if env is None else env
    return check(args.endpoint, env, directory=args.dir, timeout=args.timeout)


def check(endpoint: str, env: Mapping[str, str], *, directory: str | None = None,
          timeout: float = DEFAULT_TIMEOUT) -> int:
    """Ask this pod's daemon for ``endpoint`` (healthz or readyz): the exit status."""
    pod_uid = env.get("POD_UID", "")
    if not pod_uid:
        print("rdma-hca probe: POD_UID is not set: the probe socket is named after the "
              "plugin pod's UID; run it in that pod (kubectl exec <pod> -- rdma-hca probe "
              "readyz)", file=sys.stderr)
        return EXIT_USAGE
    path = probe_socket_path(directory or default_dir(env), pod_uid)
    try:
        status, body = ask(path, "/" + endpoint, timeout)
    except ProbeError as exc:
        print(f"rdma-hca probe {endpoint}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    # The kubelet shows a failed probe's output in the pod's events: one line.
    line = " ".join(body.split())
    print(line, file=sys.stdout if status == 200 else sys.stderr)
    return EXIT_OK if status == 200 else EXIT_FAIL


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) == 1 and args[0] in ENDPOINTS:  # the chart's probes
        return check(args[0], os.environ)
    import argparse

    p = argparse.ArgumentParser(prog="rdma-hca probe", description=__doc__)
    _arguments(p)
    return run(p.parse_args(args))


if __name__ == "__main__":
    raise SystemExit(main())
