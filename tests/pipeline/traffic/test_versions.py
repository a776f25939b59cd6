"""Model versions with a known transfer: deterministic per version, the all-segments line is the mean of the
segments', and over many versions the corrected slope finds each segment's true slope while OLS is attenuated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rankwatch.pipeline.traffic.versions import VersionTransfer, version_comparison, version_truth

AT = "2026-01-01T00:00:00Z"


def test_a_version_does_not_depend_on_the_others_and_the_all_line_is_the_mean() -> None:
    cfg = VersionTransfer(seed=3)
    a, b = version_comparison(cfg, 5, recorded_at=AT), version_comparison(cfg, 5, recorded_at=AT)
    assert a == b and a != version_comparison(cfg, 6, recorded_at=AT)
    assert [e.segment for e in a] == ["new_user", "returning", "power_user", "all"]
    assert {(e.candidate, e.reference, e.experiment, e.surface, e.metric, e.recorded_at) for e in a} == {
        ("ranker-v5", "ranker-v4", "ranker-v5", "all", "ndcg@10", AT)}
    segs, whole = a[:3], a[3]
    assert whole.offline.diff == pytest.approx(sum(e.offline.diff for e in segs) / 3)
    assert whole.online.diff == pytest.approx(sum(e.online.diff for e in segs) / 3)
    assert whole.offline.stderr == pytest.approx(math.sqrt(sum(e.offline.stderr ** 2 for e in segs)) / 3)
    assert whole.online.stderr == pytest.approx(math.sqrt(sum(e.online.stderr ** 2 for e in segs)) / 3)
    for e in segs:
        assert 0.003 <= e.offline.stderr <= 0.007 and 0.001 <= e.online.stderr <= 0.003
    with pytest.raises(ValueError, match="version index"):
        version_comparison(cfg, 0, recorded_at=AT)


def test_truth_is_the_slope_times_the_true_offline_difference_plus_scatter() -> None:
    cfg = VersionTransfer(seed=1, scatter=0.0)
    for k in range(1, 20):
        for seg, (xi, online) in version_truth(cfg, k).items():
            assert online == pytest.approx(cfg.slopes[seg] * xi, abs=1e-15)


def test_many_versions_recover_the_true_slopes() -> None:
    """Oracle: the textbook moments of 600 versions (independent of pipeline.transfer.statistics)."""
    cfg = VersionTransfer(seed=11)
    lines = [e for k in range(1, 601) for e in version_comparison(cfg, k, recorded_at=AT)]
    for seg, truth in cfg.slopes.items():
        rows = [e for e in lines if e.segment == seg]
        x = np.array([e.offline.diff for e in rows])
        y = np.array([e.online.diff for e in rows])
        sx2 = np.mean([e.offline.stderr ** 2 for e in rows])
        s_xy = np.cov(x, y, ddof=1)[0, 1]
        corrected = s_xy / (np.var(x, ddof=1) - sx2)
        ols = s_xy / np.var(x, ddof=1)
        assert corrected == pytest.approx(truth, abs=0.08)
        if truth > 0:
            assert ols < 0.9 * truth  # offline noise attenuates OLS (reliability about 0.8)


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match="offline_se"):
        VersionTransfer(offline_se=(0.0, 0.1))
    with pytest.raises(ValueError, match="slopes"):
        VersionTransfer(slopes={})
