"""Static properties of the shipped alerting rules: annotations, runbooks, thresholds in one place."""

from __future__ import annotations

import re
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules"
ALERTS_DOC = REPO / "docs" / "alerts.md"
SLICE_LABELS = ("segment", "surface", "variant")


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in sorted(RULES.glob("*.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def _doc_anchors() -> set[str]:
    """GitHub-style anchors of the markdown headings of docs/alerts.md."""
    anchors = set()
    for line in ALERTS_DOC.read_text().splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            text = m.group(1).strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", text).replace(" ", "-"))
    return anchors


def test_every_alert_has_summary_description_severity_and_a_runbook_section() -> None:
    anchors = _doc_anchors()
    alerts = _alerts()
    assert len(alerts) >= 8
    for alert in alerts:
        name = alert["alert"]
        annotations = alert.get("annotations", {})
        assert annotations.get("summary"), name
        assert annotations.get("description"), name
        assert alert.get("labels", {}).get("severity") in {"critical", "warning"}, name
        url = annotations.get("runbook_url", "")
        assert url == f"docs/alerts.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/alerts.md has no section for {name}"


def test_slice_alerts_name_the_slice_in_summary_and_description() -> None:
    for alert in _alerts():
        expr = alert["expr"]
        if "segment_surface_variant:" not in expr:
            continue
        for text in (alert["annotations"]["summary"], alert["annotations"]["description"]):
            for label in SLICE_LABELS:
                assert f"{{{{ $labels.{label} }}}}" in text, (alert["alert"], label)


def test_quality_alerts_read_their_thresholds_from_one_place() -> None:
    constants = {r["record"]: r["expr"] for r in _rules() if r.get("record", "").endswith(":constant")}
    assert set(constants) == {
        "rankwatch:alert_relative_margin:constant",
        "rankwatch:alert_auc_margin:constant",
        "rankwatch:alert_sudden_drop_margin:constant",
        "rankwatch:alert_min_requests:constant",
        "rankwatch:alert_sudden_drop_min_requests:constant",
        "rankwatch:alert_confidence_level:constant",
        "rankwatch:alert_confidence_z:constant",
        "rankwatch:interval_z:constant",
        "rankwatch:alert_score_psi:constant",
        "rankwatch:alert_score_min_items:constant",
        "rankwatch:alert_transfer_slope_floor:constant",
        "rankwatch:alert_transfer_min_comparisons:constant",
    }
    assert all(re.fullmatch(r"vector\([0-9.]+\)", e) for e in constants.values())
    level = float(constants["rankwatch:alert_confidence_level:constant"][7:-1])
    z = float(constants["rankwatch:alert_confidence_z:constant"][7:-1])
    assert z == pytest.approx(NormalDist().inv_cdf(level), abs=1e-6)  # one-sided quantile of the level
    assert float(constants["rankwatch:interval_z:constant"][7:-1]) == pytest.approx(NormalDist().inv_cdf(0.975), abs=1e-6)
    by_name = {a["alert"]: a["expr"] for a in _alerts()}
    for name in ("RankwatchQualityBelowBaseline", "RankwatchAUCDrop", "RankwatchQualitySuddenDrop"):
        expr = by_name[name]
        assert re.search(r"scalar\(rankwatch:alert_(sudden_drop_)?min_requests:constant\)", expr), name
        assert "rankwatch_ranking_requests" in expr, name
        # No bare numeric threshold hides in these expressions besides 1 (as in 1 - margin) and 0 (the
        # sign of an interval bound).
        numbers = set(re.findall(r"(?<![\w:.@])\d+(?:\.\d+)?(?![\w.])", expr))
        assert numbers <= {"0", "1"}, (name, numbers)
    for name in ("RankwatchQualityBelowBaseline", "RankwatchAUCDrop"):  # evidence: significant and material
        assert "scalar(rankwatch:alert_confidence_z:constant)" in by_name[name], name
        assert "rankwatch_ranking_quality_drift:stderr" in by_name[name], name
    score = by_name["RankwatchScoreDistributionShift"]  # both constants, no bare threshold
    assert "scalar(rankwatch:alert_score_psi:constant)" in score
    assert "scalar(rankwatch:alert_score_min_items:constant)" in score
    assert set(re.findall(r"(?<![\w:.@])\d+(?:\.\d+)?(?![\w.])", score.replace('"5m"', ""))) == set()


def test_every_recording_rule_follows_level_metric_operations() -> None:
    for rule in _rules():
        if "record" in rule:
            assert re.fullmatch(r"[a-z_]+:[a-z_]+:[a-z0-9_]+", rule["record"]), rule["record"]
