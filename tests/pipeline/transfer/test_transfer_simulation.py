"""Seeded simulation (a short bench/transfer_simulation.py): with offline noise, OLS is attenuated toward 0
while the corrected slope's jackknife t interval covers the true slope close to 95 % of the time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from rankwatch.pipeline.transfer.bootstrap import bootstrap_transfer
from rankwatch.pipeline.transfer.statistics import moments, slope_ols

_BENCH = Path(__file__).resolve().parents[3] / "bench" / "transfer_simulation.py"


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rankwatch_bench_transfer_simulation", _BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_corrected_interval_covers_and_ols_is_biased() -> None:
    bench = _bench()
    rng = np.random.default_rng(2026)
    truth, covered, ols = 1.0, 0, []
    for s in range(200):
        x, y, sx, sy = bench.simulate_ledger(rng, 40, truth)
        ols.append(slope_ols(moments(x, y, sx, sy)))
        interval = bootstrap_transfer(x, y, sx, sy, resamples=1000, seed=s).slope_corrected.interval
        covered += interval is not None and interval[0] <= truth <= interval[1]
    assert 0.90 <= covered / 200 <= 0.99
    assert np.mean(ols) < 0.8 * truth  # reliability about 0.65
