"""The exporter's transfer gauges: values against numpy (polyfit for OLS, the corrected moments by hand),
the per-comparison points against the ledger, reload on change, a broken ledger keeping the last good
statistics and counting the failure, and the scheduler job and [transfer] config keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rankwatch.config import config_from_dict
from rankwatch.errors import ConfigError
from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.scheduling import TRANSFER_JOB, ExporterScheduler
from rankwatch.exporters.state import MetricsState
from rankwatch.exporters.transfer import TransferWatcher


def _ledger(path: Path, seed: int, slopes: dict[str, float], n: int = 12) -> list[dict]:
    rng = np.random.default_rng(seed)
    lines = []
    for seg, slope in slopes.items():
        for i in range(n):
            x = float(rng.normal(0.01, 0.01))
            lines.append({"experiment": f"e{i}", "candidate": f"v{i + 1}", "reference": f"v{i}", "segment": seg,
                          "surface": "all", "metric": "ndcg@10",
                          "offline": {"diff": x + float(rng.normal(0, 0.002)), "stderr": 0.002, "n": 5000},
                          "online": {"diff": slope * x + float(rng.normal(0, 3e-4)), "stderr": 3e-4, "n": 90000},
                          "recorded_at": "2026-01-01T00:00:00Z"})  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def _scrape(state: MetricsState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(build_registry(state)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("rankwatch_transfer"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


def test_gauges_against_numpy(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    lines = _ledger(path, 1, {"new_user": 0.8, "returning": 0.1})
    state = MetricsState()
    TransferWatcher([path], state, resamples=300).load_initial()
    got = _scrape(state)
    for seg in ("new_user", "returning"):
        rows = [ln for ln in lines if ln["segment"] == seg]
        x = np.array([r["offline"]["diff"] for r in rows])
        y = np.array([r["online"]["diff"] for r in rows])
        labels = {"metric": "ndcg@10", "segment": seg}
        assert got[_key("rankwatch_transfer_slope", **labels, estimator="ols")] == pytest.approx(np.polyfit(x, y, 1)[0])
        corrected = np.cov(x, y)[0, 1] / (np.var(x, ddof=1) - 0.002**2)
        assert got[_key("rankwatch_transfer_slope", **labels, estimator="corrected")] == pytest.approx(corrected)
        lo = got[_key("rankwatch_transfer_slope_lower", **labels)]
        hi = got[_key("rankwatch_transfer_slope_upper", **labels)]
        assert lo < corrected < hi
        assert got[_key("rankwatch_transfer_comparisons", **labels)] == len(rows)
        c = np.cov(x, y)
        corr = c[0, 1] / np.sqrt((c[0, 0] - 0.002**2) * (c[1, 1] - 3e-4**2))
        assert got[_key("rankwatch_transfer_correlation", **labels)] == pytest.approx(corr)
        assert _key("rankwatch_transfer_sign_agreement", **labels) in got
        for r in rows:
            point = {**labels, "experiment": r["experiment"], "candidate": r["candidate"]}
            assert got[_key("rankwatch_transfer_offline_diff", **point)] == r["offline"]["diff"]
            assert got[_key("rankwatch_transfer_online_diff", **point)] == r["online"]["diff"]
    assert got[_key("rankwatch_transfer_load_errors_total")] == 0


def test_reload_on_change_and_broken_ledger_keeps_last_good(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    _ledger(path, 2, {"new_user": 0.8})
    state = MetricsState()
    watcher = TransferWatcher([path], state, resamples=200)
    watcher.load_initial()
    assert watcher.reload() is False  # unchanged: nothing recomputed
    before = _scrape(state)
    _ledger(path, 3, {"new_user": 0.8, "returning": 0.2}, n=8)
    os.utime(path, ns=(1, 1))
    assert watcher.reload() is True
    after = _scrape(state)
    assert _key("rankwatch_transfer_comparisons", metric="ndcg@10", segment="returning") in after
    path.write_text(path.read_text() + "{not json\n")
    assert watcher.reload() is False
    broken = _scrape(state)
    assert broken[_key("rankwatch_transfer_load_errors_total")] == 1
    assert {k: v for k, v in broken.items() if "load_errors" not in k[0]} == {
        k: v for k, v in after.items() if "load_errors" not in k[0]
    }
    assert before != after
    assert watcher.reload() is False  # retried while broken: counted again
    assert _scrape(state)[_key("rankwatch_transfer_load_errors_total")] == 2


def test_missing_ledger_is_counted_not_fatal(tmp_path: Path) -> None:
    state = MetricsState()
    TransferWatcher([tmp_path / "none.jsonl"], state).load_initial()
    assert _scrape(state)[_key("rankwatch_transfer_load_errors_total")] == 1


def test_scheduler_job_and_config(tmp_path: Path) -> None:
    scheduler = ExporterScheduler(transfer=lambda: None, transfer_interval_s=1.0)
    assert TRANSFER_JOB in scheduler.job_ids
    cfg = config_from_dict({"kafka": {"bootstrap_servers": "localhost:9092"},
                            "transfer": {"ledgers": ["a.jsonl"], "reload_interval": "30s", "resamples": 500}},
                           base=tmp_path)  # fmt: skip
    assert cfg.transfer_ledgers == (tmp_path / "a.jsonl",)
    assert (cfg.transfer_reload_ms, cfg.transfer_resamples, cfg.transfer_seed) == (30_000, 500, 0)
    with pytest.raises(ConfigError, match="transfer.resamples"):
        config_from_dict({"kafka": {"bootstrap_servers": "x:1"}, "transfer": {"resamples": 0}})
