"""Paired offline differences against naive loops: per-request metrics from naive_metrics, a dict of requests
per model, statistics.stdev for the standard error, and DeLong's paired variance from explicit pairwise
placements (an O(m n) loop)."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from naive_metrics import auc_roc, order_by_score, request_metrics

from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.readers import model_key, read_evaluation_files, split_model_key
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.transfer.paired import delong_paired, paired_differences, paired_mean


def naive_delong(sc: list[float], sr: list[float], rel: list[bool]) -> tuple[float, float]:
    """DeLong's paired difference and its standard error with explicit placements."""

    def psi(a: float, b: float) -> float:
        return 1.0 if a > b else 0.5 if a == b else 0.0

    pos = [i for i, r in enumerate(rel) if r]
    neg = [i for i, r in enumerate(rel) if not r]
    m, n = len(pos), len(neg)
    v10 = [[sum(psi(s[i], s[j]) for j in neg) / n for i in pos] for s in (sc, sr)]
    v01 = [[sum(psi(s[i], s[j]) for i in pos) / m for j in neg] for s in (sc, sr)]

    def cov(a: list[float], b: list[float]) -> float:
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        return sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True)) / (len(a) - 1)

    var = 0.0
    for comps, size in ((v10, m), (v01, n)):
        var += (cov(comps[0], comps[0]) + cov(comps[1], comps[1]) - 2 * cov(comps[0], comps[1])) / size
    diff = sum(v10[0]) / m - sum(v10[1]) / m
    return diff, math.sqrt(var)


def test_paired_mean_against_statistics() -> None:
    d = [0.3, -0.1, 0.25, 0.0, 0.4]
    got = paired_mean(d)
    assert got.n_pairs == 5
    assert got.diff == pytest.approx(statistics.fmean(d), abs=1e-15)
    assert got.stderr == pytest.approx(statistics.stdev(d) / math.sqrt(5), rel=1e-12)
    assert paired_mean([0.2]).stderr is None
    assert paired_mean([]).diff is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_delong_paired_against_placements(seed: int) -> None:
    rng = random.Random(seed)
    rel = [rng.random() < 0.3 for _ in range(60)]
    sc = [round(rng.gauss(1.0 if r else 0.0, 1.0), 1) for r in rel]  # rounded: ties on purpose
    sr = [round(s * 0.5 + rng.gauss(0, 0.8), 1) for s in sc]
    a_c, a_r, got = delong_paired(sc, sr, rel)
    diff, se = naive_delong(sc, sr, rel)
    assert a_c == pytest.approx(auc_roc(sc, rel), abs=1e-12)
    assert a_r == pytest.approx(auc_roc(sr, rel), abs=1e-12)
    assert got.diff == pytest.approx(diff, abs=1e-12)
    assert got.stderr == pytest.approx(se, rel=1e-9)


def test_delong_paired_undefined_without_both_classes() -> None:
    assert delong_paired([0.1, 0.2], [0.3, 0.1], [True, True])[2].diff is None


def test_model_key_round_trip() -> None:
    rid = pd.Series(["r1", "r2", None, ""], dtype=object)
    keyed = model_key(rid, pd.Series(["a", "b", "a", "b"]))
    assert list(keyed[:2]) == ["a\x1fr1", "b\x1fr2"]
    assert pd.isna(keyed[2]) and keyed[3] == ""
    assert list(split_model_key(keyed[:2])) == ["r1", "r2"]


def _rows(seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for r in range(120):
        seg = rng.choice(["new_user", "returning"])
        labels = [rng.choice([0, 0, 0, 1, 2]) if rng.random() < 0.8 else 0 for _ in range(rng.randint(2, 8))]
        models = ["v1", "v2"] if r % 10 else [rng.choice(["v1", "v2"])]  # some requests scored by one model
        for model in models:
            for i, lab in enumerate(labels):
                score = lab * (0.6 if model == "v2" else 0.3) + rng.gauss(0, 1)  # no ties: row order is shuffled
                rows.append({"request_id": f"q{r}", "item_id": f"i{i}", "score": score, "label": lab,
                             "segment": seg, "model": model})  # fmt: skip
    return rows


def _naive(rows: list[dict[str, object]], seg: str | None, zero: bool) -> dict[str, tuple[int, float, float | None]]:
    lists: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
    segment: dict[str, str] = {}
    for row in rows:
        lists.setdefault((str(row["model"]), str(row["request_id"])), []).append(
            (float(row["score"]), float(row["label"]), str(row["item_id"]))  # type: ignore[arg-type]
        )
        segment[str(row["request_id"])] = str(row["segment"])
    paired = sorted(r for (m, r) in lists if m == "v2" and ("v1", r) in lists and seg in (None, segment[r]))
    out: dict[str, tuple[int, float, float | None]] = {}
    per: dict[str, list[float]] = {}
    for r in paired:
        vals = []
        for model in ("v2", "v1"):
            items = lists[(model, r)]
            ordered = [items[i][1] for i in order_by_score([s for s, _l, _i in items])]
            vals.append(request_metrics(ordered))
        for name in vals[0]:
            a, b = vals[0][name], vals[1][name]
            if zero:
                a, b = a or 0.0, b or 0.0
            if a is not None and b is not None:
                per.setdefault(name, []).append(a - b)
    for name, d in per.items():
        out[name] = (len(d), statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d)))
    sc, sr, rel = [], [], []
    for r in paired:
        ref = {i: (s, lab) for s, lab, i in lists[("v1", r)]}
        for s, _lab, i in lists[("v2", r)]:
            sc.append(s)
            sr.append(ref[i][0])
            rel.append(ref[i][1] > 0)
    diff, se = naive_delong(sc, sr, rel)
    out["auc_roc"] = (len(sc), diff, se)
    return out


@pytest.mark.parametrize("zero", [False, True])
def test_paired_differences_against_naive(tmp_path: Path, zero: bool) -> None:
    rows = _rows(3)
    path = tmp_path / "eval.csv"
    frame = pd.DataFrame(rows)
    frame.sample(frac=1.0, random_state=1).to_csv(path, index=False)  # rows not grouped by request
    evalset = read_evaluation_files([path], key_by_model=True)
    options = MetricOptions(no_relevant="zero") if zero else MetricOptions()
    got = paired_differences(evalset, candidate="v2", reference="v1", options=options,
                             slice_spec=SliceSpec(by=("segment",)))  # fmt: skip
    assert set(got) == {(), (("segment", "new_user"),), (("segment", "returning"),)}
    for key, seg in (((), None), ((("segment", "new_user"),), "new_user")):
        want = _naive(rows, seg, zero)
        for name, (n, diff, se) in want.items():
            d = got[key][name]
            assert d.n_pairs == n, name
            assert d.diff == pytest.approx(diff, abs=1e-12), name
            assert d.stderr == pytest.approx(se, rel=1e-9), name


def test_paired_differences_no_shared_requests(tmp_path: Path) -> None:
    path = tmp_path / "eval.csv"
    pd.DataFrame([{"request_id": "a", "item_id": "x", "score": 1, "label": 1, "model": "v1"},
                  {"request_id": "b", "item_id": "x", "score": 1, "label": 1, "model": "v2"}]).to_csv(path, index=False)  # fmt: skip
    evalset = read_evaluation_files([path], key_by_model=True)
    assert evalset.n_requests == 2
    assert paired_differences(evalset, candidate="v2", reference="v1") == {}
    assert np.isnan(np.nan)
