"""Coverage simulation of rankwatch's 95 % intervals on generator traffic with a known large-sample truth.

    python bench/coverage.py [--windows 1000] [--large-windows 500] [--seed 11]

Traffic follows :mod:`pipeline.traffic.generator`'s request model, vectorised with numpy (the event-level
generator is far too slow for millions of requests): 20 items per request, true grades with
``GRADE_PROBS``, score ``round(q * grade + (1 - q) * N(0, 1.2), 4)``, served by score with adjacent swaps
(p = 0.05), position-biased graded feedback (examine ``p ** -0.7``, click ``CLICK_PROBS[grade]``, cart
0.6 for grade >= 2, purchase 0.6 for grade 3). Three populations:

- ``default``: every segment at the generator's default quality q = 0.6;
- ``mixed``: segment quality 0.3 / 0.6 / 0.9 (three segments drawn uniformly), the segments pooled;
- ``per-request``: q uniform in [0.2, 1.0] for every request (quality correlated within a request).

The truth of each metric is its pooled value over ``--truth-requests`` requests. Each window (50 or 5,000
requests) is aggregated by the kernel (:func:`pipeline.metrics.aggregates.aggregate_lists`), and the share of
windows whose interval covers the truth is reported, per metric, for the logit and the Wald interval, and
for AUCs also for the pooled (unclustered) SE. The test tests/pipeline/metrics/test_coverage.py runs a seeded
smaller version and asserts 93-97 %.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_lists  # noqa: E402
from rankwatch.pipeline.metrics.kernel import offsets_from_lengths  # noqa: E402
from rankwatch.pipeline.metrics.options import MetricOptions  # noqa: E402
from rankwatch.pipeline.metrics.uncertainty import auc_pr_stderr, auc_roc_stderr, clustered_variance, interval  # noqa: E402
from rankwatch.pipeline.traffic.generator import CLICK_PROBS, GRADE_PROBS  # noqa: E402

METRICS = ("mrr", "ndcg@10", "map@10", "auc_roc", "auc_pr")
ITEMS = 20
OPTIONS = MetricOptions()
POPULATIONS = ("default", "mixed", "per-request")


def traffic(rng: np.random.Generator, n_requests: int, population: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, scores) of ``n_requests`` requests, ``ITEMS`` items each, in served order, shape (n, ITEMS)."""
    if population == "default":
        q = np.full(n_requests, 0.6)
    elif population == "mixed":
        q = np.array([0.3, 0.6, 0.9])[rng.integers(0, 3, n_requests)]
    elif population == "per-request":
        q = rng.uniform(0.2, 1.0, n_requests)
    else:
        raise ValueError(f"unknown population {population!r}")
    grades = rng.choice(4, size=(n_requests, ITEMS), p=GRADE_PROBS)
    scores = np.round(q[:, None] * grades + (1 - q[:, None]) * rng.normal(0.0, 1.2, (n_requests, ITEMS)), 4)
    order = np.argsort(-scores, axis=1, kind="stable")
    for k in range(ITEMS - 1):  # business rules: a few adjacent swaps
        swap = rng.random(n_requests) < 0.05
        a, b = order[swap, k].copy(), order[swap, k + 1].copy()
        order[swap, k], order[swap, k + 1] = b, a
    grades = np.take_along_axis(grades, order, axis=1)
    scores = np.take_along_axis(scores, order, axis=1)
    position = np.arange(1, ITEMS + 1)[None, :]
    clicked = (rng.random(grades.shape) < position**-0.7) & (rng.random(grades.shape) < np.take(CLICK_PROBS, grades))
    cart = clicked & (grades >= 2) & (rng.random(grades.shape) < 0.6)
    purchase = cart & (grades == 3) & (rng.random(grades.shape) < 0.6)
    labels = clicked.astype(np.float64) + cart + purchase
    return labels, scores


def aggregate(labels: np.ndarray, scores: np.ndarray, group: np.ndarray, n_groups: int) -> list[RankingAggregate]:
    n = labels.shape[0]
    offsets = offsets_from_lengths(np.full(n, ITEMS, dtype=np.int64))
    return aggregate_lists(labels.ravel(), scores.ravel(), offsets, group, n_groups, OPTIONS)


def truth(rng: np.random.Generator, population: str, n_requests: int) -> dict[str, float]:
    """Pooled values over ``n_requests`` requests (in chunks, merged exactly)."""
    total: RankingAggregate | None = None
    chunk = 100_000
    for start in range(0, n_requests, chunk):
        m = min(chunk, n_requests - start)
        labels, scores = traffic(rng, m, population)
        agg = aggregate(labels, scores, np.zeros(m, np.int64), 1)[0]
        agg.clusters = None  # not needed for the truth; keeps the merges cheap
        if total is None:
            total = agg
        else:
            total.merge(agg)
    assert total is not None
    values = total.values()
    return {m: float(values[m]) for m in METRICS}  # type: ignore[arg-type]


@dataclass
class Coverage:
    hits: dict[str, int]
    windows: int

    def percent(self, key: str) -> float:
        return 100.0 * self.hits.get(key, 0) / self.windows


def coverage(
    rng: np.random.Generator, population: str, window_requests: int, n_windows: int, true: dict[str, float]
) -> Coverage:
    """Windows are aggregated many at a time (one kernel call, window id as the group)."""
    hits: dict[str, int] = {}
    batch = max(1, 200_000 // window_requests)
    done = 0
    while done < n_windows:
        w = min(batch, n_windows - done)
        labels, scores = traffic(rng, w * window_requests, population)
        group = np.repeat(np.arange(w), window_requests)
        for agg in aggregate(labels, scores, group, w):
            values, ses = agg.values(), agg.stderrs()
            pooled = {
                "auc_roc": auc_roc_stderr(agg.histogram), "auc_pr": auc_pr_stderr(agg.histogram),
            }
            assert agg.clusters is not None
            var_roc, var_pr = clustered_variance("roc", agg.clusters), clustered_variance("pr", agg.clusters)
            clustered = {
                "auc_roc": None if var_roc is None else var_roc**0.5, "auc_pr": None if var_pr is None else var_pr**0.5,
            }
            for m in METRICS:
                v, se = values[m], ses[m]
                for method in ("logit", "wald"):
                    ci = interval(v, se, 0.95, method)  # type: ignore[arg-type]
                    if ci is not None and ci[0] <= true[m] <= ci[1]:
                        hits[f"{m}/{method}"] = hits.get(f"{m}/{method}", 0) + 1
                for name, ses_of in (("pooled", pooled), ("clustered", clustered)):
                    if m in ses_of:
                        ci = interval(v, ses_of[m], 0.95, "logit")  # type: ignore[arg-type]
                        if ci is not None and ci[0] <= true[m] <= ci[1]:
                            hits[f"{m}/{name}"] = hits.get(f"{m}/{name}", 0) + 1
        done += w
    return Coverage(hits, n_windows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=1000, help="small (50-request) windows per population")
    ap.add_argument("--large-windows", type=int, default=500, help="large (5,000-request) windows")
    ap.add_argument("--truth-requests", type=int, default=1_000_000)
    ap.add_argument("--populations", default=",".join(POPULATIONS))
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print("coverage of 95 % intervals, %: logit (wald); AUCs also [item-level only, clustered only], logit")
    print("| population | window | " + " | ".join(METRICS) + " |")
    print("|---|---|" + "---|" * len(METRICS))
    for population in args.populations.split(","):
        true = truth(rng, population, args.truth_requests)
        for size, n in ((50, args.windows), (5000, args.large_windows)):
            if n <= 0:
                continue
            cov = coverage(rng, population, size, n, true)
            cells = []
            for m in METRICS:
                cell = f"{cov.percent(m + '/logit'):.1f} ({cov.percent(m + '/wald'):.1f})"
                if m.startswith("auc"):
                    cell += f" [{cov.percent(m + '/pooled'):.1f}, {cov.percent(m + '/clustered'):.1f}]"
                cells.append(cell)
            print(f"| {population} | {size:,} requests x {n} | " + " | ".join(cells) + " |", flush=True)
        print("| truth | " + population + " | " + " | ".join(f"{true[m]:.4f}" for m in METRICS) + " |")


if __name__ == "__main__":
    main()
