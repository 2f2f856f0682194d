"""Monitoring objects of the chart: PodMonitor, alerts (PrometheusRule), Grafana dashboard.

Every PromQL expression is parsed with promql-parser, and every metric it names must be in
/metrics of a real Daemon running on a simulated node: an alert on a name the daemon does not
export would never fire.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml
from deploy_support import CHART, VAP_API, WITH_PROMETHEUS_OPERATOR, RenderFn
from prometheus_client.parser import text_string_to_metric_families
from test_deploy_chart import container, one

from rdma_hca.daemon.wiring import Daemon
from rdma_hca.devkit.sim.kubelet import KubeletEmulator
from rdma_hca.devkit.sim.nodes import SimNode
from rdma_hca.settings.config import Settings

ALL_ON = {"metrics.podMonitor.enabled": "true", "metrics.prometheusRule.enabled": "true",
          "metrics.grafanaDashboard.enabled": "true"}
# Labels Prometheus adds to every scraped series (the PodMonitor relabels `node`).
TARGET_LABELS = {"node", "pod", "namespace", "job", "instance", "container", "endpoint"}
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$node": ".*"}
DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d)$")


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
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
                                    "targetLabel": {"type": "string"}}}}}}}}}},
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
                                "required": ["summary", "description", "runbook"]}}}}}}}}},
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


def test_shape_check_catches_a_misspelt_field(operator_objects: list[dict[str, Any]]) -> None:
    pm = one(operator_objects, "PodMonitor")
    pm["spec"]["podMetricEndpoints"] = pm["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pm, POD_MONITOR)


def test_prometheus_rule_is_the_alerts_file(operator_objects: list[dict[str, Any]]) -> None:
    rule = one(operator_objects, "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE)
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())


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
    for rule in by_name.values():
        assert "rdma-hca doctor" in rule["annotations"]["runbook"], rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}


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


# ----------------------------------------------------------------------------------- PromQL


@pytest.mark.parametrize(("where", "expr"), all_expressions(),
                         ids=[w for w, _ in all_expressions()])
def test_every_expression_parses(where: str, expr: str) -> None:
    assert selectors(expr), f"{where}: no series selector in {expr!r}"


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
        return await scrape(port)
    finally:
        await daemon.stop()


def names_and_labels_used() -> Iterator[tuple[str, str, set[str]]]:
    for where, expr in all_expressions():
        for name, labels in selectors(expr):
            yield where, name, labels
    (node_var,) = [v for v in dashboard()["templating"]["list"] if v["name"] == "node"]
    yield "dashboard variable node", node_var["definition"].split("(")[1].split(",")[0], set()


async def test_every_metric_used_is_exported_by_a_running_daemon(metrics_text: str) -> None:
    series = exported_series(metrics_text)
    assert "rdma_hca_port_up" in series  # the scrape itself worked
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
