"""The one health verdict both front ends hand out: can a pod use this HCA now?

The device plugin turns it into Healthy/Unhealthy devices, the DRA driver into taints
and the kubelet's health stream; asked the same question, they must give the same
answer. A pod needs the HCA's verbs device, a port that is up, and the node's
``rdma_cm`` (RDMA connection setup, rdma_ucm): without it every HCA is unusable. An
HCA held for flapping (``held``, see ``watch.flaps``) counts as down whatever its
ports say this instant.
"""

from __future__ import annotations

from collections.abc import Container

from rdma_hca.node.model import CharDevice, Hca


def rdma_cm_ok(rdma_cm: CharDevice | None) -> bool:
    return rdma_cm is not None and rdma_cm.present


def hca_up(hca: Hca, held: Container[str]) -> bool:
    """A port is up, and the HCA is not held down for flapping."""
    return hca.any_port_up and hca.name not in held


def hca_healthy(hca: Hca, rdma_cm: CharDevice | None, held: Container[str]) -> bool:
    return hca.usable and hca_up(hca, held) and rdma_cm_ok(rdma_cm)
