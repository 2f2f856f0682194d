"""The node view of ``rdma-hca doctor --node``: what this machine offers and what blocks it.

Run on a node or inside the plugin pod (which mounts the host's /sys, /dev and the kubelet's
device-plugins directory). Discovery is the daemon's own, bounded by a read deadline
(`node.deadline_reader.discover_bounded`), so the doctor sees exactly what the plugin sees and
ends even when a sysfs file never answers: such files are named in a failed check.
In the daemon's pod (``NODE_NAME``) it also reads its own Node and shows each RoCE port's
LLDP neighbour as the daemon published it (``nodefabric.py``).

Exit status: 0 when every check passes, 1 when one fails (a file that did not answer is
a failed check), 2 on a bad config or when discovery could not run (a resource ran out).
Output is valid UTF-8 whatever bytes sysfs holds; JSON holds no NaN or Infinity.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from rdma_hca.kit.probe import ProbeError, ask, default_dir, probe_socket_path
from rdma_hca.node.deadline_reader import DEFAULT_DEADLINE, discover_bounded
from rdma_hca.node.file_reads import DiscoveryFailed
from rdma_hca.node.model import Hca, LinkLayer, NodeInventory
from rdma_hca.node.roce import ipv6_missing
from rdma_hca.settings.config import load_settings
from rdma_hca.settings.model import ConfigError, Settings
from rdma_hca.tools.deadline import read_deadline
from rdma_hca.tools.doctor.kubeapi import DEFAULT_TIMEOUT
from rdma_hca.tools.doctor.nodefabric import (
    Listening,
    NodeFabric,
    fabric_checks,
    listening_checks,
    net_raw_held,
    read_own_node,
)
from rdma_hca.tools.doctor.render import checks_json, checks_text, summary, table
from rdma_hca.tools.doctor.result import DEFAULT_READYZ_URL, Check
from rdma_hca.tools.doctor.shares import (
    UNCOUNTED_HEADERS,
    Shares,
    checkpoint_path,
    read_shares,
    shares_check,
    shares_json,
    shares_rows,
    uncounted_rows,
)
from rdma_hca.tools.doctor.slices import DEFAULT_DRIVER
from rdma_hca.tools.report import clean_json, printable_lines

SUBJECT = "node"
READYZ_TIMEOUT = 3.0
PLUGIN_LOGS = "kubectl -n kube-system logs ds/ack-rdma-dp-ds"


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """Where to look and what the plugin was told; the roots make it testable on sim trees."""

    sysfs_root: Path
    dev_root: Path
    kubelet_dir: Path
    readyz_url: str
    non_host_network: bool
    readyz_timeout: float = READYZ_TIMEOUT
    read_deadline: float = DEFAULT_DEADLINE
    dra_checkpoint: Path | None = None  # the DRA driver's: who holds how much of each HCA
    # False: the DRA driver alone, which has no device-plugin sockets to look for.
    device_plugin: bool = True
    # This pod's own daemon (POD_UID): asked instead of readyz_url, which on the host
    # network may reach the other instance during a rolling update.
    probe_socket: str | None = None
    # This node's Node as read from the API server (NODE_NAME set): its ports' neighbours.
    fabric: NodeFabric | None = None
    # fabric.lldp, CAP_NET_RAW and NODE_NAME as the daemon here has them; None: not judged.
    listening: Listening | None = None


@dataclass(frozen=True, slots=True)
class NodeReport:
    inventory: NodeInventory
    options: NodeOptions
    checks: tuple[Check, ...]
    shares: Shares | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def run(args: argparse.Namespace, *, out: TextIO, env: Mapping[str, str] | None = None) -> int:
    """Entry point of ``doctor --node``: 0 all good, 1 a check failed, 2 a bad config."""
    environ = os.environ if env is None else env
    try:
        settings = _settings(args, environ)
    except ConfigError as exc:
        return _usage_error(out, args.json, str(exc))
    # The flags, else the plugin's own settings: inside its pod the doctor finds the
    # driver's checkpoint where the driver keeps it, whatever the kubelet's root.
    driver = getattr(args, "dra_driver", None) or DEFAULT_DRIVER
    if driver == DEFAULT_DRIVER:
        driver = settings.dra.driver_name
    # A URL given wins; otherwise inside the plugin's pod its own probe socket answers.
    url = getattr(args, "readyz_url", None)
    probe = (probe_socket_path(default_dir(environ), settings.pod_uid)
             if url is None and settings.pod_uid else None)
    options = NodeOptions(
        sysfs_root=Path(args.sysfs_root),
        dev_root=Path(args.dev_root),
        kubelet_dir=Path(args.kubelet_dir),
        readyz_url=url or DEFAULT_READYZ_URL,
        non_host_network=settings.non_host_network,
        read_deadline=read_deadline(args),
        dra_checkpoint=checkpoint_path(getattr(args, "plugins_dir", None)
                                       or settings.plugins_dir, driver),
        device_plugin=settings.device_plugin_enabled,
        probe_socket=probe,
        fabric=_own_node(args, environ),
        listening=_listening(settings, environ),
    )
    try:
        report = diagnose(options)
    except DiscoveryFailed as exc:
        return _usage_error(out, args.json, f"{exc}; nothing was checked (raise the limit "
                                            "and retry)")
    if args.json:
        doc = clean_json(report_json(report))
        out.write(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    else:
        out.write(printable_lines(report_text(report)))
    return 0 if report.ok else 1


def _own_node(args: argparse.Namespace, env: Mapping[str, str]) -> NodeFabric | None:
    """This node's Node, read where the doctor runs in the daemon's pod (NODE_NAME)."""
    name = env.get("NODE_NAME")
    if not name:
        return None
    home = Path(env["HOME"]) if env.get("HOME") else Path("/nonexistent")
    return read_own_node(name, kubeconfig=getattr(args, "kubeconfig", None),
                         context=getattr(args, "context", None), env=env, home=home,
                         timeout=getattr(args, "timeout", DEFAULT_TIMEOUT))


def _listening(settings: Settings, env: Mapping[str, str],
               proc_status: Path = Path("/proc/self/status")) -> Listening:
    """In a pod (the daemon's, where the doctor is meant to run) this process has the
    container's capabilities; elsewhere they say nothing of the daemon's."""
    in_pod = bool(env.get("KUBERNETES_SERVICE_HOST"))
    return Listening(settings.fabric.lldp,
                     net_raw_held(proc_status) if in_pod else None,
                     env.get("NODE_NAME", "") if in_pod else None)


def _settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    """The flag wins over ``RDMA_HCA_NON_HOST_NETWORK``, which wins over the file, as for
    ``serve``: inside the plugin pod the doctor then judges with the plugin's own setting
    (and likewise for devicePlugin.enabled and the pod's UID)."""
    flag = True if args.non_host_network else None
    return load_settings(config_file=args.config, env=env, flags={
        "nonHostNetwork": flag,
        "devicePlugin.enabled": getattr(args, "device_plugin", None)})


def _usage_error(out: TextIO, as_json: bool, message: str) -> int:
    if as_json:
        out.write(json.dumps({"ok": False, "error": message, "checks": []}) + "\n")
    else:
        print(f"rdma-hca doctor: {message}", file=sys.stderr)
    return 2


def diagnose(options: NodeOptions) -> NodeReport:
    """Discover and judge; every check here reads only under the given roots and URL."""
    inv = discover_bounded(options.sysfs_root, options.dev_root,
                           deadline=options.read_deadline)
    checks: list[Check] = [_hcas_found(inv, options)]
    if inv.stalled:
        checks.append(_stalled_check(inv, options.read_deadline))
    for hca in inv.hcas:
        checks.append(_ports_check(hca))
        checks.append(_device_nodes_check(hca, options.dev_root))
    checks.append(_rdma_cm_check(inv, options.dev_root))
    if inv.warnings:
        checks.append(Check(SUBJECT, "sysfs entries", False,
                            f"{len(inv.warnings)} skipped: " + "; ".join(inv.warnings),
                            "the HCAs these entries belong to are not offered; check dmesg "
                            "for driver errors and reload the driver"))
    checks.append(_netns_check(inv, options.non_host_network))
    checks.append(_ipv6_check(inv.hcas, options.non_host_network))
    if options.device_plugin:
        checks.append(_kubelet_socket_check(options.kubelet_dir))
        checks.append(_plugin_socket_check(options.kubelet_dir))
    else:
        checks.append(Check(SUBJECT, "device plugin", True,
                            "off (devicePlugin.enabled is false: the DRA driver alone), so "
                            "the kubelet's device-plugin sockets are not checked"))
    if options.probe_socket is not None:
        checks.append(_probe_check(options.probe_socket, options.readyz_timeout))
    else:
        checks.append(_registered_check(options.readyz_url, options.readyz_timeout))
    shares = None
    if options.dra_checkpoint is not None:
        shares, problem = read_shares(options.dra_checkpoint, inv.hcas, options.read_deadline)
        if problem is not None:
            checks.append(problem)
        elif shares is not None:
            checks.append(shares_check(shares))
    if options.listening is not None:
        checks.extend(listening_checks(options.listening))
    if options.fabric is not None:
        checks.extend(fabric_checks(inv.hcas, options.fabric))
    return NodeReport(inv, options, tuple(checks), shares)


# -------------------------------------------------------------------------------- HCAs


def _hcas_found(inv: NodeInventory, options: NodeOptions) -> Check:
    if inv.hcas:
        names = ", ".join(h.name for h in inv.hcas)
        return Check(SUBJECT, "HCAs", True, f"{len(inv.hcas)} found: {names}")
    return Check(SUBJECT, "HCAs", False,
                 f"none under {options.sysfs_root}/class/infiniband",
                 "load the RDMA driver (e.g. modprobe mlx5_ib) or, in a pod, mount the host's "
                 "/sys and pass --sysfs-root")


def _stalled_check(inv: NodeInventory, deadline: float) -> Check:
    return Check(SUBJECT, "sysfs reads", False,
                 f"{len(inv.stalled)} file(s) did not answer within {deadline:g} s: "
                 + ", ".join(inv.stalled),
                 "a read that hangs is a driver waiting on its device (often HCA firmware): "
                 "check dmesg for the driver's errors; the HCAs these files belong to count "
                 "as down until the reads answer (reset the HCA or reboot the node)")


def _port_text(hca: Hca) -> str:
    parts = []
    for p in hca.ports:
        netdevs = f" {','.join(p.netdevs)}" if p.netdevs else ""
        parts.append(f"port {p.number} {p.state}/{p.phys_state}{netdevs}")
    return ", ".join(parts) or "no ports"


def _ports_check(hca: Hca) -> Check:
    title = f"HCA {hca.name}"
    if hca.problems:
        return Check(SUBJECT, title, False, "; ".join(hca.problems),
                     "see the reason above; the plugin does not offer this HCA")
    if hca.any_port_up:
        return Check(SUBJECT, title, True, _port_text(hca))
    infiniband = any(p.link_layer is LinkLayer.INFINIBAND for p in hca.ports)
    netdevs = ", ".join(hca.netdevs) or "its netdev"
    fix = (f"check the cable and switch port; bring the link up (ip link set {netdevs} up)"
           if not infiniband else
           "check the cable and that a subnet manager runs on the fabric (port state INIT "
           "means no SM); ibstat shows the port")
    return Check(SUBJECT, title, False, f"no port up ({_port_text(hca)})", fix)


def _device_nodes_check(hca: Hca, dev_root: Path) -> Check:
    title = f"HCA {hca.name} device nodes"
    if hca.uverbs is None:
        return Check(SUBJECT, title, False, "no uverbs device in sysfs",
                     "load the verbs module: modprobe ib_uverbs")
    nodes = hca.device_nodes()
    missing = [n.path for n in nodes if not n.present]
    if missing:
        return Check(SUBJECT, title, False,
                     f"missing under {dev_root}: {', '.join(missing)}",
                     "create them (udev: udevadm trigger --subsystem-match=infiniband_verbs) "
                     "or, in the plugin pod, mount the host's /dev")
    return Check(SUBJECT, title, True, ", ".join(n.path for n in nodes))


def _rdma_cm_check(inv: NodeInventory, dev_root: Path) -> Check:
    if inv.rdma_cm is not None and inv.rdma_cm.present:
        return Check(SUBJECT, "rdma_cm", True, inv.rdma_cm.path)
    return Check(SUBJECT, "rdma_cm", False, f"{dev_root}/infiniband/rdma_cm is missing",
                 "load the connection manager module: modprobe rdma_ucm")


# --------------------------------------------------------------------- networking mode


def _netns_check(inv: NodeInventory, non_host_network: bool) -> Check:
    title = "RDMA netns mode"
    mode = inv.netns_mode or "unknown (kernel does not say; shared assumed)"
    if inv.netns_mode == "exclusive" and non_host_network:
        return Check(SUBJECT, title, False,
                     "exclusive: HCAs are visible only in the host's network namespace, so "
                     "non-hostNetwork pods cannot see them",
                     "rdma system set netns shared (persist: options ib_core netns_mode=1), or "
                     "run RDMA pods with hostNetwork: true")
    if inv.netns_mode == "exclusive":
        return Check(SUBJECT, title, True,
                     "exclusive (fine while only hostNetwork pods use RDMA)")
    return Check(SUBJECT, title, True, mode)


def _ipv6_check(hcas: Sequence[Hca], non_host_network: bool) -> Check:
    title = "IPv6 for non-hostNetwork pods"
    if not non_host_network:
        return Check(SUBJECT, title, True,
                     "not needed: nonHostNetwork is off, only hostNetwork pods use RDMA")
    missing = ipv6_missing(hcas)
    if missing:
        return Check(SUBJECT, title, False,
                     "nonHostNetwork is on but these RoCE HCAs have no RoCE v2 GID with a "
                     f"global IPv6 address: {', '.join(missing)}",
                     "non-hostNetwork RDMA needs an IPv6 compute network: give the RoCE "
                     "netdevs global IPv6 addresses (create the cluster in IPv6 mode), or "
                     "use hostNetwork: true pods and set nonHostNetwork: false")
    return Check(SUBJECT, title, True, "every RoCE HCA has a RoCE v2 GID with a global IPv6 "
                 "address")


# ------------------------------------------------------------------- kubelet and plugin


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def _kubelet_socket_check(kubelet_dir: Path) -> Check:
    sock = kubelet_dir / "kubelet.sock"
    title = "kubelet socket"
    if _is_socket(sock):
        return Check(SUBJECT, title, True, str(sock))
    what = "is not a socket" if sock.exists() else "does not exist"
    return Check(SUBJECT, title, False, f"{sock} {what}",
                 "is the kubelet running (systemctl status kubelet)? If its root is not "
                 "/var/lib/kubelet, pass --kubelet-dir <root>/device-plugins (and set the "
                 "chart's kubelet directory)")


def _plugin_socket_check(kubelet_dir: Path) -> Check:
    title = "plugin socket"
    try:
        found = sorted(p for p in kubelet_dir.glob("rdma-hca-*.sock") if _is_socket(p))
    except OSError:
        found = []
    if found:
        return Check(SUBJECT, title, True, ", ".join(str(p) for p in found))
    return Check(SUBJECT, title, False, f"no rdma-hca-*.sock socket in {kubelet_dir}",
                 f"the plugin is not serving on this node: {PLUGIN_LOGS} (the kubelet "
                 "deletes plugin sockets when it restarts; the plugin must notice and "
                 "register again)")


def _registered_check(url: str, timeout: float) -> Check:
    title = "registered with the kubelet"
    # No proxies: the URL is this node's loopback, and an HTTP(S)_PROXY must not swallow it.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            status = resp.status
            body = resp.read(200)
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read(200)
        exc.close()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return Check(SUBJECT, title, False, f"cannot reach {url} ({reason})",
                     f"is the plugin running here with metricsAddress :9478? {PLUGIN_LOGS}; "
                     "or pass --readyz-url")
    text = body.decode("utf-8", "replace").strip().splitlines()
    said = f": {text[0]}" if text else ""
    if status == 200:
        return Check(SUBJECT, title, True, f"{url} answered 200{said}")
    return Check(SUBJECT, title, False, f"{url} answered {status}{said}",
                 f"the plugin has not registered with the kubelet: {PLUGIN_LOGS} and check "
                 "the kubelet socket above")


def _probe_check(path: str, timeout: float) -> Check:
    """``/readyz`` of this pod's own daemon, on its probe socket."""
    title = "registered with the kubelet"
    try:
        status, body = ask(path, "/readyz", timeout)
    except ProbeError as exc:
        return Check(SUBJECT, title, False, f"cannot ask this pod's daemon: {exc}",
                     f"is the plugin running in this pod with its HTTP endpoints on "
                     f"(metrics.address not empty)? {PLUGIN_LOGS}; or pass --readyz-url")
    text = body.strip().splitlines()
    said = f": {text[0]}" if text else ""
    where = f"this pod's daemon (probe socket {path})"
    if status == 200:
        return Check(SUBJECT, title, True, f"{where} answered 200{said}")
    return Check(SUBJECT, title, False, f"{where} answered {status}{said}",
                 f"the plugin has not registered with the kubelet: {PLUGIN_LOGS}")


# ------------------------------------------------------------------------------ output


def _hca_rows(inv: NodeInventory) -> list[list[str]]:
    rows = []
    for hca in inv.hcas:
        devs = ",".join(n.name + ("" if n.present else "(missing)") for n in hca.device_nodes())
        numa = "-" if hca.numa_node is None else str(hca.numa_node)
        root = hca.pcie_root or "-"
        for p in hca.ports or ():
            rate = f"{p.rate_gbps:g}G" if p.rate_gbps is not None else "-"
            rows.append([hca.name, str(p.number), "up" if p.is_up else "down",
                         f"{p.state}/{p.phys_state}", str(p.link_layer), rate,
                         ",".join(p.netdevs) or "-", devs or "-", numa, root])
        if not hca.ports:
            rows.append([hca.name, "-", "down", "-", "-", "-", "-", devs or "-", numa, root])
    return rows


def report_text(report: NodeReport) -> str:
    parts = []
    rows = _hca_rows(report.inventory)
    if rows:
        parts.append(table(["HCA", "PORT", "LINK", "STATE", "LAYER", "RATE", "NETDEV",
                            "DEVICE NODES", "NUMA", "PCIE ROOT"], rows))
    if report.shares is not None:
        parts.append(table(["HCA", "BANDWIDTH HELD", "OF", "CLAIMS", "HELD BY"],
                           shares_rows(report.shares)))
        uncounted = uncounted_rows(report.shares)
        if uncounted:
            parts.append(table(UNCOUNTED_HEADERS, uncounted))
    parts.append(checks_text(report.checks))
    parts.append(summary(report.checks))
    return "\n\n".join(parts) + "\n"


def report_json(report: NodeReport) -> dict[str, Any]:
    inv = report.inventory
    return {
        "ok": report.ok,
        "nonHostNetwork": report.options.non_host_network,
        "devicePlugin": report.options.device_plugin,
        "probeSocket": report.options.probe_socket,  # None: readiness asked over TCP (--readyz-url)
        "netnsMode": inv.netns_mode,
        "rdmaCm": asdict(inv.rdma_cm) if inv.rdma_cm is not None else None,
        "hcas": [
            {
                "name": h.name,
                "driver": h.driver,
                "numaNode": h.numa_node,
                "pciBusID": h.pci_bus_id,
                "pcieRoot": h.pcie_root,
                "usable": h.usable,
                "problems": list(h.problems),
                "deviceNodes": [asdict(n) for n in h.device_nodes()],
                "ports": [
                    {"number": p.number, "up": p.is_up, "state": p.state,
                     "physState": p.phys_state, "linkLayer": str(p.link_layer),
                     "rateGbps": p.rate_gbps, "netdevs": list(p.netdevs)}
                    for p in h.ports
                ],
            }
            for h in inv.hcas
        ],
        "stalled": list(inv.stalled),
        "warnings": list(inv.warnings),
        "draShares": None if report.shares is None else shares_json(report.shares),
        "checks": checks_json(report.checks),
        "error": None,
    }
