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


MUTATIONS = {
    # significance off: the thin noisy slice fires
    "no significance": ("- record: rankwatch:alert_confidence_z:constant\n        expr: vector(3.090232)",
                        "- record: rankwatch:alert_confidence_z:constant\n        expr: vector(0)"),
    # materiality off: the thick slice 1.7 % below (significant, not material) fires
    "no relative margin": ("- record: rankwatch:alert_relative_margin:constant\n        expr: vector(0.03)",
                           "- record: rankwatch:alert_relative_margin:constant\n        expr: vector(0)"),
    "no AUC margin": ("- record: rankwatch:alert_auc_margin:constant\n        expr: vector(0.02)",
                      "- record: rankwatch:alert_auc_margin:constant\n        expr: vector(0)"),
    # a margin too large: the 5 % regression of the thick slice no longer fires
    "margin 50 %": ("- record: rankwatch:alert_relative_margin:constant\n        expr: vector(0.03)",
                    "- record: rankwatch:alert_relative_margin:constant\n        expr: vector(0.50)"),
    # no floor: the 10-request slice fires
    "no floor": ("- record: rankwatch:alert_min_requests:constant\n        expr: vector(30)",
                 "- record: rankwatch:alert_min_requests:constant\n        expr: vector(0)"),
    # no for: the 40-minute dip of the thick slice fires
    "no for": ("            >= scalar(rankwatch:alert_min_requests:constant)\n        for: 75m",
               "            >= scalar(rankwatch:alert_min_requests:constant)\n        for: 0m"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_unit_tests_fail_when_a_quality_alert_condition_is_removed(tmp_path: Path, mutation: str) -> None:
    """Each condition of the evidence-based quality alerts bites: without it, quality-alerts.yml fails."""
    before, after = MUTATIONS[mutation]
    rules = tmp_path / "rules"
    rules.mkdir()
    changed = 0
    for path in RULE_FILES:
        text = path.read_text()
        changed += text.count(before)
        (rules / path.name).write_text(text.replace(before, after))
    assert changed >= 1, mutation
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "quality-alerts.yml").write_text((PROM_DIR / "tests" / "quality-alerts.yml").read_text())
    result = _promtool("test", "rules", tests / "quality-alerts.yml")
    assert result.returncode != 0, mutation
    assert "Rankwatch" in result.stdout + result.stderr


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
