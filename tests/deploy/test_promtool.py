"""promtool on the shipped Prometheus files: the config and the rules are valid, and the rule unit tests
of deploy/prometheus/tests/ pass (each alert fires on a synthetic regression, stays quiet on noise and on
thin slices; recording rules equal values computed by hand)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))
UNIT_TESTS = sorted((PROM_DIR / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool")

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (scripts/test.sh installs Debian's prometheus)"),
]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, cwd=PROM_DIR, timeout=120)


def test_config_is_valid() -> None:
    result = _promtool("check", "config", PROM_DIR / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 rule files found" in result.stdout


def test_rules_are_valid() -> None:
    assert len(RULE_FILES) == 3
    result = _promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("unit_test", UNIT_TESTS, ids=lambda p: p.name)
def test_rule_unit_tests_pass(unit_test: Path) -> None:
    result = _promtool("test", "rules", unit_test)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_fail_when_an_alert_is_broken(tmp_path: Path) -> None:
    """The unit tests can fail: with the below-baseline margin at 50 %, the regression no longer fires."""
    rules = tmp_path / "rules"
    rules.mkdir()
    for path in RULE_FILES:
        text = path.read_text()
        if "rankwatch:alert_relative_margin:constant" in text:
            text = text.replace(
                "- record: rankwatch:alert_relative_margin:constant\n        expr: vector(0.10)",
                "- record: rankwatch:alert_relative_margin:constant\n        expr: vector(0.50)",
            )
            assert "vector(0.50)" in text
        (rules / path.name).write_text(text)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "quality-alerts.yml").write_text((PROM_DIR / "tests" / "quality-alerts.yml").read_text())
    result = _promtool("test", "rules", tests / "quality-alerts.yml")
    assert result.returncode != 0
    assert "RankwatchQualityBelowBaseline" in result.stdout + result.stderr


def test_every_alert_is_shown_firing_by_a_unit_test() -> None:
    alerts = {
        rule["alert"]
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }
    fired = {
        case["alertname"]
        for path in UNIT_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts, "no alerts found"
    assert alerts <= fired, f"alerts no unit test shows firing: {sorted(alerts - fired)}"
