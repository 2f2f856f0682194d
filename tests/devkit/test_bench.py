"""The benchmark's table and JSON, rendered from made-up figures.

The benchmark itself is never run here (it measures time; tests do not): these only check
that what ``make bench`` writes has the promised shape and carries the same numbers in the
markdown table and in the JSON document.
"""

from __future__ import annotations

import json

import pytest

from rdma_hca.devkit.bench_report import (
    JSON_VERSION,
    Figure,
    Report,
    Target,
    render_console,
    render_markdown,
    render_table,
    report_json,
)

MACHINE = {"date": "2025-01-01 00:00:00 UTC", "nproc": "2", "python": "3.11.7",
           "simulated trees on": "/dev/shm (tmpfs)"}


def figures() -> list[Figure]:
    return [
        Figure("allocate_p50_ms", "Allocate p50", "ms", 0.66, 0.6, "bare",
               Target(1.2, on_ratio=True), "2000 calls each"),
        Figure("idle_rss_mib", "idle RSS", "MiB", 60.0, 40.0, "bare", Target(1.3, on_ratio=True)),
        Figure("port_down_max_ms", "port down | max", "ms", 980.0, target=Target(1000.0)),
        Figure("discovery_8_hcas_ms", "discover_node, 8 HCAs", "ms", 12.5),
        Figure("kubelet_restart_median_ms", "kubelet restart", "ms", None,
               target=Target(1000.0), note="not measured: emulator did not start"),
    ]


def report() -> Report:
    return Report(figures(), dict(MACHINE), quick=True, seconds=42.4,
                  details={"allocate": {"calls_each": 2000}})


def table_lines(text: str) -> list[list[str]]:
    """Cells of each table line, split on unescaped pipes only, as a markdown renderer does."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip().replace("\0", "|") for c in line.replace("\\|", "\0").strip("|").split("|")]
            for line in rows]


def test_table_has_the_promised_columns_and_one_row_per_figure() -> None:
    rows = table_lines(render_table(figures()))
    assert rows[0] == ["figure", "ours", "baseline", "ratio", "target", "met?"]
    body = rows[2:]
    assert len(body) == len(figures())
    assert all(len(r) == 6 for r in body)
    assert [r[0] for r in body] == [f.label for f in figures()]


def test_rows_show_ratio_target_and_verdict() -> None:
    body = {r[0]: r for r in table_lines(render_table(figures()))[2:]}
    alloc = body["Allocate p50"]
    assert alloc[1] == "0.660 ms"
    assert alloc[2] == "0.600 ms (bare)"
    assert alloc[3] == "1.10×"
    assert alloc[4] == "≤ 1.2× baseline"
    assert alloc[5] == "yes"
    assert body["idle RSS"][3] == "1.50×"
    assert body["idle RSS"][5] == "**NO**"
    assert body["port down | max"][4] == "≤ 1000 ms"
    assert body["port down | max"][3] == "—"
    assert body["discover_node, 8 HCAs"][4:] == ["—", "—"]
    assert body["kubelet restart"][1] == "—"
    assert body["kubelet restart"][5] == "—"


def test_table_is_written_byte_for_byte_as_before() -> None:
    # BENCHMARKS.md is compared across runs in diffs: its format must not drift.
    assert render_table(figures()) == (
        "| figure | ours | baseline | ratio | target | met? |\n"
        "|---|---:|---:|---:|---|:---:|\n"
        "| Allocate p50 | 0.660 ms | 0.600 ms (bare) | 1.10× | ≤ 1.2× baseline | yes |\n"
        "| idle RSS | 60.0 MiB | 40.0 MiB (bare) | 1.50× | ≤ 1.3× baseline | **NO** |\n"
        "| port down \\| max | 980 ms | — | — | ≤ 1000 ms | yes |\n"
        "| discover_node, 8 HCAs | 12.5 ms | — | — | — | — |\n"
        "| kubelet restart | — | — | — | ≤ 1000 ms | — |")


def test_a_line_break_in_a_label_does_not_break_the_table() -> None:
    text = render_table([Figure("k", "two\nlines", "ms", 1.0)])
    assert text.splitlines()[2] == "| two lines | 1.00 ms | — | — | — | — |"


def test_markdown_names_machine_notes_and_misses() -> None:
    text = render_markdown(report())
    assert text.startswith("# Benchmarks\n")
    for key, value in MACHINE.items():
        assert f"- {key}: {value}" in text
    assert "quick" in text
    assert "**Allocate p50**: 2000 calls each" in text
    misses = text.split("## Targets missed", 1)[1]
    assert "idle RSS: 60.0 MiB (1.50× baseline)" in misses
    assert "Allocate p50" not in misses


def test_json_carries_the_same_numbers_as_the_table() -> None:
    doc = json.loads(json.dumps(report_json(report())))
    assert doc["version"] == JSON_VERSION
    assert doc["machine"] == MACHINE
    assert doc["quick"] is True
    by_key = {f["key"]: f for f in doc["figures"]}
    assert list(by_key) == [f.key for f in figures()]
    alloc = by_key["allocate_p50_ms"]
    assert alloc["ours"] == 0.66 and alloc["baseline"] == 0.6
    assert alloc["ratio"] == pytest.approx(1.1)
    assert alloc["target"] == {"max": 1.2, "of": "ratio"}
    assert alloc["met"] is True
    assert by_key["idle_rss_mib"]["met"] is False
    assert by_key["port_down_max_ms"]["target"] == {"max": 1000.0, "of": "ours"}
    assert by_key["port_down_max_ms"]["met"] is True
    missing = by_key["kubelet_restart_median_ms"]
    assert missing["ours"] is None and missing["met"] is None
    assert missing["note"].startswith("not measured")
    assert by_key["discovery_8_hcas_ms"]["target"] is None
    assert doc["details"] == {"allocate": {"calls_each": 2000}}


def test_console_table_is_aligned_without_markdown_emphasis() -> None:
    lines = render_console(figures()).splitlines()
    assert lines[0].split()[:2] == ["figure", "ours"]
    assert set(lines[1]) <= {"-", " "}
    assert len(lines) == 2 + len(figures())
    assert "**" not in "\n".join(lines)
    # Every row's second column starts where the header's does.
    column = lines[0].index("ours")
    assert all(line[column - 2:column] == "  " for line in lines[2:])


def test_console_table_is_written_as_before() -> None:
    assert render_console(figures()[:3]).splitlines() == [
        "figure           ours      baseline         ratio  target           met?",
        "---------------  --------  ---------------  -----  ---------------  ----",
        "Allocate p50     0.660 ms  0.600 ms (bare)  1.10×  ≤ 1.2× baseline  yes",
        "idle RSS         60.0 MiB  40.0 MiB (bare)  1.50×  ≤ 1.3× baseline  NO",
        "port down | max  980 ms    —                —      ≤ 1000 ms        yes",
    ]


async def test_lag_meter_sees_a_blocked_loop() -> None:
    import asyncio
    import time

    from rdma_hca.devkit.bench_trees import LagMeter

    meter = LagMeter()
    task = asyncio.create_task(meter.run())
    try:
        await asyncio.sleep(0.02)
        meter.reset()
        time.sleep(0.05)  # the loop is held: the timer wakes at least this late
        await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert meter.worst >= 0.04
    assert meter.p99 <= meter.worst


def test_every_tree_size_has_its_rows() -> None:
    from rdma_hca.devkit.bench_plan import ordered

    rows = [f.key for f in ordered({}, (8, 64, 256), "not run")]
    for n in (64, 256):
        assert f"loop_lag_scrape_{n}_hcas_ms" in rows
        assert f"loop_lag_rediscovery_{n}_hcas_ms" in rows
        assert f"scrape_{n}_hcas_ms" in rows
        assert f"counter_read_{n}_hcas_ms" in rows
    assert "loop_lag_scrape_8_hcas_ms" not in rows
    assert "discovery_8_hcas_ms" in rows
