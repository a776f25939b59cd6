"""Seeded coverage simulation (a short bench/coverage.py): 95 % intervals cover the truth 93-97 % of the time."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_BENCH = Path(__file__).resolve().parents[3] / "bench" / "coverage.py"


def _load_bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rankwatch_bench_coverage", _BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def small_window_coverage():  # type: ignore[no-untyped-def]
    bench = _load_bench()
    rng = np.random.default_rng(20261201)
    truth = bench.truth(rng, "default", 300_000)
    return bench, bench.coverage(rng, "default", 50, 2000, truth)


@pytest.mark.parametrize("metric", ["mrr", "ndcg@10", "map@10", "auc_roc", "auc_pr"])
def test_logit_intervals_cover_93_to_97_percent_on_50_request_windows(small_window_coverage, metric) -> None:
    _, cov = small_window_coverage
    assert cov.windows == 2000
    assert 93.0 <= cov.percent(f"{metric}/logit") <= 97.0, cov.hits
