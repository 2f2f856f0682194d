"""The chart's values.schema.json allows exactly what the daemon's declaration allows.

Which chart value feeds which setting is read from the chart itself: the lines of the
``rdma.config`` template that copy a value into the daemon's config file, and the
DaemonSet's ``RDMA_HCA_*`` variables and ``--flag value`` arguments that copy one. For each
such pair the schema must give the same type, choices and range as the declaration, so a
value the chart accepts is never refused by the daemon (or the other way round).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rdma_hca.settings.decl import BY_KEY, LINK_LAYERS, SELECTOR_KEYS, Kind, Setting

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "ack-rdma-device-plugin"
# A template action that only copies one value: {{ .Values.a.b }} or {{ .Values.a.b | quote }}.
_COPY = re.compile(r"\{\{-?\s*(?:toYaml\s+)?\.Values\.([A-Za-z0-9_.]+)\s*"
                   r"(?:\|\s*(?:quote|nindent\s+\d+)\s*)?-?\}\}")
_KEY_LINE = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9]*):\s*(.*)$")


def _define(text: str, name: str) -> str:
    """The body of ``{{- define "name" -}}`` up to its own ``end``."""
    start = text.index(f'define "{name}"')
    body = text[text.index("}}", start) + 2:]
    depth = 0
    for m in re.finditer(r"\{\{-?\s*(if|with|range|define|end)\b", body):
        if m.group(1) == "end":
            if depth == 0:
                return body[: m.start()]
            depth -= 1
        else:
            depth += 1
    raise AssertionError(f"no end of define {name}")


def config_template_pairs(template: str) -> dict[str, str]:
    """Daemon key (dotted) -> chart value path, from the config file template."""
    pairs: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in template.splitlines():
        m = _KEY_LINE.match(line)
        if m:
            indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key))
            copied = _COPY.fullmatch(rest.strip())
            if copied:
                pairs[".".join(k for _, k in stack)] = copied.group(1)
            continue
        # `selectors:` followed by `{{- toYaml .Values.selectors | nindent 2 }}`.
        copied = _COPY.fullmatch(line.strip())
        if copied and stack:
            pairs[".".join(k for _, k in stack)] = copied.group(1)
    return pairs


def daemonset_pairs(daemonset: str) -> dict[str, str]:
    """Daemon key -> chart value path, from RDMA_HCA_* env entries and --flag arguments."""
    by_env = {e: s.key for s in BY_KEY.values() for e in s.env}
    by_flag = {s.flag: s.key for s in BY_KEY.values() if s.flag}
    pairs: dict[str, str] = {}
    lines = [ln.strip() for ln in daemonset.splitlines()]
    for here, after in itertools.pairwise(lines):
        env = re.fullmatch(r"- name:\s*(\S+)", here)
        value = re.fullmatch(r"value:\s*(.+)", after)
        if env and value and env.group(1) in by_env:
            copied = _COPY.fullmatch(value.group(1))
            if copied:
                pairs[by_env[env.group(1)]] = copied.group(1)
        flag = re.fullmatch(r"-\s*(--[a-z-]+)", here)
        arg = re.fullmatch(r"-\s*(.+)", after)
        if flag and arg and flag.group(1) in by_flag:
            copied = _COPY.fullmatch(arg.group(1))
            if copied:
                pairs[by_flag[flag.group(1)]] = copied.group(1)
    return pairs


def _schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return data


def schema_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.split("."):
        node = node["properties"][part]
        node = _deref(schema, node)
    return node


def _deref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        ref = node["$ref"].removeprefix("#/").split("/")
        target: Any = schema
        for part in ref:
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _types(node: dict[str, Any]) -> set[str]:
    t = node.get("type")
    return set(t) if isinstance(t, list) else {t}


def mismatches(setting: Setting, node: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What the chart's schema allows differently from the declaration."""
    out: list[str] = []
    kind = setting.kind
    want = {Kind.BOOL: {"boolean"}, Kind.INT: {"integer"}, Kind.FLOAT: {"number"},
            Kind.SELECTORS: {"object"}, Kind.POOLS: {"array"},
            # A quantity: "100G", or a bare number (helm's --set makes 0 an integer).
            Kind.BANDWIDTH: {"string", "integer"}}.get(kind, {"string"})
    # Every integer is a number: a number setting may say either.
    if kind is Kind.FLOAT and _types(node) == {"number", "integer"}:
        want = {"number", "integer"}
    # An enum's older spellings true/false are YAML booleans in a values file.
    old = {a for a, _ in setting.aliases}
    booleans = {True, False} if {"true", "false"} <= old else set()
    if booleans:
        want = want | {"boolean"}
    if _types(node) != want:
        out.append(f"type {sorted(_types(node))}, declared {sorted(want)}")
    allowed = set(setting.choices) | (old - {"true", "false"}) | booleans
    if kind is Kind.ENUM and set(node.get("enum", ())) != allowed:
        out.append(f"enum {node.get('enum')}, declared {sorted(map(str, allowed))}")
    if kind in (Kind.INT, Kind.FLOAT):
        low = 0 if setting.zero_off else setting.minimum
        if node.get("minimum") != low or node.get("maximum") != setting.maximum:
            out.append(f"range {node.get('minimum')}..{node.get('maximum')}, declared "
                       f"{low}..{setting.maximum}")
    if kind is Kind.PATH and setting.absolute and not node.get("pattern", "").startswith("^/"):
        out.append("the schema does not require an absolute path")
    if kind is Kind.DNS_NAME and setting.max_length and node.get("maxLength") not in (
            None, setting.max_length):
        out.append(f"maxLength {node.get('maxLength')}, declared {setting.max_length}")
    if kind is Kind.SELECTORS:
        props = node.get("properties", {})
        if set(props) != set(SELECTOR_KEYS):
            out.append(f"selector keys {sorted(props)}, declared {sorted(SELECTOR_KEYS)}")
        layers = _deref(schema, props.get("linkLayers", {})).get("items", {})
        if set(layers.get("enum", ())) != set(LINK_LAYERS):
            out.append(f"linkLayers {layers.get('enum')}, declared {list(LINK_LAYERS)}")
    return out


def chart_pairs() -> dict[str, str]:
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    pairs = config_template_pairs(_define(helpers, "rdma.config"))
    pairs.update(daemonset_pairs((CHART / "templates" / "daemonset.yaml").read_text()))
    return pairs


def test_the_chart_maps_its_values_onto_declared_settings() -> None:
    pairs = chart_pairs()
    # The settings every version of the chart has exposed; if none were found the parsing
    # above would be what broke, not the chart.
    assert {"resourceName", "rdmaHcaMax", "mode", "unhealthyWhen", "logFormat",
            "logLevel"} <= set(pairs), pairs
    unknown = sorted(set(pairs) - set(BY_KEY))
    assert not unknown, f"the chart writes keys the daemon does not declare: {unknown}"


def test_the_schema_allows_what_the_declaration_allows() -> None:
    schema = _schema()
    problems = []
    for key, path in sorted(chart_pairs().items()):
        node = schema_at(schema, path)
        problems += [f"{key} (chart value {path}): {p}"
                     for p in mismatches(BY_KEY[key], node, schema)]
    assert not problems, "\n".join(problems)


def test_the_chart_defaults_load_into_the_daemon(tmp_path: Path) -> None:
    """The chart's default values, copied as the template copies them, are valid settings."""
    from rdma_hca.settings.config import load_settings

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    config: dict[str, Any] = {}
    for key, path in chart_pairs().items():
        value: Any = values
        for part in path.split("."):
            value = value[part]
        # The template writes pools only when some are given (one pool otherwise).
        if BY_KEY[key].in_file and not (BY_KEY[key].kind is Kind.POOLS and not value):
            group, _, sub = key.rpartition(".")
            (config.setdefault(group, {}) if group else config)[sub] = value
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config))
    settings = load_settings(str(file), {}, {})
    assert settings.pools[0].resource_name == values["resourceName"]
    assert settings.warnings == ()


# --- the checker itself catches a drift -------------------------------------------------


@pytest.mark.parametrize(("key", "edit", "fragment"), [
    ("rdmaHcaMax", {"maximum": 99999}, "range"),
    ("mode", {"enum": ["shared"]}, "enum"),
    ("nonHostNetwork", {"type": "string"}, "type"),
    ("cdi.specDir", {"pattern": ".*"}, "absolute"),
])
def test_a_drifted_schema_is_caught(key: str, edit: dict[str, Any], fragment: str) -> None:
    schema = _schema()
    path = chart_pairs()[key]
    node = schema_at(schema, path)
    drifted = {**node, **edit}
    assert not mismatches(BY_KEY[key], node, schema)
    assert any(fragment in p for p in mismatches(BY_KEY[key], drifted, schema))


def test_template_parsing_finds_nested_and_block_values() -> None:
    template = (
        'resourceName: {{ .Values.resourceName | quote }}\n'
        '{{- if .Values.selectors }}\nselectors:\n  {{- toYaml .Values.selectors | nindent 2 }}\n'
        '{{- end }}\n'
        'nonHostNetwork: {{ .Values.nonHostNetwork.enabled }}\n'
        'metricsAddress: {{ ternary "a" "b" .Values.metrics.enabled | quote }}\n'
        'dra:\n  enabled: {{ .Values.dra.enabled }}\n'
    )
    assert config_template_pairs(template) == {
        "resourceName": "resourceName", "selectors": "selectors",
        "nonHostNetwork": "nonHostNetwork.enabled", "dra.enabled": "dra.enabled"}
    ds = ("args:\n  - --kubelet-root\n  - {{ .Values.kubeletDir | quote }}\n"
          "env:\n  - name: RDMA_HCA_HTTP_MAX_CONNECTIONS\n"
          "    value: {{ .Values.http.maxConnections | quote }}\n")
    assert daemonset_pairs(ds) == {"kubeletRoot": "kubeletDir",
                                   "http.maxConnections": "http.maxConnections"}
