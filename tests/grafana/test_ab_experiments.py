"""The A/B dashboard's experiment section: SRM banner, lift with a fixed / always-valid switch, n per arm,
the per-cell forest table; every query reads shipped recording rules (checked in test_dashboards.py) and
returns data against a real Prometheus (tests/deploy/test_prometheus_live.py)."""

from __future__ import annotations

import json
from pathlib import Path

BOARD = Path(__file__).resolve().parents[2] / "grafana" / "dashboards" / "rankwatch-ab.json"


def test_experiment_section() -> None:
    board = json.loads(BOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"experiment", "interval"} <= set(variables)
    assert variables["interval"]["query"].replace(" ", "") == "sequential,fixed"
    panels = {p["title"]: p for p in board["panels"]}
    srm = next(p for t, p in panels.items() if t.startswith("Sample ratio"))
    assert "rankwatch:experiment_srm:critical" in srm["targets"][0]["expr"]
    lift = next(p for t, p in panels.items() if t.startswith("Lift of $metric"))
    exprs = [t["expr"] for t in lift["targets"]]
    assert any('interval="$interval"' in e and ":lower" in e for e in exprs)
    assert any('interval="$interval"' in e and ":upper" in e for e in exprs)
    forest = next(p for t, p in panels.items() if t.startswith("Per segment x surface"))
    assert forest["type"] == "table" and "rankwatch ab --prometheus" in forest["description"]
    assert any("rankwatch:experiment_arm_requests:sum" in t["expr"] for p in board["panels"]
               for t in p.get("targets") or [])


def test_verdict_is_coloured() -> None:
    board = json.loads(BOARD.read_text())
    verdict = next(p for p in board["panels"] if p["title"].startswith("Verdict"))
    assert "rankwatch:experiment_verdict_interval:sign" in verdict["targets"][0]["expr"]
    mapping = verdict["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {v["text"]: v["color"] for v in mapping.values()} == {"worse": "red", "inconclusive": "text",
                                                                  "better": "green"}
