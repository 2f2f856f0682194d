"""The CDI specs the DRA driver writes, one per prepared claim: their kind and names, and
the annotations that let a lost checkpoint be rebuilt from them.

A spec's kind is ``<driver>/claim``; a device in it is named ``<claim UID>-<device>``, so
its CDI ID is ``<driver>/claim=<claim UID>-<device>``. Annotation keys are qualified with
the driver's name: the spec carries the claim's UID, namespace and name; each device its
pool, device, HCA (a comma-separated list for the node-wide device), the requests it
answers, its shares (``<shareID>=<bits per second>``, comma-separated), the settings
its requests asked for (``config``: HcaConfig's fields as compact JSON; absent: none)
and, on a device given with admin access, ``admin-access: "true"``.
"""

from __future__ import annotations

import re

CDI_CLASS = "claim"

# Annotations of the spec.
CLAIM_UID = "claim-uid"
CLAIM_NAMESPACE = "claim-namespace"
CLAIM_NAME = "claim-name"
# Annotations of each device of the spec.
DEVICE = "device"
POOL = "pool"
HCA = "hca"
REQUESTS = "requests"
SHARES = "shares"
CONFIG = "config"
ADMIN_ACCESS = "admin-access"


def cdi_kind(driver: str) -> str:
    return f"{driver}/{CDI_CLASS}"


def cdi_device_name(claim_uid: str, device: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{claim_uid}-{device}")


def cdi_id(driver: str, claim_uid: str, device: str) -> str:
    return f"{cdi_kind(driver)}={cdi_device_name(claim_uid, device)}"


def note(driver: str, key: str) -> str:
    """The annotation key ``<driver>/<key>``."""
    return f"{driver}/{key}"
