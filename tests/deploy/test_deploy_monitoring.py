"""Monitoring objects of the chart: PodMonitor, alerts (PrometheusRule), Grafana dashboard.

Every PromQL expression is parsed with promql-parser, and every metric it names must be in
/metrics of a real Daemon running on a simulated node (one with the device plugin, one with
the DRA driver), or be one of the few series other exporters give (EXTERNAL): an alert on a
name nobody exports would never fire.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from deploy_support import (
    CHART,
    REPO,
    VAP_API,
    WITH_PROMETHEUS_OPERATOR,
    RenderFn,
    run_helm,
)
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_chart import container, one

from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.tree import SimNode
from rdma_hca.devkit.waiting import wait_until
from rdma_hca.settings.model import Settings

ALL_ON = {"metrics.podMonitor.enabled": "true", "metrics.prometheusRule.enabled": "true",
          "metrics.grafanaDashboard.enabled": "true"}
# Labels Prometheus adds to every scraped series (the PodMonitor relabels `node` and copies
# the pod labels of podTargetLabels).
TARGET_LABELS = {"node", "pod", "namespace", "job", "instance", "container", "endpoint",
                 "app_kubernetes_io_name", "app_kubernetes_io_instance"}
# Series the alerts read from others, with the labels they use.
EXTERNAL = {
    "up": TARGET_LABELS,  # Prometheus, for every target
    # kube-state-metrics
    "kube_daemonset_status_desired_number_scheduled": {"daemonset", "namespace"},
    "kube_daemonset_status_number_available": {"daemonset", "namespace"},
    "kube_pod_info": {"created_by_kind", "created_by_name", "namespace", "pod", "node"},
    # the kubelet's DRA gRPC client
    "dra_grpc_operations_duration_seconds_count": {"driver_name", "method_name",
                                                   "grpc_status_code"},
}
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
PLACEHOLDER = re.compile(r"\$\{([A-Za-z]+)\}")
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*"}
DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d)$")


def filled_alerts(values: dict[str, Any] = VALUES) -> str:
    """files/alerts.yaml with its placeholders filled from ``values``, as the chart does."""
    rule = values["metrics"]["prometheusRule"]
    fill = {"runbookBaseUrl": rule["runbookBaseUrl"], "draDriverName": values["dra"]["driverName"],
            **rule["thresholds"]}
    return PLACEHOLDER.sub(lambda m: str(fill[m.group(1)]),
                           (CHART / "files" / "alerts.yaml").read_text())


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(filled_alerts())
    return [r for group in doc["groups"] for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "files" / "dashboard.json").read_text())
    return loaded


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def grafana_to_promql(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    assert "$" not in query, f"unknown Grafana variable in {query!r}"
    return query


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every series selector in a PromQL expression."""
    found: list[tuple[str, set[str]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers}
            name = node.name
            if name is None:  # {__name__="..."} form
                name = next(m.value for m in node.matchers.matchers if m.name == "__name__")
            found.append((name, labels - {"__name__"}))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def all_expressions() -> list[tuple[str, str]]:
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()]
    exprs += [(f"dashboard {q}", grafana_to_promql(q)) for q in dashboard_queries()]
    return exprs


# ----------------------------------------------------------------------- rendering and shape


def test_monitoring_objects_render_only_where_the_operator_is(render: RenderFn) -> None:
    kinds = {o["kind"] for o in render(ALL_ON, api_versions=WITH_PROMETHEUS_OPERATOR)}
    assert {"PodMonitor", "PrometheusRule"} <= kinds
    without = {o["kind"] for o in render(ALL_ON, api_versions=(VAP_API,))}
    assert not {"PodMonitor", "PrometheusRule"} & without
    off = {o["kind"] for o in render(api_versions=WITH_PROMETHEUS_OPERATOR)}
    assert not {"PodMonitor", "PrometheusRule"} & off
    no_metrics = render({**ALL_ON, "metrics.enabled": "false"},
                        api_versions=WITH_PROMETHEUS_OPERATOR)
    assert not {"PodMonitor", "PrometheusRule"} & {o["kind"] for o in no_metrics}
    assert all(o["metadata"]["name"] != "ack-rdma-dp-ds-dashboard" for o in no_metrics)


# The parts of the Prometheus Operator's CRD schemas (monitoring.coreos.com/v1) the chart uses;
# additionalProperties false catches a misspelt field as the API server's pruning would not.
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
META = {"type": "object", "required": ["name", "namespace"],
        "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                       "labels": LABELS}}
POD_MONITOR = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": META,
        "spec": {
            "type": "object", "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": LABELS}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"matchNames": {"type": "array",
                                                  "items": {"type": "string"}}}},
                "podMetricsEndpoints": {
                    "type": "array", "minItems": 1,
                    "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"}, "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": DURATION.pattern},
                            "relabelings": {"type": "array", "items": {
                                "type": "object", "additionalProperties": False,
                                "properties": {
                                    "sourceLabels": {"type": "array",
                                                     "items": {"type": "string"}},
                                    "targetLabel": {"type": "string"},
                                    "regex": {"type": "string"},
                                    "replacement": {"type": "string"}}}}}}}}}},
}
PROMETHEUS_RULE = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": META,
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["groups"],
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False, "required": ["name", "rules"],
                "properties": {
                    "name": {"type": "string"},
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "additionalProperties": False,
                        "required": ["alert", "expr", "labels", "annotations"],
                        "properties": {
                            "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                            "expr": {"type": "string", "minLength": 1},
                            "for": {"type": "string", "pattern": DURATION.pattern},
                            "labels": LABELS,
                            "annotations": {
                                "type": "object", "additionalProperties": {"type": "string"},
                                "required": ["summary", "description", "runbook_url"]}}}}}}}}},
    },
}


@pytest.fixture(scope="module")
def operator_objects(render: RenderFn) -> list[dict[str, Any]]:
    return render({**ALL_ON, "metrics.podMonitor.labels.release": "kps"},
                  api_versions=WITH_PROMETHEUS_OPERATOR)


def test_pod_monitor_shape_and_target(operator_objects: list[dict[str, Any]]) -> None:
    pm = one(operator_objects, "PodMonitor")
    jsonschema.validate(pm, POD_MONITOR)
    assert pm["metadata"]["namespace"] == "kube-system"
    assert pm["metadata"]["labels"]["release"] == "kps"
    ds = one(operator_objects, "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pm["spec"]["namespaceSelector"]["matchNames"] == ["kube-system"]
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in container(operator_objects)["ports"]}
    assert endpoint["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node"} in endpoint["relabelings"]
    # Two releases in one namespace: each selects (and scrapes) only its own pods.
    selector = pm["spec"]["selector"]["matchLabels"]
    assert selector["app.kubernetes.io/instance"] == "ack-rdma-device-plugin"
    assert ds["spec"]["selector"]["matchLabels"] == selector
    # The alerts and the dashboard pick the targets by these, not by the job's name.
    assert set(pm["spec"]["podTargetLabels"]) == {"app.kubernetes.io/name",
                                                  "app.kubernetes.io/instance"}
    assert pod_labels["app.kubernetes.io/name"] == "ack-rdma-device-plugin"


def test_shape_check_catches_a_misspelt_field(operator_objects: list[dict[str, Any]]) -> None:
    pm = one(operator_objects, "PodMonitor")
    pm["spec"]["podMetricEndpoints"] = pm["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pm, POD_MONITOR)


def test_prometheus_rule_is_the_alerts_file(operator_objects: list[dict[str, Any]]) -> None:
    rule = one(operator_objects, "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE)
    assert rule["spec"] == yaml.safe_load(filled_alerts())
    assert "${" not in json.dumps(rule["spec"])


def test_thresholds_and_runbook_links_are_tuned_in_values(render: RenderFn) -> None:
    tuned = {"metrics.prometheusRule.thresholds.congestionCnpPerSecond": "2500.5",
             "metrics.prometheusRule.thresholds.retransmitsPerSecond": "40",
             "metrics.prometheusRule.thresholds.healthLoopStaleSeconds": "300",
             "metrics.prometheusRule.runbookBaseUrl": "https://wiki.example.com/rdma",
             "dra.driverName": "hca.example.com"}
    rule = one(render({**ALL_ON, **tuned}, api_versions=WITH_PROMETHEUS_OPERATOR),
               "PrometheusRule")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert rules["RdmaHcaCongestion"]["expr"].endswith("> 2500.5")
    assert rules["RdmaHcaRetransmits"]["expr"].endswith("> 40")
    assert "> 300)" in rules["RdmaHcaHealthLoopStalled"]["expr"]
    assert 'driver_name="hca.example.com"' in rules["RdmaHcaDraPrepareCallsFailing"]["expr"]
    assert "hca.example.com DRA driver" in rules["RdmaHcaDraPrepareErrors"]["annotations"][
        "description"]
    assert all(r["annotations"]["runbook_url"].startswith("https://wiki.example.com/rdma#")
               for r in rules.values())


@pytest.mark.parametrize("value", ["1 or vector(1)", "-5", "0"])
def test_a_threshold_that_is_not_a_plain_number_is_refused(helm: Path, value: str) -> None:
    result = run_helm(helm, "template", "x", str(CHART), "--set",
                      "metrics.prometheusRule.enabled=true", "--set",
                      f"metrics.prometheusRule.thresholds.retransmitsPerSecond={value}")
    assert result.returncode != 0
    assert "retransmitsPerSecond" in result.stderr


def test_the_alerts_cover_the_failures_operators_watch() -> None:
    by_name = {r["alert"]: r for r in alert_rules()}
    assert by_name["RdmaHcaPortDown"]["for"] == "2m"
    assert "rdma_hca_port_up" in by_name["RdmaHcaPortDown"]["expr"]
    assert by_name["RdmaHcaNotRegistered"]["for"] == "5m"
    assert "rdma_hca_registered" in by_name["RdmaHcaNotRegistered"]["expr"]
    assert {name for name, _ in selectors(by_name["RdmaHcaDevicesUnhealthy"]["expr"])} == {
        "rdma_hca_pool_devices_healthy", "rdma_hca_pool_devices"}
    assert "rdma_hca_port_state_changes_total" in by_name["RdmaHcaPortFlapping"]["expr"]
    assert selectors(by_name["RdmaHcaAllocateErrors"]["expr"]) == [
        ("rdma_hca_allocations_total", {"result"})]
    assert "rdma_hca_sysfs_stalls_total" in by_name["RdmaHcaSysfsStalled"]["expr"]
    assert {"RdmaHcaTargetDown", "RdmaHcaTargetAbsent", "RdmaHcaTargetMissingOnNode",
            "RdmaHcaDaemonSetNotAvailable", "RdmaHcaRestarting", "RdmaHcaMissing",
            "RdmaHcaHealthLoopStalled", "RdmaHcaCongestion", "RdmaHcaRetransmits",
            "RdmaHcaLinkErrors",
            "RdmaHcaDraNotRegistered", "RdmaHcaDraSliceNotPublished",
            "RdmaHcaDraPrepareErrors", "RdmaHcaDraPrepareCallsFailing"} <= set(by_name)
    # The driver's own count per claim: an error inside an OK answer is no failed call.
    assert selectors(by_name["RdmaHcaDraPrepareErrors"]["expr"]) == [
        ("rdma_hca_dra_prepare_total", {"result"})]
    # No threshold sits on a whole number of changes that increase() may read a hair above.
    assert by_name["RdmaHcaPortFlapping"]["expr"].endswith("> 4.5")
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
               for line in runbooks.splitlines() if line.startswith("## ")}
    for rule in by_name.values():
        name = rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url == f"{VALUES['metrics']['prometheusRule']['runbookBaseUrl']}#{name.lower()}"
        assert name.lower() in anchors, f"docs/runbooks.md has no section {name}"
        section = runbooks.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        assert "rdma-hca doctor" in section, f"the runbook of {name} does not start the doctor"
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        # A condition (not a count of events over a window) waits before it fires.
        if "increase(" not in rule["expr"] and "changes(" not in rule["expr"]:
            assert "for" in rule, f"{name} fires on the first evaluation"


def test_dashboard_configmap_for_the_grafana_sidecar(render: RenderFn) -> None:
    objs = render(ALL_ON)
    cm = one(objs, "ConfigMap", "ack-rdma-dp-ds-dashboard")
    for version in ("1.26.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(cm, version, strict=True)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(cm["data"]["rdma-hca.json"])
    assert board == dashboard()
    assert board["uid"] == "rdma-hca" and board["panels"]
    assert "ack-rdma-dp-ds-dashboard" not in {o["metadata"]["name"] for o in render()}


def test_the_dashboard_follows_the_conventions() -> None:
    panels = [p for p in dashboard()["panels"] if p["type"] != "row"]
    by_title = {p["title"]: p for p in panels}
    for p in panels:
        exprs = [t["expr"] for t in p.get("targets", [])]
        # Rates and per-window increases on one axis read as the same unit and are not.
        assert not (any("rate(" in e for e in exprs) and any("increase(" in e for e in exprs)), \
            p["title"]
        for e in exprs:
            assert "job=" not in e and "job!" not in e, f"{p['title']}: filters on the job name"
        unit = p["fieldConfig"]["defaults"]["unit"]
        if p["title"].endswith("calls/s"):
            assert unit == "reqps", p["title"]
        if p["type"] == "stat":
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert len(steps) >= 2, f"{p['title']}: a stat without thresholds"
            if any(e.startswith("min(") for e in exprs):  # a 0/1 state: say it in words
                assert p["fieldConfig"]["defaults"]["mappings"], p["title"]
    queries = " ".join(dashboard_queries())
    for wanted in ('up{app_kubernetes_io_name="ack-rdma-device-plugin"', "rdma_hca_hca_missing",
                   "rdma_hca_dra_registered", "rdma_hca_dra_slice_published", "np_cnp_sent",
                   "rdma_hca_dra_prepare_total", "rdma_hca_dra_prepare_seconds_bucket",
                   "out_of_sequence", "rdma_hca_hca_info",
                   "rdma_hca_dra_bandwidth_held",
                   "rdma_hca_dra_bandwidth_capacity",
                   "rdma_hca_api_requests_total",
                   "rdma_hca_api_rate_limit_wait_seconds_total",
                   "rdma_hca_dra_claim_status_pending",
                   "rdma_hca_dra_claim_status_refused_total",
                   "rdma_hca_dra_claim_status_dropped_total"):
        assert wanted in queries, f"no panel shows {wanted}"
    assert len(by_title) == len(panels), "two panels with one title"
    # Panels do not overlap.
    cells: set[tuple[int, int]] = set()
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        assert g["x"] + g["w"] <= 24
        cells |= mine


# ----------------------------------------------------------------------------------- PromQL


@pytest.mark.parametrize(("where", "expr"), all_expressions(),
                         ids=[w for w, _ in all_expressions()])
def test_every_expression_parses(where: str, expr: str) -> None:
    assert selectors(expr), f"{where}: no series selector in {expr!r}"


def documented_queries() -> list[str]:
    """The PromQL examples of docs/metrics.md, comment lines dropped."""
    text = (REPO / "docs" / "metrics.md").read_text()
    blocks = re.findall(r"```promql\n(.*?)```", text, re.S)
    queries = [q for b in blocks for q in re.split(r"\n\s*\n", b) if q.strip()]
    return ["\n".join(line for line in q.splitlines() if not line.startswith("#"))
            for q in queries]


def test_the_documented_joins_parse() -> None:
    queries = documented_queries()
    assert len(queries) >= 5
    for expr in queries:
        names = {name for name, _ in selectors(expr)}
        assert any(n.startswith("rdma_hca_") for n in names), expr


def test_the_parser_rejects_broken_promql() -> None:
    with pytest.raises(ValueError):
        promql_parser.parse("increase(rdma_hca_allocations_total{result=\"error\"}[10m] > 0")


def test_the_dashboards_node_variable_reads_a_real_metric() -> None:
    (node_var,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "node"]
    match = re.fullmatch(r"label_values\((\w+), node\)", node_var["definition"])
    assert match is not None
    selectors(match.group(1))  # parses as PromQL too


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def scrape(port: int) -> str:
    import asyncio

    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body.decode()


def exported_series(text: str) -> dict[str, set[str]]:
    """Every series name /metrics offers (counter `_total`, histogram `_bucket` ... included)
    with the label names seen on it."""
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                    "summary": ["_sum", "_count", ""]}.get(family.type, [""])
        for suffix in suffixes:
            series.setdefault(family.name + suffix, set())
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


@pytest.fixture
async def metrics_text(node: SimNode, plugin_dir: Path,
                       kubelet: KubeletEmulator) -> str:
    port = free_port()
    settings = Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                        kubelet_dir=str(plugin_dir), metrics_address=f"127.0.0.1:{port}",
                        health_poll_seconds=0.05)
    daemon = Daemon(settings, netlink=False)
    await daemon.start()
    try:
        await kubelet.wait_for(lambda: kubelet.allocatable("rdma/hca") > 0)
        # One allocation, so the per-result and histogram series have samples.
        await kubelet.admit_pod("rdma/hca", 1)
        assert await wait_until(lambda: daemon.health.last_pass is not None, 10.0)
        return await scrape(port)
    finally:
        await daemon.stop()


def names_and_labels_used() -> Iterator[tuple[str, str, set[str]]]:
    for where, expr in all_expressions():
        for name, labels in selectors(expr):
            yield where, name, labels
    (node_var,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "node"]
    yield "dashboard variable node", node_var["definition"].split("(")[1].split(",")[0], set()
    # The documented joins: our side of them (the other side is DCGM's, node_exporter's).
    for expr in documented_queries():
        for name, labels in selectors(expr):
            if name.startswith("rdma_hca_"):
                yield "docs/metrics.md", name, labels


@pytest.fixture
async def dra_metrics_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """/metrics of a daemon that runs the DRA driver alone (registered, slice published)."""
    import tempfile

    from rdma_hca.devkit.dra.kubelet import DraKubelet
    from rdma_hca.devkit.kube.apiserver import FakeApiServer
    from rdma_hca.devkit.sim import nodes as sim
    from rdma_hca.settings.model import DraConfig

    node = sim.gpu_node(tmp_path / "dra-node", hcas=2, gid_table_size=8)
    root = tempfile.mkdtemp(prefix="dra-m-", dir="/tmp")  # socket paths are short
    try:
        with FakeApiServer() as api:
            monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
            kubelet = DraKubelet(root, "node-a")
            await kubelet.start()
            port = free_port()
            settings = Settings(sysfs_root=str(node.sysfs_root), dev_root=str(node.dev_root),
                                kubelet_root=root, node_name="node-a",
                                metrics_address=f"127.0.0.1:{port}",
                                device_plugin_enabled=False, dra=DraConfig(enabled=True))
            Path(settings.kubelet_dir).mkdir(parents=True, exist_ok=True)
            daemon = Daemon(settings, netlink=False)
            try:
                await daemon.start()
                assert await kubelet.wait_registered("rdma-hca.io")
                assert await wait_until(lambda: len(api.slices("node-a")) == 1, 10.0)
                assert await wait_until(lambda: daemon.health.last_pass is not None, 10.0)
                return await scrape(port)
            finally:
                await daemon.stop()
                await kubelet.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_every_metric_used_is_exported_by_a_running_daemon(
        metrics_text: str, dra_metrics_text: str) -> None:
    series = exported_series(metrics_text)
    assert "rdma_hca_port_up" in series  # the scrape itself worked
    for name, labels in exported_series(dra_metrics_text).items():
        series.setdefault(name, set()).update(labels)
    assert "rdma_hca_dra_registered" in series
    for name, labels in EXTERNAL.items():
        assert name not in series, f"{name} is ours now: drop it from EXTERNAL"
        series[name] = labels
    missing: list[str] = []
    bad_labels: list[str] = []
    for where, name, labels in names_and_labels_used():
        if name not in series:
            missing.append(f"{name} ({where})")
            continue
        unknown = labels - TARGET_LABELS - series[name]
        if unknown:
            bad_labels.append(f"{name}{sorted(unknown)} ({where})")
    assert not missing, "not in /metrics of the daemon:\n" + "\n".join(sorted(set(missing)))
    assert not bad_labels, "labels the daemon does not set:\n" + "\n".join(bad_labels)


def test_the_hw_counters_the_alerts_name_are_what_the_driver_writes() -> None:
    from rdma_hca.devkit.sim.specs import MLX5_HW_COUNTERS, MLX5_ROCE_HW_COUNTERS

    named: set[str] = set()
    for rule in alert_rules():
        for m in re.finditer(r'counter=~"([^"]+)"', rule["expr"]):
            named.update(m.group(1).split("|"))
    for query in dashboard_queries():
        for m in re.finditer(r'counter=~?"([^"]+)"', query):
            named.update(m.group(1).split("|"))
    assert named, "no alert or panel reads the hw counters"
    assert not named - set(MLX5_HW_COUNTERS + MLX5_ROCE_HW_COUNTERS)


async def test_promtool_finds_nothing_to_lint_in_metrics(metrics_text: str,
                                                         dra_metrics_text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: it comes with Debian's prometheus package "
                    "(apt-get install -y prometheus; .ci/run installs it where missing)")
    for text in (metrics_text, dra_metrics_text):
        result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                                capture_output=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
