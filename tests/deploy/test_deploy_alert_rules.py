"""The chart's alert rules under promtool: `check rules` and the unit tests of
tests/deploy/alerts/alerts_test.yaml (a firing and a silent case for every alert, written by
scripts/gen-alert-tests.py).

promtool comes from Debian's `prometheus` package (`.ci/run` installs it where it is
missing). The rules are the PrometheusRule's spec as helm renders it, so what is tested is
what a cluster gets, thresholds and runbook links filled in.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import REPO, WITH_PROMETHEUS_OPERATOR, RenderFn
from test_deploy_chart import one

ALERT_TESTS = Path(__file__).parent / "alerts" / "alerts_test.yaml"
ALL_ON = {"metrics.prometheusRule.enabled": "true"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed: it comes with Debian's prometheus package "
                    "(apt-get install -y prometheus; .ci/run installs it where missing)")
    return found


def rendered_rules(render: RenderFn, values: dict[str, str] | None = None) -> dict[str, Any]:
    objs = render({**ALL_ON, **(values or {})}, api_versions=WITH_PROMETHEUS_OPERATOR)
    spec: dict[str, Any] = one(objs, "PrometheusRule")["spec"]
    return spec


def run(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_promtool_checks_the_rendered_rules(promtool: str, render: RenderFn,
                                            tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules(render)))
    result = run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_passes_its_promtool_unit_tests(promtool: str, render: RenderFn,
                                                    tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules(render)))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_unit_tests_fail_on_a_broken_rule(promtool: str, render: RenderFn,
                                              tmp_path: Path) -> None:
    # The same tests against rules with one threshold moved: promtool must notice, or the
    # suite above proves nothing.
    rules = rendered_rules(render, {"metrics.prometheusRule.thresholds.congestionCnpPerSecond":
                                    "5000"})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "RdmaHcaCongestion" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case(render: RenderFn) -> None:
    alerts = {r["alert"] for g in rendered_rules(render)["groups"] for r in g["rules"]}
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for test in tests:
        for check in test["alert_rule_test"]:
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    assert not alerts - firing, f"no firing case for {sorted(alerts - firing)}"
    assert not alerts - silent, f"no silent case for {sorted(alerts - silent)}"
    assert not (firing | silent) - alerts, "tests of alerts the chart does not have"


def test_the_unit_tests_are_what_the_script_writes() -> None:
    result = subprocess.run([sys.executable, "scripts/gen-alert-tests.py", "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
