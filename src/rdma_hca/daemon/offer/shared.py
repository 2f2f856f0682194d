"""What one unit of a shared resource stands for, whichever front end hands it out.

Through the device plugin every shared slot of ``rdma/hca`` gives the container every
usable HCA of its pool; through DRA the node-wide device that the extended-resource
DeviceClass selects gives the same. Both ask here, so a workload moved from one front
end to the other gets the same HCAs (and, built from them by ``env`` and ``cdi``, the
same device nodes and variables).
"""

from __future__ import annotations

from collections.abc import Iterable

from rdma_hca.daemon.offer.health import hca_healthy
from rdma_hca.node.model import CharDevice, Hca


def every_usable(hcas: Iterable[Hca]) -> tuple[Hca, ...]:
    """The HCAs a shared unit gives, in the order given: every one whose verbs device a
    container can open. A port that is down does not take the HCA away (it may come up
    while the pod runs); the env lists only ports that are up."""
    return tuple(h for h in hcas if h.usable)


def any_healthy(hcas: Iterable[Hca], rdma_cm: CharDevice | None) -> bool:
    """A shared unit is worth placing a pod on while one of its HCAs can carry traffic."""
    return any(hca_healthy(h, rdma_cm) for h in hcas)
