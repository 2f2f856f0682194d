"""The node's Kubernetes Events, whichever front end offers its HCAs: a port down and back,
an HCA's device nodes gone and back, and the config refusals at start.

What happened to which HCA is compared from one inventory to the next; only changes are
told. A flapping port is one episode: while the health watcher holds its HCA down
(flapHoldSeconds) it counts as down, and without a hold its downs are repeats of one
Warning (the recorder counts them into that Event's series) and its ups of one Normal.
An HCA that leaves the node (a driver reload, a firmware reset) is remembered as gone, a
bounded number of them, so that its return is told too.

The Events are about the Node. The kubelet's own name them with the node's name as UID,
which is where ``kubectl describe node`` looks, so these do too and need no read of the
Node object (the device plugin's opt-in account may only write Events).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from rdma_hca.kit.offloop import OffLoop
from rdma_hca.kube.client import read_credentials
from rdma_hca.kube.credentials import CredentialSearch
from rdma_hca.kube.errors import KubeError
from rdma_hca.kube.eventbody import NORMAL, WARNING, EventSpec, ObjectRef
from rdma_hca.kube.events import EventRecorder, connect_events_client
from rdma_hca.node.model import Hca, NodeInventory

log = logging.getLogger(__name__)

CONTROLLER = "rdma-hca.io/node-daemon"
# How long the exit of a refused start waits for its Event to be sent.
REFUSAL_SEND_SECONDS = 2.0
# serve has no credential flags: in a pod its service account, else a kubeconfig file.
EVENTS_CREDENTIALS = CredentialSearch(
    in_cluster_first=True,
    in_pod_fix="run it in a pod with its service account token mounted (the chart does when "
               "dra.enabled or events.enabled is true)")

PORT_DOWN = "HcaPortDown"
PORT_UP = "HcaPortUp"
DEVICE_GONE = "HcaDeviceGone"
DEVICE_BACK = "HcaDeviceBack"
CONFIG_REFUSED = "ConfigRefused"
# HCAs remembered after they left the node, so their return is told; past this many the
# longest gone is forgotten (a node has a few dozen HCAs at most).
VANISHED_KEPT = 256


def node_ref(node: str) -> ObjectRef:
    return ObjectRef("Node", node, uid=node)


async def connect_recorder(kubeconfig: str | None, node: str, *,
                           off: OffLoop | None = None) -> EventRecorder:
    """A recorder on a client of its own, with the credentials the DRA driver uses (the
    in-cluster service account first); raises KubeError when there are none."""
    creds = await read_credentials(kubeconfig, EVENTS_CREDENTIALS, off=off)
    client = await connect_events_client(creds, off=off)
    return EventRecorder(client, controller=CONTROLLER, instance=node,
                         close_client=client.close)


def _port_state(hca: Hca, number: int) -> str:
    for port in hca.ports:
        if port.number == number:
            return f"{port.state}, physical state {port.phys_state}"
    return "gone"


class NodeEvents:
    """``observe(inventory)`` after each discovery; Events for what changed since the last."""

    def __init__(self, recorder: EventRecorder, node: str,
                 wanted: Callable[[Hca], bool] = lambda hca: True, *,
                 vanished_kept: int = VANISHED_KEPT) -> None:
        self.recorder = recorder
        self.node = node
        self.wanted = wanted
        self.vanished_kept = vanished_kept
        self._ports: dict[tuple[str, int], bool] | None = None  # (HCA, port) -> up
        self._devices: dict[str, bool] = {}  # HCA -> its device nodes are there
        # HCAs that left the node, oldest first; each is in _devices as not there.
        self._vanished: dict[str, None] = {}

    def observe(self, inventory: NodeInventory) -> None:
        hcas = {h.name: h for h in inventory.hcas if self.wanted(h)}
        # An HCA held down for flapping counts as down until its hold ends: then the
        # episode is one Warning and one Normal, whatever the port did in between.
        ports = {(h.name, p.number): p.is_up and h.name not in inventory.held
                 for h in hcas.values() for p in h.ports}
        devices = {name: _devices_there(h) for name, h in hcas.items()}
        first = self._ports is None
        before_ports = self._ports or {}
        for name in sorted(set(self._devices) | set(devices)):
            was, now = self._devices.get(name, True), devices.get(name, False)
            if was and not now:
                self._tell(DEVICE_GONE, WARNING, _gone_note(name, hcas.get(name)))
            elif now and not was:
                self._tell(DEVICE_BACK, NORMAL, _back_note(name, name in self._vanished))
        for key in sorted(set(before_ports) | set(ports)):
            name, number = key
            if name not in hcas:
                continue  # an HCA gone is told above, not once per port
            was, now = before_ports.get(key, True), ports.get(key, False)
            if was and not now:
                self._tell(PORT_DOWN, WARNING,
                           f"port {number} of the HCA {name} is down "
                           f"({_port_state(hcas[name], number)}): pods using it lose RDMA "
                           f"on it; check the cable, the switch port and `ibstat {name}` "
                           "on the node")
            elif now and not was and not first:
                self._tell(PORT_UP, NORMAL, f"port {number} of the HCA {name} is up again")
        self._ports, self._devices = ports, self._remember_vanished(devices)

    def _remember_vanished(self, devices: dict[str, bool]) -> dict[str, bool]:
        """``devices`` and, as not there, the HCAs that left the node: without them an
        HCA's return would look like no change."""
        for name in sorted(self._devices.keys() - devices.keys()):
            self._vanished.setdefault(name)
        for name in devices:
            self._vanished.pop(name, None)
        while len(self._vanished) > self.vanished_kept:
            del self._vanished[next(iter(self._vanished))]
        return devices | dict.fromkeys(self._vanished, False)

    def refused(self, message: str) -> None:
        """The daemon refuses its config at start: said on the Node before it exits."""
        self._tell(CONFIG_REFUSED, WARNING, f"the RDMA HCA daemon did not start: {message}",
                   action="Start")

    async def refused_sent(self, message: str, within: float = REFUSAL_SEND_SECONDS) -> None:
        """``refused`` and wait for it to go out, never longer than ``within``."""
        self.refused(message)
        if not await self.recorder.drain(within):
            log.debug("the Event of the refused start was not sent within %g s", within)

    def _tell(self, reason: str, kind: str, note: str, action: str = "Watch") -> None:
        self.recorder.record(EventSpec(node_ref(self.node), reason, note, type=kind,
                                       action=action))


def _devices_there(hca: Hca) -> bool:
    return hca.uverbs is not None and hca.uverbs.present


def _back_note(name: str, vanished: bool) -> str:
    if vanished:
        return f"the HCA {name} is back on the node: it is offered again"
    return f"the HCA {name}'s device nodes are back: it is offered again"


def _gone_note(name: str, hca: Hca | None) -> str:
    if hca is None:
        return (f"the HCA {name} is gone from the node: it is no longer offered; check "
                "that its driver is loaded (`rdma link`, `ls /sys/class/infiniband`)")
    missing = hca.uverbs.path if hca.uverbs is not None else "its uverbs device node"
    return (f"the device nodes of the HCA {name} are gone ({missing} is missing): it is no "
            "longer offered; check that ib_uverbs is loaded and /dev/infiniband is mounted")


async def start_node_events(kubeconfig: str | None, node: str, *, off: OffLoop | None,
                            wanted: Callable[[Hca], bool],
                            quiet: bool = False) -> NodeEvents | None:
    """A started recorder and its node watcher, or None (said once; ``quiet``: in the
    debug log only, when another part says it better) when there are no credentials:
    Events are a courtesy and never stop the daemon."""
    try:
        recorder = await connect_recorder(kubeconfig, node, off=off)
    except (KubeError, OSError) as exc:
        say = log.debug if quiet else log.warning
        say("Kubernetes Events are off: no usable API server credentials (%s); with the "
            "chart, set events.enabled: true to mount a token", exc)
        return None
    recorder.start()
    return NodeEvents(recorder, node, wanted)


def stats(recorder: EventRecorder) -> Mapping[str, int]:
    """The recorder's counts by outcome, for the metrics."""
    return {"created": recorder.created, "patched": recorder.patched,
            "dropped": recorder.dropped, "failed": recorder.failed}
