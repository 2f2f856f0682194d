"""A bond's member netdevs, where frames sent to the bond's ports come in.

LLDP is a link's business: a switch sends its frames on each cable, and on a bond they
arrive on the members, not on the bond. A member names its bond with its ``master``
link (as the kernel shows it under ``class/net``), which holds for bonds and teams alike.
"""

from __future__ import annotations

import os

from rdma_hca.kit.text import natural_sorted


def members(sysfs_root: str, netdev: str) -> tuple[str, ...]:
    """The netdevs enslaved to ``netdev``, in natural order; none when it is no bond.

    Blocking (a listing of ``class/net`` and one link per netdev): run it off the loop.
    """
    net = os.path.join(sysfs_root, "class", "net")
    try:
        names = os.listdir(net)
    except OSError:
        return ()
    found = []
    for name in names:
        try:
            master = os.readlink(os.path.join(net, name, "master"))
        except OSError:
            continue
        if os.path.basename(master) == netdev:
            found.append(name)
    return tuple(natural_sorted(found))
