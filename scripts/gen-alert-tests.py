"""Write tests/deploy/alerts/alerts_test.yaml, the promtool unit tests of the chart's alerts.

    .venv/bin/python scripts/gen-alert-tests.py          # rewrite the file
    .venv/bin/python scripts/gen-alert-tests.py --check  # exit 1 when it is out of date

The cases (input series, when each alert fires and with what $value) are written here by
hand, a firing and a silent one per alert. The expected annotations are filled in from the
rules' own templates ({{ $labels.x }}, {{ $value }} and the two pipes the rules use), so a
change of wording needs no hand edit; promtool then checks them against what Prometheus's
template engine makes of the same templates. The rules are files/alerts.yaml with its
placeholders filled from values.yaml, as the chart does (a test checks that helm renders the
same). A test fails when the committed file differs from what this writes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "ack-rdma-device-plugin"
OUT = ROOT / "tests" / "deploy" / "alerts" / "alerts_test.yaml"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z]+)\}")

Labels = dict[str, str]
Case = tuple[str, list[dict[str, str]], list[tuple[str, list[tuple[Labels, float]]]]]


def filled_rules() -> dict[str, Any]:
    """The rules as the chart renders them with its default values."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    rule = values["metrics"]["prometheusRule"]
    fill = {
        "runbookBaseUrl": rule["runbookBaseUrl"],
        "draDriverName": values["dra"]["driverName"],
        **rule["thresholds"],
    }
    text = PLACEHOLDER.sub(
        lambda m: str(fill[m.group(1)]), (CHART / "files" / "alerts.yaml").read_text()
    )
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _humanize(v: float) -> str:
    if v == 0 or abs(v) < 1:
        return f"{v:.4g}"
    for prefix in ("", "k", "M", "G", "T"):
        if abs(v) < 1000:
            return f"{v:.4g}{prefix}"
        v /= 1000
    return f"{v:.4g}P"


def render(text: str, labels: Labels, value: float) -> str:
    """An annotation's text with the templates the rules use filled in."""

    def sub(m: re.Match[str]) -> str:
        expr = m.group(1).strip()
        if expr.startswith("$labels."):
            return labels.get(expr[len("$labels.") :], "")
        if expr == "$value":
            return _number(value)
        if expr == '$value | printf "%.0f"':
            return f"{value:.0f}"
        if expr == "$value | humanize":
            return _humanize(value)
        raise SystemExit(f"scripts/gen-alert-tests.py does not know the template {{{{ {expr} }}}}")

    return re.sub(r"\{\{(.*?)\}\}", sub, text)


T = dict(
    app_kubernetes_io_name="ack-rdma-device-plugin",
    app_kubernetes_io_instance="ack-rdma-device-plugin",
    instance="10.0.0.1:9478",
    job="kube-system/ack-rdma-dp-ds",
    namespace="kube-system",
    pod="ack-rdma-dp-ds-a1",
    node="gpu-1",
)
T2 = {**T, "instance": "10.0.0.2:9478", "pod": "ack-rdma-dp-ds-b2", "node": "gpu-2"}
T3 = {**T, "instance": "10.0.0.3:9478", "pod": "ack-rdma-dp-ds-c3", "node": "gpu-3"}
R = "rdma/hca"
PREP = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
KUBELET = dict(instance="10.0.0.1:10250", job="kubelet", metrics_path="/metrics", node="gpu-1")
KSM = dict(instance="10.1.0.9:8080", job="kube-state-metrics")


def series(name: str, labels: Labels, values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


# alert -> [(what the case shows, input series, [(eval time, [(alert labels, $value)])])]
CASES: dict[str, list[Case]] = {
    "RdmaHcaTargetDown": [
        (
            "down for 6 minutes fires; up, or down for 4, does not",
            [
                series("up", T, "0x10"),
                series("up", T2, "1x10"),
                series("up", T3, "1 1 1 1 1 1 0 0 0 0 1"),
            ],
            [("4m", []), ("7m", [(T, 0)]), ("10m", [(T, 0)])],
        )
    ],
    "RdmaHcaTargetAbsent": [
        (
            "no plugin target at all fires after 15 minutes",
            [series("up", dict(job="node-exporter", instance="10.0.0.1:9100"), "1x20")],
            [("10m", []), ("16m", [(dict(app_kubernetes_io_name="ack-rdma-device-plugin"), 1)])],
        ),
        (
            "silent while kube-state-metrics says the DaemonSet runs on no node",
            [
                series(
                    "kube_daemonset_status_desired_number_scheduled",
                    dict(KSM, namespace="kube-system", daemonset="ack-rdma-dp-ds"),
                    "0x20",
                )
            ],
            [("16m", [])],
        ),
        (
            "silent while a plugin target is there, even down",
            [series("up", T, "0x20")],
            [("16m", [])],
        ),
    ],
    "RdmaHcaTargetMissingOnNode": [
        (
            "a plugin pod without a target fires; one with a target does not",
            [
                series(
                    "kube_pod_info",
                    dict(
                        KSM,
                        namespace="kube-system",
                        pod=T["pod"],
                        node="gpu-1",
                        created_by_kind="DaemonSet",
                        created_by_name="ack-rdma-dp-ds",
                    ),
                    "1x15",
                ),
                series(
                    "kube_pod_info",
                    dict(
                        KSM,
                        namespace="kube-system",
                        pod=T2["pod"],
                        node="gpu-2",
                        created_by_kind="DaemonSet",
                        created_by_name="ack-rdma-dp-ds",
                    ),
                    "1x15",
                ),
                series(
                    "kube_pod_info",
                    dict(
                        KSM,
                        namespace="kube-system",
                        pod="other-x",
                        node="gpu-2",
                        created_by_kind="DaemonSet",
                        created_by_name="node-exporter",
                    ),
                    "1x15",
                ),
                series("up", T, "1x15"),
            ],
            [
                ("5m", []),
                (
                    "11m",
                    [
                        (
                            dict(
                                KSM,
                                namespace="kube-system",
                                pod=T2["pod"],
                                node="gpu-2",
                                created_by_kind="DaemonSet",
                                created_by_name="ack-rdma-dp-ds",
                            ),
                            1,
                        )
                    ],
                ),
            ],
        )
    ],
    "RdmaHcaDaemonSetNotAvailable": [
        (
            "fewer available than desired for 15 minutes fires; a 10-minute rollout does not",
            [
                series(
                    "kube_daemonset_status_desired_number_scheduled",
                    dict(KSM, namespace="kube-system", daemonset="ack-rdma-dp-ds"),
                    "4x40",
                ),
                series(
                    "kube_daemonset_status_number_available",
                    dict(KSM, namespace="kube-system", daemonset="ack-rdma-dp-ds"),
                    "3x10 4x10 3x20",
                ),
            ],
            [
                ("9m", []),
                ("19m", []),
                ("33m", []),
                ("40m", [(dict(KSM, namespace="kube-system", daemonset="ack-rdma-dp-ds"), 3)]),
            ],
        )
    ],
    "RdmaHcaRestarting": [
        (
            "three restarts in 30 minutes fire; one does not",
            [
                series(
                    "process_start_time_seconds",
                    T,
                    "100 100 100 400 400 400 700 700 700 1000 1000 1000",
                ),
                series(
                    "process_start_time_seconds",
                    T2,
                    "100 100 100 400 400 400 400 400 400 400 400 400",
                ),
            ],
            [("5m", []), ("11m", [(T, 3)])],
        )
    ],
    "RdmaHcaPortDown": [
        (
            "a port down for 3 minutes fires; an up port does not",
            [
                series(
                    "rdma_hca_port_up",
                    dict(T, hca="mlx5_0", port="1", link_layer="Ethernet"),
                    "0x5",
                ),
                series(
                    "rdma_hca_port_up",
                    dict(T, hca="mlx5_1", port="1", link_layer="Ethernet"),
                    "1x5",
                ),
            ],
            [("1m", []), ("3m", [(dict(T, hca="mlx5_0", port="1", link_layer="Ethernet"), 0)])],
        )
    ],
    "RdmaHcaNotRegistered": [
        (
            "not registered for 6 minutes fires; registered does not",
            [
                series("rdma_hca_registered", dict(T, resource=R), "0x8"),
                series("rdma_hca_registered", dict(T2, resource=R), "1x8"),
            ],
            [("4m", []), ("6m", [(dict(T, resource=R), 0)])],
        )
    ],
    "RdmaHcaDevicesUnhealthy": [
        (
            "fewer healthy than advertised for 5 minutes fires",
            [
                series("rdma_hca_pool_devices", dict(T, resource=R), "1000x8"),
                series("rdma_hca_pool_devices_healthy", dict(T, resource=R), "990x8"),
                series("rdma_hca_pool_devices", dict(T2, resource=R), "1000x8"),
                series("rdma_hca_pool_devices_healthy", dict(T2, resource=R), "1000x8"),
            ],
            [("4m", []), ("6m", [(dict(T, resource=R), 990)])],
        )
    ],
    "RdmaHcaMissing": [
        (
            "an HCA gone for 3 minutes fires; one held does not",
            [
                series("rdma_hca_hca_missing", dict(T, resource=R, hca="mlx5_3"), "0 0 1 1 1 1 1"),
                series("rdma_hca_hca_missing", dict(T, resource=R, hca="mlx5_4"), "0x6"),
            ],
            [("3m", []), ("5m", [(dict(T, resource=R, hca="mlx5_3"), 1)])],
        )
    ],
    "RdmaHcaPortFlapping": [
        (
            "a change a minute fires; 4 changes in 15 minutes (4.003 through increase) do not",
            [
                series(
                    "rdma_hca_port_state_changes_total", dict(T, hca="mlx5_0", port="1"), "0+1x30"
                ),
                series(
                    "rdma_hca_port_state_changes_total",
                    dict(T, hca="mlx5_1", port="1"),
                    "0 1 2 3 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4",
                ),
                series(
                    "rdma_hca_port_state_changes_total",
                    dict(T, hca="mlx5_2", port="1"),
                    "0x10 1 2 3 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4 4",
                ),
            ],
            [
                ("4m", []),
                ("14m", [(dict(T, hca="mlx5_0", port="1"), 14)]),
                ("20m", [(dict(T, hca="mlx5_0", port="1"), 15)]),
            ],
        )
    ],
    "RdmaHcaLinkErrors": [
        (
            "180 errors an hour fire after 15 minutes; 60 do not",
            [
                *[
                    series(f"rdma_hca_port_{m}_total", dict(T, hca="mlx5_0", port="1"), v)
                    for m, v in (
                        ("symbol_errors", "0+3x90"),
                        ("link_error_recoveries", "0x90"),
                        ("local_link_integrity_errors", "0x90"),
                        ("receive_errors", "0x90"),
                    )
                ],
                *[
                    series(f"rdma_hca_port_{m}_total", dict(T, hca="mlx5_1", port="1"), v)
                    for m, v in (
                        ("symbol_errors", "0+1x90"),
                        ("link_error_recoveries", "0x90"),
                        ("local_link_integrity_errors", "0x90"),
                        ("receive_errors", "0x90"),
                    )
                ],
            ],
            [("40m", []), ("80m", [(dict(T, hca="mlx5_0", port="1"), 180)])],
        )
    ],
    "RdmaHcaAllocateErrors": [
        (
            "the first error fires (the series is there at 0); no errors do not",
            [
                series(
                    "rdma_hca_allocations_total",
                    dict(T, resource=R, result="error"),
                    "0 0 0 1 1 1 1 1 1 1",
                ),
                series("rdma_hca_allocations_total", dict(T, resource=R, result="ok"), "0+5x9"),
                series("rdma_hca_allocations_total", dict(T2, resource=R, result="error"), "0x9"),
            ],
            [("3m", []), ("5m", [(dict(T, resource=R, result="error"), 1)])],
        )
    ],
    "RdmaHcaSysfsStalled": [
        (
            "a stall fires; none do not",
            [
                series("rdma_hca_sysfs_stalls_total", T, "0 0 0 1 1 1 1 1 1 1"),
                series("rdma_hca_sysfs_stalls_total", T2, "0x9"),
            ],
            [("3m", []), ("5m", [(T, 1)])],
        )
    ],
    "RdmaHcaHealthLoopStalled": [
        (
            "a loop that stops, or never completes a pass, fires; a running one does not",
            [
                series("rdma_hca_health_last_pass_timestamp_seconds", T, "0+60x5 300x10"),
                series("rdma_hca_health_last_pass_timestamp_seconds", T2, "0+60x15"),
                series("rdma_hca_build_info", dict(T, version="0.1.0"), "1x15"),
                series("rdma_hca_build_info", dict(T2, version="0.1.0"), "1x15"),
                series("rdma_hca_build_info", dict(T3, version="0.1.0"), "1x15"),
            ],
            [("1m", []), ("12m", [(T, 420), (dict(T3, version="0.1.0"), 1)])],
        )
    ],
    "RdmaHcaCongestion": [
        (
            "2000 CNPs a second for 15 minutes fire; 500 do not",
            [
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_0", port="1", counter="np_cnp_sent"),
                    "0+120000x30",
                ),
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_1", port="1", counter="rp_cnp_handled"),
                    "0+30000x30",
                ),
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_1", port="1", counter="rx_write_requests"),
                    "0+900000x30",
                ),
            ],
            [
                ("10m", []),
                ("20m", [(dict(T, hca="mlx5_0", port="1", counter="np_cnp_sent"), 2000)]),
            ],
        )
    ],
    "RdmaHcaRetransmits": [
        (
            "15 retransmit events a second fire; 5 do not, nor CNPs",
            [
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_0", port="1", counter="out_of_sequence"),
                    "0+600x30",
                ),
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_0", port="1", counter="local_ack_timeout_err"),
                    "0+300x30",
                ),
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_1", port="1", counter="packet_seq_err"),
                    "0+300x30",
                ),
                series(
                    "rdma_hca_port_hw_events_total",
                    dict(T, hca="mlx5_1", port="1", counter="np_cnp_sent"),
                    "0+60000x30",
                ),
            ],
            [("8m", []), ("20m", [(dict(T, hca="mlx5_0", port="1"), 15)])],
        )
    ],
    "RdmaHcaDraNotRegistered": [
        (
            "not registered for 6 minutes fires; registered does not",
            [
                series("rdma_hca_dra_registered", T, "0x8"),
                series("rdma_hca_dra_registered", T2, "1x8"),
            ],
            [("4m", []), ("6m", [(T, 0)])],
        )
    ],
    "RdmaHcaDraSliceNotPublished": [
        (
            "publishing failing for 11 minutes fires; a short failure does not",
            [
                series("rdma_hca_dra_slice_published", T, "0x12"),
                series("rdma_hca_dra_slice_published", T2, "0x5 1x7"),
            ],
            [("8m", []), ("11m", [(T, 0)])],
        )
    ],
    "RdmaHcaDraPrepareErrors": [
        (
            "claims failing for 10 minutes fire and resolve once they stop; a one-off failure a "
            "retry fixed does not, nor OK claims",
            [
                series("rdma_hca_dra_prepare_total", dict(T, result="error"), "0x3 1+1x12 13x12"),
                series("rdma_hca_dra_prepare_total", dict(T, result="ok"), "0+5x24"),
                series("rdma_hca_dra_prepare_total", dict(T2, result="error"), "0x4 1x20"),
                series("rdma_hca_dra_prepare_total", dict(T2, result="ok"), "0x4 1x20"),
            ],
            [("12m", []), ("16m", [(dict(T, result="error"), 5)]), ("24m", [])],
        ),
        (
            "the first error of a driver counts: its series is there at 0 before it",
            [series("rdma_hca_dra_prepare_total", dict(T, result="error"), "0x2 1+1x15")],
            [("10m", []), ("14m", [(dict(T, result="error"), 5)])],
        ),
    ],
    "RdmaHcaDraPrepareCallsFailing": [
        (
            "the first failure fires though its series is new; other drivers and OK calls do not",
            [
                series(
                    "dra_grpc_operations_duration_seconds_count",
                    dict(
                        KUBELET,
                        driver_name="rdma-hca.io",
                        method_name=PREP,
                        grpc_status_code="Unavailable",
                    ),
                    "_x5 1x10",
                ),
                series(
                    "dra_grpc_operations_duration_seconds_count",
                    dict(
                        KUBELET, driver_name="rdma-hca.io", method_name=PREP, grpc_status_code="OK"
                    ),
                    "0+3x15",
                ),
                series(
                    "dra_grpc_operations_duration_seconds_count",
                    dict(
                        KUBELET,
                        driver_name="gpu.nvidia.com",
                        method_name=PREP,
                        grpc_status_code="Internal",
                    ),
                    "_x5 1x10",
                ),
            ],
            [
                ("4m", []),
                (
                    "6m",
                    [
                        (
                            dict(
                                KUBELET,
                                driver_name="rdma-hca.io",
                                method_name=PREP,
                                grpc_status_code="Unavailable",
                            ),
                            1,
                        )
                    ],
                ),
            ],
        ),
        (
            "later failures fire; an old failure does not once 15 minutes have passed",
            [
                series(
                    "dra_grpc_operations_duration_seconds_count",
                    dict(
                        KUBELET,
                        driver_name="rdma-hca.io",
                        method_name=PREP,
                        grpc_status_code="Unavailable",
                    ),
                    "1x20 2x20",
                )
            ],
            [
                ("18m", []),
                (
                    "25m",
                    [
                        (
                            dict(
                                KUBELET,
                                driver_name="rdma-hca.io",
                                method_name=PREP,
                                grpc_status_code="Unavailable",
                            ),
                            1,
                        )
                    ],
                ),
            ],
        ),
    ],
}


HEADER = """\
# promtool unit tests of the chart's alerts (files/alerts.yaml), a firing and a silent case
# for each. Written by scripts/gen-alert-tests.py: edit the cases there. rules.yaml is the
# PrometheusRule's spec as the chart renders it with its default values;
# tests/deploy/test_deploy_alert_rules.py renders it and runs
#   promtool test rules alerts_test.yaml
# next to it.
"""


def alert_tests() -> str:
    rules = {r["alert"]: r for g in filled_rules()["groups"] for r in g["rules"]}
    untested = sorted(set(rules) - set(CASES))
    if untested:
        raise SystemExit(f"no promtool case for {', '.join(untested)}")
    tests = []
    for alert, cases in CASES.items():
        rule = rules[alert]
        for what, inputs, checks in cases:
            evals = []
            for at, fired in checks:
                expected = []
                for labels, value in fired:
                    full = {**labels, **rule["labels"]}
                    expected.append(
                        {
                            "exp_labels": full,
                            "exp_annotations": {
                                k: render(v, full, value) for k, v in rule["annotations"].items()
                            },
                        }
                    )
                evals.append({"eval_time": at, "alertname": alert, "exp_alerts": expected})
            tests.append(
                {
                    "name": f"{alert}: {what}",
                    "interval": "1m",
                    "input_series": inputs,
                    "alert_rule_test": evals,
                }
            )
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str]) -> int:
    wanted = alert_tests()
    if "--check" in argv:
        if OUT.read_text() != wanted:
            print(f"{OUT} is out of date: run python scripts/gen-alert-tests.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
