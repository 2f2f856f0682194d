"""The per-port families written directly are what prometheus_client writes, and kept.

The reference below builds the same families through prometheus_client's own classes
and renders them with ``generate_latest``; the direct writer must match it byte for
byte on every node shape, including names that need escaping and values that need
Go's float format.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from rdma_hca.daemon.observe.metrics import render
from rdma_hca.daemon.observe.port_metrics import (
    BYTES_PER_GBIT,
    COUNTERS,
    HW_COUNTERS,
    HW_DOC,
    INFO,
    INFO_DOC,
    PORT_STATES,
    PortText,
    port_text,
)
from rdma_hca.daemon.observe.status import Status
from rdma_hca.devkit.sim import nodes as sim
from rdma_hca.devkit.sim.realworld import mlx4_infiniband_node
from rdma_hca.node.inventory import discover_node
from rdma_hca.node.model import CharDevice, Hca, LinkLayer, Port
from rdma_hca.node.port_polls import HW_PREFIX, read_port_counters

Counters = dict[tuple[str, int], dict[str, int]]
Changes = dict[tuple[str, int], int]


class Reference:
    """The per-port families as prometheus_client's classes build them."""

    def __init__(self, hcas: tuple[Hca, ...], counters: Counters, changes: Changes) -> None:
        self.hcas, self.counters, self.changes = hcas, counters, changes

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(INFO, INFO_DOC, labels=[
            "hca", "port", "netdev", "link_layer", "driver", "pci_address", "numa_node",
            "pcie_root", "firmware_version", "board_id", "node_guid"])
        up = GaugeMetricFamily("rdma_hca_port_up", "1 when the port is ACTIVE and LinkUp",
                               labels=["hca", "port", "link_layer"])
        state = GaugeMetricFamily("rdma_hca_port_state", "1 for the port's current state",
                                  labels=["hca", "port", "state"])
        rate = GaugeMetricFamily("rdma_hca_port_rate_bytes_per_second",
                                 "Port rate in bytes per second", labels=["hca", "port"])
        changes = CounterMetricFamily("rdma_hca_port_state_changes",
                                      "Up/down transitions of the port seen by the daemon",
                                      labels=["hca", "port"])
        per = {name: CounterMetricFamily(metric.removesuffix("_total"),
                                         f"Port counter {name} from sysfs",
                                         labels=["hca", "port"])
               for name, (metric, _) in COUNTERS.items()}
        hw = CounterMetricFamily(HW_COUNTERS.removesuffix("_total"), HW_DOC,
                                 labels=["hca", "port", "counter"])
        for h in self.hcas:
            for p in h.ports:
                for netdev in p.netdevs or ("",):
                    info.add_metric([
                        h.name, str(p.number), netdev, p.link_layer.value, h.driver or "",
                        h.pci_address or "", "" if h.numa_node is None else str(h.numa_node),
                        h.pcie_root or "", h.fw_ver or "", h.board_id or "",
                        h.node_guid or ""], 1.0)
            for p in h.ports:
                labels = [h.name, str(p.number)]
                up.add_metric([*labels, p.link_layer.value], 1.0 if p.is_up else 0.0)
                known = p.state if p.state in PORT_STATES else "UNKNOWN"
                for s in PORT_STATES:
                    state.add_metric([*labels, s], 1.0 if known == s else 0.0)
                if p.rate_gbps is not None:
                    rate.add_metric(labels, p.rate_gbps * BYTES_PER_GBIT)
                changes.add_metric(labels, self.changes.get((h.name, p.number), 0))
                values = self.counters.get((h.name, p.number), {})
                for name, (_, scale) in COUNTERS.items():
                    if name in values:
                        per[name].add_metric(labels, values[name] * scale)
                for name, value in values.items():
                    if name.startswith(HW_PREFIX):
                        hw.add_metric([*labels, name.removeprefix(HW_PREFIX)], value)
        yield from (info, up, state, rate, changes, *per.values(), hw)


def reference(hcas: tuple[Hca, ...], counters: Counters, changes: Changes) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Reference(hcas, counters, changes))
    return generate_latest(registry).decode()


def hca(name: str, *, state: str = "ACTIVE", phys: str = "LinkUp", rate: float | None = 400.0,
        ports: int = 1, layer: LinkLayer = LinkLayer.ETHERNET) -> Hca:
    return Hca(
        name=name, driver="mlx5_core", node_guid=None, fw_ver=None, board_id=None,
        hca_type=None, pci_address=None, pci_vendor=None, pci_device=None, numa_node=None,
        ports=tuple(Port(number=n, state=state, phys_state=phys, link_layer=layer,
                         rate=None, rate_gbps=rate, netdevs=(), gids=())
                    for n in range(1, ports + 1)),
        uverbs=CharDevice("uverbs0", "/dev/infiniband/uverbs0", True))


@pytest.mark.parametrize("make", [sim.gpu_node, sim.infiniband_node, mlx4_infiniband_node,
                                  sim.erdma_node, sim.soft_roce_node])
def test_simulated_nodes_render_as_the_library_does(make: object, tmp_path: Path) -> None:
    assert callable(make)
    node = make(tmp_path / "n")
    hcas = discover_node(node.sysfs_root, node.dev_root).hcas
    assert hcas
    # What the node's files hold, every counter and hw counter, then some values changed.
    counters = {(h.name, p.number): {**read_port_counters(node.sysfs_root, h.name, p.number),
                                     "port_rcv_data": 7 + i, "link_downed": i,
                                     "port_xmit_packets": 2**64 - 1, "VL15_dropped": 3,
                                     HW_PREFIX + "np_cnp_sent": 10**12 + i}
                for i, h in enumerate(hcas) for p in h.ports}
    changes = {(hcas[0].name, hcas[0].ports[0].number): 3}
    text = port_text(hcas, counters, changes)
    assert text == reference(hcas, counters, changes)
    for metric, _ in COUNTERS.values():
        assert f"\n{metric}{{" in text  # the sim writes every counter of the ABI
    assert 'rdma_hca_port_hw_events_total{counter="np_cnp_sent",' in text


def test_odd_names_states_and_missing_values_render_as_the_library_does() -> None:
    hcas = (
        hca('mlx"5\\0\n', state="POLLING", phys="Disabled", rate=None, ports=2),
        hca("mlx5_ü", state="UNKNOWN", phys="UNKNOWN", rate=0.0, layer=LinkLayer.INFINIBAND),
        hca("mlx5_2", rate=2.5, ports=0),
    )
    first = hcas[0]
    hcas = (replace(first, fw_ver='22.1\\"x', board_id="MT\n1", numa_node=1,
                    pci_address="0000:3b:00.0", pcie_root="pci0000:3a",
                    ports=(replace(first.ports[0], netdevs=('eth"0', "eth1")),
                           *first.ports[1:])), *hcas[1:])
    counters: Counters = {(hcas[0].name, 2): {"port_rcv_errors": 0, "unknown_counter": 5,
                                              HW_PREFIX + 'odd"name\\': 4},
                          (hcas[1].name, 1): {}}
    changes: Changes = {(hcas[1].name, 1): 10**15, ("gone", 1): 2}
    text = port_text(hcas, counters, changes)
    assert text == reference(hcas, counters, changes)
    assert 'hca="mlx\\"5\\\\0\\n"' in text  # escaped once, where the name is a label
    assert text.count("rdma_hca_hca_info{") == 4  # one per port and netdev
    assert port_text((), {}, {}) == reference((), {}, {})


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(names, st.sampled_from([*PORT_STATES, "POLLING", ""]),
                          st.one_of(st.none(), st.floats(0, 1e4, allow_nan=False)),
                          st.integers(0, 2**64 - 1)),
                min_size=0, max_size=4, unique_by=lambda t: t[0]))
def test_any_names_and_values_render_as_the_library_does(
        ports: list[tuple[str, str, float | None, int]]) -> None:
    hcas = tuple(hca(n, state=s, rate=r) for n, s, r, _ in ports)
    counters: Counters = {(n, 1): {"port_xmit_data": v, "link_downed": v % 7,
                                   HW_PREFIX + n: v // 3}
                          for n, _, _, v in ports}
    changes: Changes = {(n, 1): v % 1000 for n, _, _, v in ports}
    assert port_text(hcas, counters, changes) == reference(hcas, counters, changes)


def test_the_text_is_kept_until_an_input_is_replaced() -> None:
    hcas = (hca("mlx5_0"), hca("mlx5_1"))
    counters: Counters = {("mlx5_0", 1): {"port_rcv_data": 1}}
    changes: Changes = {}
    kept = PortText()
    first = kept.get(hcas, counters, changes)
    assert kept.get(hcas, counters, changes) is first  # the same bytes, not made again
    # The daemon replaces its dicts, never edits them: a new one is a new text.
    newer = {("mlx5_0", 1): {"port_rcv_data": 2}}
    second = kept.get(hcas, newer, changes)
    assert second != first and b"rdma_hca_port_receive_bytes_total" in second
    assert b'{hca="mlx5_0",port="1"} 8.0' in second
    down = (replace(hcas[0], ports=(replace(hcas[0].ports[0], state="DOWN"),)), hcas[1])
    third = kept.get(down, newer, changes)
    assert b'rdma_hca_port_up{hca="mlx5_0",link_layer="Ethernet",port="1"} 0.0' in third
    moved = kept.get(down, newer, {("mlx5_1", 1): 1})
    assert b'rdma_hca_port_state_changes_total{hca="mlx5_1",port="1"} 1.0' in moved


def test_a_kept_layout_writes_what_the_library_writes_as_counters_come_and_go() -> None:
    # The layout is made once per inventory; counters read later may name hw counters it
    # has not met yet, or drop some: each text must still be the library's.
    hcas = (hca("mlx5_0"), hca("mlx5_1"))
    kept = PortText()
    for counters in ({("mlx5_0", 1): {"port_rcv_data": 1}},
                     {("mlx5_0", 1): {"port_rcv_data": 2, HW_PREFIX + "np_cnp_sent": 3},
                      ("mlx5_1", 1): {HW_PREFIX + "out_of_buffer": 4, "symbol_error": 5}},
                     {("mlx5_1", 1): {HW_PREFIX + "out_of_buffer": 6}}):
        text = kept.get(hcas, counters, {}).decode()
        assert text == reference(hcas, counters, {})


counter_names = st.sampled_from(["port_rcv_data", "port_xmit_packets", "link_downed",
                                  "symbol_error", "odd_one", HW_PREFIX + "np_cnp_sent",
                                  HW_PREFIX + "out_of_buffer", HW_PREFIX + "rx_write_requests"])
port_values = st.dictionaries(counter_names, st.integers(0, 2**64 - 1), max_size=8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(port_values, port_values, st.integers(0, 3)), min_size=1,
                max_size=6))
def test_kept_lines_updated_value_by_value_are_what_the_library_writes(
        reads: list[tuple[dict[str, int], dict[str, int], int]]) -> None:
    # Each read a new set of mappings: values change, stay, or the counters come and go
    # or change order; a kept text updated from the last one must be a fresh render's.
    hcas = (hca("mlx5_0", ports=2),)
    kept = PortText()
    last: Counters = {}
    for first, second, changed in reads:
        counters: Counters = {("mlx5_0", 1): first, ("mlx5_0", 2): second}
        if changed == 0 and last:
            # The same names in the same order, some values bumped: the in-place path.
            counters = {key: {name: value + (i % 2) for i, (name, value) in
                              enumerate(values.items())} for key, values in last.items()}
        changes: Changes = {("mlx5_0", 1): changed}
        assert kept.get(hcas, counters, changes).decode() == reference(hcas, counters, changes)
        last = counters


def test_a_port_whose_counters_come_in_another_order_is_written_in_that_order() -> None:
    hcas = (hca("mlx5_0"),)
    kept = PortText()
    a, b = HW_PREFIX + "np_cnp_sent", HW_PREFIX + "out_of_buffer"
    kept.get(hcas, {("mlx5_0", 1): {a: 1, b: 1, "link_downed": 2}}, {})
    # Equal values (equal mappings) and changed ones, each in the other order.
    for swapped in ({("mlx5_0", 1): {b: 1, a: 1, "link_downed": 2}},
                    {("mlx5_0", 1): {a: 1, b: 1, "link_downed": 3}},
                    {("mlx5_0", 1): {b: 1, a: 1, "link_downed": 3}}):
        assert kept.get(hcas, swapped, {}).decode() == reference(hcas, swapped, {})


def test_render_places_the_port_families_between_the_others() -> None:
    status = Status(version="1", hcas=(hca("mlx5_0"),), ipv6_ready=True)
    text = render(status, ports=PortText()).decode()
    order = [text.index(f"# TYPE {name} ") for name in (
        "rdma_hca_build_info", "rdma_hca_hcas", "rdma_hca_port_up",
        "rdma_hca_port_link_downed_total", "rdma_hca_ipv6_ready", "rdma_hca_pool_devices")]
    assert order == sorted(order)
    # Every family once: nothing is written twice when the port text is kept.
    kept = PortText()
    for _ in range(2):
        again = render(status, ports=kept).decode()
        assert again.count("# TYPE rdma_hca_port_up ") == 1


@pytest.mark.parametrize("value", [0, 7, 999_999, 1_000_000, 1_000_001, 123_456_789_012,
                                   2**53 - 1, 2**53, 2**53 + 1, 10**16, 2**64 - 1])
def test_counter_values_at_the_edges_of_the_fast_form(value: int) -> None:
    # Counters skip the float round trip below 2**53; around each edge the text must stay
    # what the library writes (Go's exponent form from a million on).
    hcas = (hca("mlx5_0"),)
    counters: Counters = {("mlx5_0", 1): {"link_downed": value, HW_PREFIX + "np_cnp_sent": value}}
    changes: Changes = {("mlx5_0", 1): value}
    assert port_text(hcas, counters, changes) == reference(hcas, counters, changes)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(0, 2**64 - 1),
                 st.tuples(st.integers(1, 99), st.integers(5, 16)).map(
                     lambda t: t[0] * 10 ** t[1])))
def test_a_counter_reads_as_the_library_writes_it(value: int) -> None:
    # Trailing zeros are where a hand-made exponent form goes wrong (1e+09, 1.1e+07).
    hcas = (hca("mlx5_0"),)
    counters: Counters = {("mlx5_0", 1): {"link_downed": value}}
    assert port_text(hcas, counters, {}) == reference(hcas, counters, {})


def test_counters_read_again_with_the_same_values_keep_the_text_made() -> None:
    # Read every few seconds, mostly unchanged: nothing is joined or encoded again.
    hcas = (hca("mlx5_0", ports=2),)
    values = {"port_rcv_data": 7, HW_PREFIX + "np_cnp_sent": 3}
    kept = PortText()
    first = kept.get(hcas, {("mlx5_0", 1): dict(values), ("mlx5_0", 2): dict(values)}, {})
    again = kept.get(hcas, {("mlx5_0", 1): dict(values), ("mlx5_0", 2): dict(values)}, {})
    assert again is first and kept.made == 1
    bumped: Counters = {("mlx5_0", 1): dict(values), ("mlx5_0", 2): {**values, "port_rcv_data": 8}}
    text = kept.get(hcas, bumped, {})
    assert kept.made == 2 and text.decode() == reference(hcas, bumped, {})
