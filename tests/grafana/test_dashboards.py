"""The committed dashboards are exactly the generator's output, and they are consistent with the rules,
the provisioning and their own template variables."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
RULES = REPO / "deploy" / "prometheus" / "rules"


def _generator() -> Any:
    if str(GRAFANA) not in sys.path:
        sys.path.insert(0, str(GRAFANA))
    return importlib.import_module("rankwatch_grafana")


def _boards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p.get("targets") or []]


def test_committed_json_equals_the_generator_output() -> None:
    generator = _generator()
    from rankwatch_grafana.common import to_json

    rendered = {name: to_json(build()) for name, build in generator.DASHBOARDS.items()}
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert rendered == committed, "run: python grafana/generate.py"


def test_generate_check_mode_agrees() -> None:
    result = subprocess.run(
        [sys.executable, str(GRAFANA / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_the_grafana_folder_does_not_shadow_the_sdk() -> None:
    import grafana_foundation_sdk

    assert "site-packages" in grafana_foundation_sdk.__file__ or "dist-packages" in grafana_foundation_sdk.__file__
    assert not (GRAFANA / "__init__.py").exists()


def test_overview_has_the_promised_variables_and_sections() -> None:
    board = _boards()["rankwatch-overview.json"]
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"segment", "surface", "variant", "metric", "window"} <= variables
    titles = " | ".join(p["title"] for p in board["panels"])
    for needle in ("online vs offline", "drift", "AUC-ROC", "AUC-PR", "Requests", "Worst", "lag", "Watermark",
                   "Rejects by reason", "Pending requests"):  # fmt: skip
        assert needle in titles, needle
    assert any(p["type"] == "table" and "Worst" in p["title"] for p in board["panels"])


def test_ab_shows_variants_side_by_side() -> None:
    board = _boards()["rankwatch-ab.json"]
    exprs = _exprs(board)
    assert any('variant!="all"' in e for e in exprs)
    repeated = [p for p in board["panels"] if p.get("repeat") == "metric"]
    assert repeated and repeated[0]["type"] == "row"


def test_panel_ids_are_unique_and_every_variable_used_is_defined() -> None:
    for name, board in _boards().items():
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        defined = {v["name"] for v in board["templating"]["list"]}
        text = json.dumps(board["panels"])
        used = set(re.findall(r"\$(?:\{)?([a-z_]+)", text)) - {"__all", "__rate_interval", "__interval"}
        assert used <= defined, (name, used - defined)


def test_every_recorded_series_a_panel_reads_is_a_shipped_recording_rule() -> None:
    recorded = {
        rule["record"]
        for path in RULES.glob("*.yml")
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    for name, board in _boards().items():
        for expr in _exprs(board):
            for series in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", expr):
                assert series in recorded, (name, series)


def test_panels_use_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "rankwatch.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    for name, board in _boards().items():
        ds_var = next(v for v in board["templating"]["list"] if v["name"] == "datasource")
        assert ds_var["current"]["value"] == uid, name
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, panel["title"])
