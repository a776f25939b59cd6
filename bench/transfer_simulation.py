"""Coverage simulation of ``rankwatch transfer``'s corrected slope against OLS (figures in docs/transfer.md).

    PYTHONPATH=. python bench/transfer_simulation.py [--simulations 1000] [--comparisons 40] [--seed 7]

Model of one ledger, per segment with a known true slope (``new_user`` 0.5, ``returning`` 1.0,
``power_user`` 0.0): ``n`` comparisons with a true offline difference ``xi_i ~ N(0, 0.01^2)``, measured as
``x_i = xi_i + N(0, sx_i^2)`` with ``sx_i ~ U(0.004, 0.009)`` (reliability ``Var xi / Var x`` about 0.65:
offline test sets are small next to the differences between candidates); online
``y_i = slope * xi_i + u_i + N(0, sy_i^2)`` with an intrinsic scatter ``u_i ~ N(0, 0.002^2)`` (what the
offline metric misses) and ``sy_i ~ U(0.001, 0.003)``. A candidate with true offline difference
``xi_c ~ N(0, 0.01^2)``, measured ``d = xi_c + N(0, 0.005^2)``, is predicted: the truth is ``slope * xi_c``.

Printed per segment: the mean and median of both slope estimates, and the share of ledgers whose 95 %
interval covers the true slope for the corrected slope (the jackknife t interval, as ``rankwatch transfer``;
the bootstrap's BCa and plain percentile intervals) and for OLS with its usual t interval
``b +- t_{n-2, 0.975} sqrt(sum(resid^2) / (n - 2) / sum((x - mean x)^2))``; an undefined interval counts as
not covering (their share is printed). Also the coverage of ``predicted_online``'s interval.
tests/pipeline/transfer/test_transfer_simulation.py runs a smaller seeded version.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from rankwatch.pipeline.transfer.bootstrap import bootstrap_transfer
from rankwatch.pipeline.transfer.statistics import moments, slope_corrected, slope_ols

SEGMENTS = {"new_user": 0.5, "returning": 1.0, "power_user": 0.0}
SPREAD, SX, SCATTER, SY, CANDIDATE_SE = 0.01, (0.004, 0.009), 0.002, (0.001, 0.003), 0.005


def simulate_ledger(rng: np.random.Generator, n: int, slope: float) -> tuple[np.ndarray, ...]:
    """``(x, y, sx, sy)`` of ``n`` comparisons whose true online / offline slope is ``slope``."""
    xi = rng.normal(0.0, SPREAD, n)
    sx, sy = rng.uniform(*SX, n), rng.uniform(*SY, n)
    x = xi + rng.normal(0.0, 1.0, n) * sx
    y = slope * xi + rng.normal(0.0, SCATTER, n) + rng.normal(0.0, 1.0, n) * sy
    return x, y, sx, sy


def ols_interval(x: np.ndarray, y: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """OLS slope of ``y`` on ``x`` with its t interval (``n - 2`` degrees of freedom)."""
    n = len(x)
    dx = x - x.mean()
    b = float(dx @ (y - y.mean()) / (dx @ dx))
    resid = y - y.mean() - b * dx
    se = float(np.sqrt(resid @ resid / (n - 2) / (dx @ dx)))
    t = float(stats.t.ppf(0.5 + level / 2, n - 2))
    return b, b - t * se, b + t * se


def run(simulations: int, comparisons: int, seed: int, resamples: int) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, float]] = {}
    for segment, truth in SEGMENTS.items():
        hits = {"jackknife_t": 0, "bca": 0, "percentile": 0, "ols": 0, "predicted": 0}
        undefined = {"jackknife_t": 0, "bca": 0, "percentile": 0, "predicted": 0}
        corrected, ols = [], []
        for s in range(simulations):
            x, y, sx, sy = simulate_ledger(rng, comparisons, truth)
            xi_c = rng.normal(0.0, SPREAD)
            d = xi_c + rng.normal(0.0, CANDIDATE_SE)
            m = moments(x, y, sx, sy)
            c = slope_corrected(m)
            corrected.append(np.nan if c is None else c)
            ols.append(slope_ols(m))
            _b, lo, hi = ols_interval(x, y)
            hits["ols"] += lo <= truth <= hi
            for method in ("bca", "percentile"):
                boot = bootstrap_transfer(x, y, sx, sy, resamples=resamples, seed=s, method=method,
                                          candidate=(d, CANDIDATE_SE), slope_interval="bootstrap")  # fmt: skip
                intervals = {method: boot.slope_corrected}
                if method == "bca":
                    intervals["jackknife_t"] = bootstrap_transfer(x, y, sx, sy, resamples=1, seed=s).slope_corrected
                for name, iv in intervals.items():
                    if iv.lo is None or iv.hi is None:
                        undefined[name] += 1
                    else:
                        hits[name] += iv.lo <= truth <= iv.hi
                if method == "bca":
                    p = boot.predicted_online
                    if p is None or p.lo is None or p.hi is None:
                        undefined["predicted"] += 1
                    else:
                        hits["predicted"] += p.lo <= truth * xi_c <= p.hi
        row = {f"coverage_{k}": v / simulations for k, v in hits.items()}
        row.update({f"undefined_{k}": v / simulations for k, v in undefined.items()})
        row.update(truth=truth, mean_corrected=float(np.nanmean(corrected)),
                   median_corrected=float(np.nanmedian(corrected)), mean_ols=float(np.mean(ols)))  # fmt: skip
        out[segment] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--simulations", type=int, default=1000, help="simulated ledgers per segment")
    ap.add_argument("--comparisons", type=int, default=40, help="comparisons per segment in one ledger")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    start = time.perf_counter()
    res = run(args.simulations, args.comparisons, args.seed, args.resamples)
    print(f"{args.simulations} ledgers x {args.comparisons} comparisons per segment, {args.resamples} resamples, "
          f"seed {args.seed}")  # fmt: skip
    print("| segment | true slope | mean OLS | mean (median) corrected | coverage corrected jackknife t | "
          "BCa | percentile | OLS t | predicted_online | undefined jackknife t / BCa / percentile |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for segment, r in res.items():
        print(f"| {segment} | {r['truth']:.1f} | {r['mean_ols']:.3f} | {r['mean_corrected']:.3f} "
              f"({r['median_corrected']:.3f}) | {r['coverage_jackknife_t']:.1%} | {r['coverage_bca']:.1%} | "
              f"{r['coverage_percentile']:.1%} | {r['coverage_ols']:.1%} | {r['coverage_predicted']:.1%} | "
              f"{r['undefined_jackknife_t']:.1%} / {r['undefined_bca']:.1%} / {r['undefined_percentile']:.1%} |",
              flush=True)  # fmt: skip
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
