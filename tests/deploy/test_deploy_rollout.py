"""A rolling update as the cluster runs it: the API server's pod defaulting and the
scheduler's host-port filter, applied to the old pod and the surge pod helm renders.

With DRA alone the chart surges (maxSurge 1, maxUnavailable 0): the new pod must fit on the
node beside the old one, or the rollout never ends. On the host network the API server
turns every containerPort into a hostPort (pkg/apis/core/v1 defaults), and the scheduler's
NodePorts filter refuses a pod whose (protocol, host IP, port) is taken on the node, 0.0.0.0
meeting every address. Each instance must also be probed on its own, not on a port both
share, and the PodMonitor must still find a target for each pod.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest
from deploy_support import WITH_PROMETHEUS_OPERATOR, RenderFn
from test_deploy_chart import one, pod_spec
from test_deploy_monitoring import POD_MONITOR

from rdma_hca.tools.probe import DEFAULT_TIMEOUT

ALONE = {"dra.enabled": "true", "devicePlugin.enabled": "false"}
BESIDE = {"dra.enabled": "true", "selectors.names[0]": "mlx5_0",
          "dra.selectors.names[0]": "mlx5_2"}
# What changes between the two renders: any value that changes the pod template.
UPGRADE = {"logLevel": "debug"}

HostPort = tuple[str, str, int]  # protocol, host IP, port


def apiserver_defaults(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it, for what the scheduler's port filter reads."""
    pod = copy.deepcopy(pod)
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        for port in c.get("ports") or []:
            port.setdefault("protocol", "TCP")
            if pod.get("hostNetwork") and not port.get("hostPort"):
                port["hostPort"] = port["containerPort"]
    return pod


def host_ports(pod: dict[str, Any]) -> list[HostPort]:
    return [(p["protocol"], p.get("hostIP") or "0.0.0.0", p["hostPort"])
            for c in [*pod.get("initContainers", []), *pod["containers"]]
            for p in c.get("ports") or [] if p.get("hostPort")]


def port_conflicts(new: dict[str, Any], running: list[dict[str, Any]]) -> list[HostPort]:
    """The wanted host ports of ``new`` that pods already on the node hold."""
    used = [hp for pod in running for hp in host_ports(pod)]
    return [want for want in host_ports(new) for have in used
            if want[0] == have[0] and want[2] == have[2]
            and (want[1] == have[1] or "0.0.0.0" in (want[1], have[1]))]


def rendered_pods(render: RenderFn, values: dict[str, str]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the old pod, the surge pod) as the API server stores them."""
    old = apiserver_defaults(pod_spec(render(values)))
    new = apiserver_defaults(pod_spec(render({**values, **UPGRADE})))
    return old, new


def test_the_rules_catch_a_host_port_conflict() -> None:
    """The emulation itself: a hostNetwork pod's containerPort is a host port, and a second
    such pod is refused on the node, unless the addresses tell them apart."""
    pod = {"hostNetwork": True, "containers": [{"ports": [{"containerPort": 9478}]}]}
    stored = apiserver_defaults(pod)
    assert stored["containers"][0]["ports"] == [
        {"containerPort": 9478, "protocol": "TCP", "hostPort": 9478}]
    assert port_conflicts(stored, [stored]) == [("TCP", "0.0.0.0", 9478)]
    udp = apiserver_defaults({**pod, "containers": [{"ports": [
        {"containerPort": 9478, "protocol": "UDP"}]}]})
    assert port_conflicts(udp, [stored]) == []
    a, b = (apiserver_defaults({"hostNetwork": True, "containers": [{"ports": [
        {"containerPort": 9478, "hostIP": ip}]}]}) for ip in ("10.0.0.1", "10.0.0.2"))
    assert port_conflicts(a, [b]) == []
    assert port_conflicts(a, [a]) == [("TCP", "10.0.0.1", 9478)]
    assert port_conflicts(a, [stored]) == [("TCP", "10.0.0.1", 9478)]
    assert port_conflicts(apiserver_defaults({"containers": pod["containers"]}), [stored]) == []


@pytest.mark.parametrize("extra", [{}, {"metrics.enabled": "false"},
                                   {"metrics.podMonitor.enabled": "true"}],
                         ids=["defaults", "no-metrics", "pod-monitor"])
def test_with_dra_alone_the_surge_pod_fits_beside_the_old_one(
        render: RenderFn, extra: dict[str, str]) -> None:
    values = {**ALONE, **extra}
    objs = render(values)
    assert one(objs, "DaemonSet")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    old, new = rendered_pods(render, values)
    assert old["hostNetwork"] is True and new["hostNetwork"] is True
    assert port_conflicts(new, [old]) == []


def test_with_the_device_plugin_the_old_pod_goes_first(render: RenderFn) -> None:
    """The host port stays there (two device plugins on a node would take each other's
    socket anyway): no surge, so the conflict never meets the scheduler."""
    for values in ({}, BESIDE):
        old, new = rendered_pods(render, values)
        assert port_conflicts(new, [old]) == [("TCP", "0.0.0.0", 9478)]
        strategy = one(render(values), "DaemonSet")["spec"]["updateStrategy"]
        assert strategy["rollingUpdate"].get("maxSurge", 0) == 0
        assert strategy["rollingUpdate"]["maxUnavailable"] >= 1


def _probe_targets(probe: dict[str, Any]) -> set[str]:
    """How a probe reaches its pod: exec (inside it), or a port on its network."""
    return set(probe) & {"exec", "httpGet", "tcpSocket", "grpc"}


def test_with_dra_alone_each_instance_is_probed_on_its_own(render: RenderFn) -> None:
    (c,) = pod_spec(render(ALONE))["containers"]
    for kind, endpoint in (("livenessProbe", "healthz"), ("readinessProbe", "readyz")):
        probe = c[kind]
        # A port of a hostNetwork pod is the node's: either instance may hold it.
        assert _probe_targets(probe) == {"exec"}
        assert probe["exec"]["command"] == ["python", "-m", "rdma_hca.tools.probe", endpoint]
        # The probe gives up first, with its own line, before the kubelet's timeout.
        assert probe["timeoutSeconds"] > DEFAULT_TIMEOUT
    # The probe socket is named after the pod's UID, in the pod's own /tmp.
    (uid,) = [e for e in c["env"] if e["name"] == "POD_UID"]
    assert uid["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    (vol,) = [v for v in pod_spec(render(ALONE))["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in vol


# CPU of one `python -m rdma_hca.tools.probe` call, measured on a busy machine (a third
# of it was the probe's own imports before they were cut; docs/dra.md has the figures).
EXEC_PROBE_CPU_MS = 22.0


def test_with_dra_alone_the_exec_probes_take_under_a_third_of_the_cpu_request(
        render: RenderFn) -> None:
    (c,) = pod_spec(render(ALONE))["containers"]
    request = c["resources"]["requests"]["cpu"]
    assert request.endswith("m")
    per_second = sum(EXEC_PROBE_CPU_MS / c[kind]["periodSeconds"]
                     for kind in ("livenessProbe", "readinessProbe") if "exec" in c[kind])
    assert per_second < int(request[:-1]) / 3, (per_second, request)


def test_with_the_device_plugin_the_probes_stay_http(render: RenderFn) -> None:
    (c,) = pod_spec(render({}))["containers"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


@pytest.mark.parametrize("pod_ip", ["10.1.2.3", "fd00::7"])
def test_the_pod_monitor_finds_each_dra_alone_pod_without_a_declared_port(
        render: RenderFn, pod_ip: str) -> None:
    """Prometheus' pod discovery gives a container without ports one target at the pod's
    IP; the PodMonitor's relabelings must add the metrics port, IPv4 and IPv6 alike."""
    values = {**ALONE, "metrics.podMonitor.enabled": "true", "metrics.port": "9555"}
    objs = render(values, api_versions=WITH_PROMETHEUS_OPERATOR)
    jsonschema.validate(one(objs, "PodMonitor"), POD_MONITOR)
    (endpoint,) = one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert "port" not in endpoint  # no named port to match: the pod declares none
    labels = {"__address__": pod_ip, "__meta_kubernetes_pod_ip": pod_ip,
              "__meta_kubernetes_pod_node_name": "n1"}
    for rule in endpoint["relabelings"]:  # Prometheus' replace action, anchored regexes
        source = ";".join(labels.get(s, "") for s in rule.get("sourceLabels", []))
        m = re.fullmatch(rule.get("regex", "(.*)"), source)
        if m is not None:
            labels[rule["targetLabel"]] = m.expand(
                rule.get("replacement", "$1").replace("$", "\\"))
    want = f"[{pod_ip}]:9555" if ":" in pod_ip else f"{pod_ip}:9555"
    assert labels["__address__"] == want
    assert labels["node"] == "n1" and labels["endpoint"] == "metrics"
    # With the device plugin the named port stays.
    (dp,) = one(render({"metrics.podMonitor.enabled": "true"},
                       api_versions=WITH_PROMETHEUS_OPERATOR),
                "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert dp["port"] == "metrics"
