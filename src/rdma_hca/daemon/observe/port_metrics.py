"""The per-port families of ``/metrics``, written straight to exposition text and kept.

They are most of a scrape: about sixty samples per port (the state, the info series, the
sysfs counters and mlx5's hw_counters), 30k lines on a node of 256 two-port HCAs. Built
through prometheus_client's generic families they would cost about 20 µs a sample (label
validation and escaping, a record per sample), over half a second of Python per scrape at
that size, on a worker thread that still holds the GIL the event loop needs.
Here each port's label text is escaped once per inventory and the lines are formatted
directly, and the text is kept until one of its three inputs (the inventory's HCAs, the
counter cache, the state-change counts) is replaced: the daemon replaces those, never
edits them, so identity says whether anything changed. Scrapes between two counter
refreshes then cost nothing here; after a refresh, only the values that changed are
formatted again (:class:`Samples`), by the refresh itself once someone scrapes
(``MetricsServer.counters_read``), so that a scrape serves the text made.

The output is byte for byte what prometheus_client writes for the same families (a test
renders both ways); the family names are a contract with the chart's alerts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.utils import floatToGoString

from rdma_hca.node.model import Hca
from rdma_hca.node.port_polls import HW_PREFIX

PORT_STATES = ("ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER", "UNKNOWN")
# The counters of ports/N/counters (the kernel's sysfs ABI, the IB PortCounters and
# PortCountersExtended attributes): sysfs name -> (metric, scale). The data counters count
# 4-byte words (IB spec), so they are scaled to bytes; port_xmit_wait counts ticks whose
# length the device decides, so it stays in ticks. The first seven names are older than
# the rest and keep their order.
COUNTERS = {
    "port_rcv_data": ("rdma_hca_port_receive_bytes_total", 4),
    "port_xmit_data": ("rdma_hca_port_transmit_bytes_total", 4),
    "port_rcv_packets": ("rdma_hca_port_receive_packets_total", 1),
    "port_xmit_packets": ("rdma_hca_port_transmit_packets_total", 1),
    "port_rcv_errors": ("rdma_hca_port_receive_errors_total", 1),
    "port_xmit_discards": ("rdma_hca_port_transmit_discards_total", 1),
    "link_downed": ("rdma_hca_port_link_downed_total", 1),
    "symbol_error": ("rdma_hca_port_symbol_errors_total", 1),
    "link_error_recovery": ("rdma_hca_port_link_error_recoveries_total", 1),
    "port_rcv_remote_physical_errors":
        ("rdma_hca_port_receive_remote_physical_errors_total", 1),
    "port_rcv_switch_relay_errors": ("rdma_hca_port_receive_switch_relay_errors_total", 1),
    "port_rcv_constraint_errors": ("rdma_hca_port_receive_constraint_errors_total", 1),
    "port_xmit_constraint_errors": ("rdma_hca_port_transmit_constraint_errors_total", 1),
    "local_link_integrity_errors": ("rdma_hca_port_local_link_integrity_errors_total", 1),
    "excessive_buffer_overrun_errors":
        ("rdma_hca_port_excessive_buffer_overrun_errors_total", 1),
    "VL15_dropped": ("rdma_hca_port_vl15_dropped_packets_total", 1),
    "port_xmit_wait": ("rdma_hca_port_transmit_wait_ticks_total", 1),
    "unicast_rcv_packets": ("rdma_hca_port_unicast_receive_packets_total", 1),
    "unicast_xmit_packets": ("rdma_hca_port_unicast_transmit_packets_total", 1),
    "multicast_rcv_packets": ("rdma_hca_port_multicast_receive_packets_total", 1),
    "multicast_xmit_packets": ("rdma_hca_port_multicast_transmit_packets_total", 1),
}
# ports/N/hw_counters: what the driver counts (mlx5: congestion, retransmits, CQE errors;
# other drivers their own set), so one family with the file name as the `counter` label.
HW_COUNTERS = "rdma_hca_port_hw_events_total"
HW_DOC = "Driver counter of the port from sysfs hw_counters, by file name"
BYTES_PER_GBIT = 1e9 / 8

Counters = Mapping[tuple[str, int], Mapping[str, int]]
Changes = Mapping[tuple[str, int], int]


def escapego_float(value: str) -> str:
    """A label value as the text format wants it (backslash, newline, double quote)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def go_float(value: float) -> str:
    """A float as prometheus_client writes values and bucket bounds (Go's formatting,
    which Prometheus parses), so ours read the same as the library's families."""
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]


def _count(value: int) -> str:
    """``go_float`` of a counter, without the float round trip where that is exact: counters
    are most of the samples, and most of them small. Go's form all the same (exponent
    from a million on), as the library writes it."""
    if 0 <= value < 1_000_000:
        return f"{value}.0"
    if 0 < value < 1 << 53:  # every integer here is a float exactly
        digits = str(value)
        mantissa = digits.rstrip("0")
        return (f"{mantissa[0]}.{mantissa[1:]}" if len(mantissa) > 1 else mantissa) + \
            _EXPONENTS[len(digits) - 1]
    return go_float(value)


_EXPONENTS = tuple(f"e+{i:02d}" for i in range(16))


def _head(name: str, doc: str, kind: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


INFO = "rdma_hca_hca_info"
INFO_DOC = ("1 for each port of an HCA, labelled with what joins it to other series: netdev, "
            "PCI address, NUMA node, PCIe root, firmware")


def _info_lines(h: Hca, hca: str) -> Iterator[str]:
    """One line per port and netdev (a port without a netdev: one, netdev empty)."""
    fixed = (f'board_id="{escapego_float(h.board_id or "")}",'
             f'driver="{escapego_float(h.driver or "")}",'
             f'firmware_version="{escapego_float(h.fw_ver or "")}",hca="{hca}",')
    tail = (f'node_guid="{escapego_float(h.node_guid or "")}",'
            f'numa_node="{"" if h.numa_node is None else h.numa_node}",'
            f'pci_address="{escapego_float(h.pci_address or "")}",'
            f'pcie_root="{escapego_float(h.pcie_root or "")}",')
    for p in h.ports:
        layer = escapego_float(p.link_layer.value)
        for netdev in p.netdevs or ("",):
            yield (f'{INFO}{{{fixed}link_layer="{layer}",netdev="{escapego_float(netdev)}",'
                   f'{tail}port="{p.number}"}} 1.0\n')


class Layout:
    """What of the port text depends on the HCAs alone, made once per inventory: the info,
    up, state and rate families whole, and each sample's name and labels ready for its
    value. Counters are read every few seconds, the inventory changes rarely: a scrape
    after a counter refresh then only formats numbers."""

    def __init__(self, hcas: Iterable[Hca]) -> None:
        info = [_head(INFO, INFO_DOC, "gauge")]
        up = [_head("rdma_hca_port_up", "1 when the port is ACTIVE and LinkUp", "gauge")]
        state = [_head("rdma_hca_port_state", "1 for the port's current state", "gauge")]
        rate = [_head("rdma_hca_port_rate_bytes_per_second", "Port rate in bytes per second",
                      "gauge")]
        # (port key, its labels) in output order, and the prefixes of its samples.
        self.ports: list[tuple[tuple[str, int], str]] = []
        self.changed: list[tuple[tuple[str, int], str]] = []
        self.counters: dict[str, list[tuple[tuple[str, int], str]]] = {
            name: [] for name in COUNTERS}
        for h in hcas:
            hca = escapego_float(h.name)
            info.extend(_info_lines(h, hca))
            for p in h.ports:
                key = (h.name, p.number)
                # Labels in name order, as prometheus_client writes them.
                labels = f'hca="{hca}",port="{p.number}"'
                self.ports.append((key, labels))
                up.append(f'rdma_hca_port_up{{hca="{hca}",link_layer="'
                          f'{escapego_float(p.link_layer.value)}",port="{p.number}"}} '
                          f'{"1.0" if p.is_up else "0.0"}\n')
                known = p.state if p.state in PORT_STATES else "UNKNOWN"
                state.extend(f'rdma_hca_port_state{{{labels},state="{st}"}} '
                             f'{"1.0" if known == st else "0.0"}\n' for st in PORT_STATES)
                if p.rate_gbps is not None:
                    rate.append(f"rdma_hca_port_rate_bytes_per_second{{{labels}}} "
                                f"{go_float(p.rate_gbps * BYTES_PER_GBIT)}\n")
                self.changed.append((key, f"rdma_hca_port_state_changes_total{{{labels}}} "))
                for name, (metric, _) in COUNTERS.items():
                    self.counters[name].append((key, f"{metric}{{{labels}}} "))
        self.fixed = "".join([*info, *up, *state, *rate])
        # A driver's hw counter names are known only from what is read: their prefixes
        # are made as met, at most one per port and name, and go with the layout.
        self._hw: dict[tuple[str, int], dict[str, str]] = {key: {} for key, _ in self.ports}
        self._labels = dict(self.ports)

    def hw_prefixes(self, key: tuple[str, int]) -> dict[str, str]:
        """The port's prefixes by counter name as met so far ("" for a name that is not a
        hw counter); :meth:`hw_prefix` adds one."""
        return self._hw[key]

    def hw_prefix(self, key: tuple[str, int], name: str) -> str:
        prefix = ""
        if name.startswith(HW_PREFIX):
            label = escapego_float(name[len(HW_PREFIX):])
            prefix = f'{HW_COUNTERS}{{counter="{label}",{self._labels[key]}}} '
        self._hw[key][name] = prefix
        return prefix


_CHANGED_HEAD = _head("rdma_hca_port_state_changes_total",
                      "Up/down transitions of the port seen by the daemon", "counter")
_COUNTER_HEADS = {name: _head(metric, f"Port counter {name} from sysfs", "counter")
                  for name, (metric, _) in COUNTERS.items()}
_HW_HEAD = _head(HW_COUNTERS, HW_DOC, "counter")


def port_text(hcas: Iterable[Hca], counters: Counters, changes: Changes,
              layout: Layout | None = None) -> str:
    """Exposition text of every per-port family, in the order /metrics shows them;
    ``layout`` must be that of ``hcas`` (made here when not given)."""
    return "".join(Samples(layout or Layout(hcas), counters, changes).pieces)


# The text of the smallest values, made once: most counters are errors and drops that
# stay at or near 0, so most of a kept text's values share these strings.
_SMALL = tuple(f"{i}.0\n" for i in range(256))
_SCALED = {name: scale for name, (_, scale) in COUNTERS.items() if scale != 1}


def _value(value: int) -> str:
    """A counter's value as it ends its line."""
    return _SMALL[value] if 0 <= value < 256 else f"{_count(value)}\n"


class Samples:
    """The port text of one inventory as a list of pieces (each line's name and labels,
    kept by the layout, then its value), and where each counter's value sits in it, so
    that the text after a counter refresh formats only the values that changed.

    Between two refreshes most counters keep their value (errors, drops, retransmits),
    and each port's values come as one mapping, so comparing a port's mapping with the
    last one (in C) tells whether any of its values must be written again. A port whose
    set or order of counters changed (a read that failed, a driver's new counter)
    changes which lines there are: :meth:`update` says so, and the text is made anew."""

    def __init__(self, layout: Layout, counters: Counters, changes: Changes) -> None:
        self.layout = layout
        pieces = [layout.fixed, _CHANGED_HEAD]
        self._changed_at = len(pieces)
        for key, prefix in layout.changed:
            pieces += (prefix, _value(changes.get(key, 0)))
        self._changes = changes
        # Per port, counter name -> where its value sits in the pieces.
        found: dict[tuple[str, int], dict[str, int]] = {key: {} for key, _ in layout.ports}
        for name, (_, scale) in COUNTERS.items():
            pieces.append(_COUNTER_HEADS[name])
            for key, prefix in layout.counters[name]:
                values = counters.get(key)
                if values and name in values:
                    found[key][name] = len(pieces) + 1
                    pieces += (prefix, _value(values[name] * scale))
        pieces.append(_HW_HEAD)
        for key, _ in layout.ports:
            values = counters.get(key)
            if not values:
                continue
            prefixes = layout.hw_prefixes(key)
            for name, value in values.items():
                hw = prefixes.get(name)
                if hw is None:
                    hw = layout.hw_prefix(key, name)
                if hw:
                    found[key][name] = len(pieces) + 1
                    pieces += (hw, _value(value))
        self.pieces = pieces
        # Per port, in the order of its values: their names, where each one sits (-1: not
        # written) and its scale, so that an update walks values alone.
        self._names = {key: list(counters.get(key) or ()) for key in found}
        self._at = {key: [(at.get(name, -1), _SCALED.get(name, 1))
                          for name in counters.get(key) or ()]
                    for key, at in found.items()}
        # The mappings the pieces were made from (the daemon's own, not copies).
        self._seen = {key: counters.get(key) for key, _ in layout.ports}
        self.rewrote = True

    def update(self, counters: Counters, changes: Changes) -> bool:
        """Make the pieces those of these inputs; False when they need other pieces (they
        are then half updated: make new :class:`Samples`). ``rewrote`` then says whether
        any piece changed (the counters are read again every few seconds, mostly the
        same)."""
        pieces = self.pieces
        self.rewrote = False
        if changes is not self._changes and changes != self._changes:
            self.rewrote = True
            at = self._changed_at + 1
            for i, (key, _) in enumerate(self.layout.changed):
                pieces[at + 2 * i] = _value(changes.get(key, 0))
        self._changes = changes
        seen, where, names = self._seen, self._at, self._names
        small = _SMALL
        for key, old in seen.items():
            values = counters.get(key)
            if values is old:
                continue
            if not values or not old:
                if values != old:  # a port's counters appeared or went: other lines
                    return False
                seen[key] = values
                continue
            # The same names in the same order (compared in C): the lines stay, only
            # values change. Another order changes the port's hw counter lines.
            if list(values) != names[key]:
                return False
            if values == old:
                seen[key] = values
                continue
            self.rewrote = True
            for value, was, (index, scale) in zip(values.values(), old.values(), where[key],
                                                  strict=True):
                if value != was and index >= 0:
                    # _value inline: a call per value is a good part of what an update
                    # after a busy interval costs.
                    value *= scale
                    pieces[index] = (small[value] if 0 <= value < 256
                                     else f"{_count(value)}\n")
            seen[key] = values
        return True


class PortText:
    """The last port text and the three objects it was made from, and the pieces of the
    last inventory's text to make the next from."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made_from: tuple[object, object, object] | None = None
        self._text = b""
        self._samples: tuple[object, Samples] | None = None
        self.made = 0  # texts made (a refresh's or a scrape's), for whoever asks who made it

    def get(self, hcas: tuple[Hca, ...], counters: Counters, changes: Changes) -> bytes:
        """The text for these inputs; made again only when one of them is another object,
        and then only the values that changed."""
        # Under the lock throughout: the pieces are updated in place, and a scrape that
        # waits for another's update then finds its text made.
        with self._lock:
            made = self._made_from
            if (made is not None and made[0] is hcas and made[1] is counters
                    and made[2] is changes):
                return self._text
            kept = self._samples
            if kept is not None and kept[0] is hcas:
                samples = kept[1]
                if not samples.update(counters, changes):
                    samples = Samples(samples.layout, counters, changes)
                elif not samples.rewrote:
                    # New mappings of the same values: the text is the last one.
                    self._made_from = (hcas, counters, changes)
                    return self._text
            else:
                samples = Samples(Layout(hcas), counters, changes)
            self._samples = (hcas, samples)
            text = "".join(samples.pieces).encode("utf-8")
            self._made_from, self._text = (hcas, counters, changes), text
            self.made += 1
            return text
