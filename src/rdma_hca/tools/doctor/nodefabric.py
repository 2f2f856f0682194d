"""The fabric part of ``doctor --node``: each RoCE port's LLDP neighbour, as this node's
daemon published it on its Node (the neighbours annotation and the fabric block label).

The node view reads its own Node only where it can do so without guessing whose
credentials to use: in the daemon's pod (``NODE_NAME`` and the pod's service account,
which with ``fabric.lldp`` may get nodes) or with ``--kubeconfig``. Elsewhere, or when the
read fails, the checks say so and pass: the rest of the node view does not depend on it.

Before the Node, what the daemon here can do (:func:`listening_checks`): whether its config
turns ``fabric.lldp`` on, whether its container holds ``CAP_NET_RAW`` (read from this
process, which in the daemon's pod has the container's capabilities), and whether it knows
its node's name for the label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdma_hca.contract.fabric import (
    FABRIC_BLOCK_LABEL,
    NEIGHBOURS_ANNOTATION,
    NeighboursError,
    PortNeighbour,
    decode_neighbours,
)
from rdma_hca.kube.credentials import load_credentials
from rdma_hca.kube.errors import KubeError
from rdma_hca.node.model import Hca, LinkLayer
from rdma_hca.tools.doctor.fabric import SILENT_FIX
from rdma_hca.tools.doctor.kubeapi import CREDENTIALS, DEFAULT_TIMEOUT, KubeClient
from rdma_hca.tools.doctor.result import Check

SUBJECT = "node"
TITLE = "fabric (LLDP)"
LISTENING = "LLDP listening"
CAP_NET_RAW = 13  # bit of the capability sets in /proc/<pid>/status (linux/capability.h)
NET_RAW_FIX = ("add NET_RAW to the daemon container's securityContext.capabilities.add (the "
               "chart does with fabric.lldp: true), then restart the pod")


@dataclass(frozen=True, slots=True)
class Listening:
    """What decides whether the daemon here listens and labels its Node."""

    enabled: bool  # fabric.lldp in the config the doctor read
    net_raw: bool | None  # CAP_NET_RAW held by this container; None: not known here
    node_name: str | None  # NODE_NAME, "" when unset; None: not in a pod, not judged


def net_raw_held(status: Path) -> bool | None:
    """Whether ``status`` (``/proc/self/status``) shows CAP_NET_RAW effective; None when it
    cannot be read or has no ``CapEff`` line."""
    try:
        text = status.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            try:
                return bool(int(value.strip(), 16) >> CAP_NET_RAW & 1)
            except ValueError:
                return None
    return None


def listening_checks(state: Listening) -> list[Check]:
    """Whether the daemon here listens for LLDP and may label its Node; what is off and why."""
    if not state.enabled:
        return [Check(SUBJECT, LISTENING, True,
                      "off: fabric.lldp is false (the default): the daemon listens for no "
                      "LLDP and publishes no switch, fabric block or neighbours; set the "
                      "chart value fabric.lldp: true to turn it on (docs/fabric.md)")]
    if state.net_raw is False:
        checks = [Check(SUBJECT, LISTENING, False,
                        "fabric.lldp is true but this container lacks CAP_NET_RAW: the "
                        "daemon cannot open its raw sockets and hears no LLDP (everything "
                        "else works)", NET_RAW_FIX)]
    elif state.net_raw is None:
        checks = [Check(SUBJECT, LISTENING, True,
                        "on (fabric.lldp is true); CAP_NET_RAW not checked: run doctor --node "
                        "in the daemon's pod to check its container's capabilities")]
    else:
        checks = [Check(SUBJECT, LISTENING, True,
                        "on: fabric.lldp is true and the container holds CAP_NET_RAW")]
    if state.node_name == "":
        checks.append(Check(SUBJECT, "fabric block label", False,
                            f"off: NODE_NAME is not set, so the daemon cannot write "
                            f"{FABRIC_BLOCK_LABEL} on its Node (LLDP, the DRA attributes and "
                            "/metrics work without it)",
                            "set NODE_NAME from the pod's spec.nodeName (the chart does)"))
    return checks


@dataclass(frozen=True, slots=True)
class NodeFabric:
    """This node's Node as the API server holds it, or why it could not be read."""

    node: str
    obj: Mapping[str, Any] | None
    problem: str | None = None


def read_own_node(node: str, *, kubeconfig: str | None, context: str | None,
                  env: Mapping[str, str], home: Path,
                  timeout: float = DEFAULT_TIMEOUT) -> NodeFabric:
    if not kubeconfig and not env.get("KUBERNETES_SERVICE_HOST"):
        return NodeFabric(node, None, "not in the daemon's pod and no --kubeconfig given")
    try:
        creds = load_credentials(kubeconfig=kubeconfig, context=context, env=env, home=home,
                                 accepts=CREDENTIALS)
        client = KubeClient(creds, timeout=timeout)
        try:
            return NodeFabric(node, client.node(node))
        finally:
            client.close()
    except KubeError as exc:
        return NodeFabric(node, None, str(exc))


def fabric_checks(hcas: Sequence[Hca], view: NodeFabric) -> list[Check]:
    """One check per RoCE port with its neighbour; one that says what is off otherwise."""
    if view.obj is None:
        return [Check(SUBJECT, TITLE, True,
                      f"not checked: cannot read Node {view.node} ({view.problem})")]
    meta = view.obj.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(NEIGHBOURS_ANNOTATION)
    if text is None:
        return [Check(SUBJECT, TITLE, True,
                      f"off: Node {view.node} carries no {NEIGHBOURS_ANNOTATION} (fabric.lldp "
                      "is false, the default, or the daemon has heard no LLDP yet)")]
    try:
        neighbours = {(n.hca, n.port): n for n in decode_neighbours(str(text))}
    except NeighboursError as exc:
        return [Check(SUBJECT, TITLE, False, str(exc),
                      f"kubectl annotate node {view.node} {NEIGHBOURS_ANNOTATION}- (the "
                      "daemon writes it again)")]
    block = (meta.get("labels") or {}).get(FABRIC_BLOCK_LABEL)
    checks = [Check(SUBJECT, "fabric block", True,
                    f"{FABRIC_BLOCK_LABEL}={block}" if block else
                    f"no {FABRIC_BLOCK_LABEL} label: no port hears a switch")]
    for hca in hcas:
        for port in hca.ports:
            if port.link_layer is not LinkLayer.ETHERNET:
                continue  # InfiniBand has no LLDP: out of scope
            found = neighbours.get((hca.name, port.number))
            checks.append(_port_check(hca.name, port.number, found))
    return checks


def _port_check(hca: str, port: int, found: PortNeighbour | None) -> Check:
    title = f"HCA {hca} port {port} neighbour"
    if found is None:
        return Check(SUBJECT, title, True, "not listened on (the daemon listens on the RoCE "
                     "ports of the HCAs it offers)")
    if not found.heard:
        return Check(SUBJECT, title, False,
                     f"listened on {found.netdev}, heard no LLDP", SILENT_FIX)
    where = f"switch {found.switch} port {found.switch_port or '?'}"
    extra = [f"chassis {found.chassis_id}"] if found.system_name else []
    if found.port_description and found.port_description != found.switch_port:
        extra.append(f"\"{found.port_description}\"")
    extra.append(f"heard on {found.netdev}")
    return Check(SUBJECT, title, True, f"{where} ({', '.join(extra)})")
