"""A/A and power simulations of rankwatch's A/B statistics (figures in docs/experiments.md).

Per-request NDCG@10 values are bootstrapped from the traffic generator (the kernel's per-request values of
a simulated evaluation set), so the distribution is the real, lumpy one (many 1s, a long lower tail).
Every simulated experiment is looked at after every 5-minute window, on the data cumulative since its
start, as ``rankwatch ab`` and the online state would. The statistics are vectorised here for speed; a
check at start-up asserts that they equal :func:`rankwatch.pipeline.experiments.stats.compare_means` to 1e-12.

Parts:

A. A/A, requests independent: the share of experiments whose interval ever excluded 0 up to look k, for
   the fixed Welch interval and the always-valid one, on the all-segments slice and on any of the 6
   segment x surface cells after Benjamini-Hochberg.
B. A/A with per-user random effects and users randomised: request-level Welch (ignores the clustering) vs
   ``unit = "user"`` (delta method on per-user sums), fixed at the last look and always-valid over all looks.
C. Power: treatment loses 5 % NDCG@10 in the ``new_user`` segment (both surfaces): how often and when the
   always-valid, BH-adjusted decision flags each cell.

Run: ``PYTHONPATH=. python bench/ab_simulation.py --experiments 400`` (about a minute on one core).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np
from scipy import stats

from rankwatch.pipeline.experiments.stats import ArmEstimate, compare_means, mixture_rho2
from rankwatch.pipeline.metrics.kernel import offsets_from_lengths, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.traffic.generator import TrafficConfig, evaluation_frame

ALPHA = 0.05
SEGMENTS = ("new_user", "returning", "power_user")
SURFACES = ("home_feed", "search")
CELLS = [(s, f) for s in SEGMENTS for f in SURFACES]
LOOKS_REPORTED = (1, 6, 12, 24, 48, 96)


def ndcg_pool(n_requests: int, seed: int) -> np.ndarray:
    """Per-request NDCG@10 of simulated traffic (requests with a relevant item)."""
    rows = evaluation_frame(TrafficConfig(seed=seed), n_requests)
    lengths = rows.groupby("request_id", sort=False).size().to_numpy()
    m = per_request_metrics(rows["label"].to_numpy(np.float64), offsets_from_lengths(lengths),
                            MetricOptions(ndcg_cutoffs=(10,), map_cutoffs=()))  # fmt: skip
    v = m.values["ndcg@10"]
    return v[~np.isnan(v)]


def p_values(nt: Any, st: Any, qt: Any, nc: Any, sc: Any, qc: Any, n_star: float) -> tuple[Any, Any]:
    """Fixed Welch and always-valid p-values from (n, sum, sum of squares) per arm, vectorised."""
    with np.errstate(invalid="ignore", divide="ignore"):
        vt = (qt - st * st / nt) / (nt - 1) / nt
        vc = (qc - sc * sc / nc) / (nc - 1) / nc
        var = vt + vc
        diff = st / nt - sc / nc
        df = var * var / (vt * vt / (nt - 1) + vc * vc / (nc - 1))
        z = diff / np.sqrt(var)
        p_fixed = 2 * stats.t.sf(np.abs(z), df)
        eta = (nt + nc) * mixture_rho2(ALPHA, n_star)
        log_lambda = eta * z * z / (2 * (1 + eta)) - 0.5 * np.log1p(eta)
        p_seq = np.where(log_lambda <= 0, 1.0, np.exp(-np.maximum(log_lambda, 0)))
    return p_fixed, p_seq


def user_p_values(arms: list[tuple[Any, ...]], n_star: float) -> tuple[Any, Any]:
    """The same from per-user sums (n, sum Y, sum N, sum Y^2, sum N^2, sum YN) per arm: the delta method."""
    lin = []
    for n, sy, sn, syy, snn, syn in arms:
        with np.errstate(invalid="ignore", divide="ignore"):
            r = sy / sn
            mean_n = sn / n
            s_yy, s_nn, s_yn = ((syy - sy * sy / n) / (n - 1), (snn - sn * sn / n) / (n - 1),
                                (syn - sy * sn / n) / (n - 1))  # fmt: skip
            var_unit = (s_yy - 2 * r * s_yn + r * r * s_nn) / (mean_n * mean_n)
        # equivalent (n, sum, sum of squares) of the linearised values: mean r, variance var_unit
        lin.append((n, r * n, var_unit * (n - 1) + r * r * n))
    (nt, st, qt), (nc, sc, qc) = lin
    return p_values(nt, st, qt, nc, sc, qc, n_star)


def check_against_module(pool: np.ndarray, rng: np.random.Generator) -> None:
    for _ in range(50):
        t, c = rng.choice(pool, int(rng.integers(5, 3000))), rng.choice(pool, int(rng.integers(5, 3000)))
        moments = [(x.size, x.sum(), (x * x).sum()) for x in (t, c)]
        ref = compare_means(ArmEstimate.from_moments(*moments[0]), ArmEstimate.from_moments(*moments[1]))  # type: ignore[arg-type]
        pf, ps = p_values(*moments[0], *moments[1], 50_000)
        assert abs(pf - ref.p_value) < 1e-12 and abs(ps - ref.p_value_sequential) < 1e-12, (pf, ps, ref)


def bh_reject(p: np.ndarray, alpha: float) -> np.ndarray:
    """Benjamini-Hochberg rejections along the last axis (vectorised step-up)."""
    m = p.shape[-1]
    order = np.argsort(p, axis=-1)
    ranked = np.take_along_axis(p, order, axis=-1)
    below = ranked <= alpha * np.arange(1, m + 1) / m
    k = np.where(below.any(axis=-1), m - np.argmax(below[..., ::-1], axis=-1), 0)
    rejected_sorted = np.arange(m) < k[..., None]
    out = np.zeros_like(rejected_sorted)
    np.put_along_axis(out, order, rejected_sorted, axis=-1)
    return out


def cell_sums(pool: np.ndarray, rng: np.random.Generator, n_exp: int, windows: int, lam: float,
              factor: np.ndarray) -> np.ndarray:
    """Cumulative (n, sum, sumsq) per (experiment, arm, cell, look): shape (E, 2, C, W, 3)."""
    counts = rng.poisson(lam, size=(n_exp, 2, len(CELLS), windows))
    flat = counts.ravel()
    values = pool[rng.integers(0, pool.size, size=int(flat.sum()))]
    group = np.repeat(np.arange(flat.size), flat)
    scale = np.repeat(np.broadcast_to(factor[None, :, :, None], counts.shape).ravel(), flat)
    values = values * scale
    s = np.bincount(group, weights=values, minlength=flat.size).reshape(counts.shape)
    q = np.bincount(group, weights=values * values, minlength=flat.size).reshape(counts.shape)
    out = np.stack([counts, s, q], axis=-1).astype(np.float64)
    return np.cumsum(out, axis=3)


CHUNK = 40  # experiments simulated at once (bounded memory)


def part_a(pool: np.ndarray, rng: np.random.Generator, n_exp: int, windows: int, lam: float) -> dict[str, Any]:
    """A/A, independent requests: ever-rejected rates by look for fixed and always-valid decisions."""
    parts = []
    for start in range(0, n_exp, CHUNK):
        cum = cell_sums(pool, rng, min(CHUNK, n_exp - start), windows, lam, np.ones((2, len(CELLS))))
        overall = cum.sum(axis=2)  # (E, 2, W, 3)
        p_all = p_values(*overall[:, 0].transpose(2, 0, 1), *overall[:, 1].transpose(2, 0, 1), 50_000)
        p_cells = p_values(*cum[:, 0].transpose(3, 0, 2, 1), *cum[:, 1].transpose(3, 0, 2, 1), 50_000)  # (E, W, C)
        parts.append((*p_all, *p_cells))
    p_f, p_s, cf, cs = (np.concatenate([x[i] for x in parts]) for i in range(4))
    rows = {}
    for look in [k for k in LOOKS_REPORTED if k <= windows]:
        rows[look] = {
            "all_fixed": float(np.mean((p_f[:, :look] < ALPHA).any(axis=1))),
            "all_sequential": float(np.mean((p_s[:, :look] < ALPHA).any(axis=1))),
            "cells_bh_fixed": float(np.mean(bh_reject(cf[:, :look], ALPHA).any(axis=(1, 2)))),
            "cells_bh_sequential": float(np.mean(bh_reject(cs[:, :look], ALPHA).any(axis=(1, 2)))),
        }
    return {"experiments": n_exp, "windows": windows, "requests_per_arm_cell_window": lam, "by_look": rows}


def part_b(pool: np.ndarray, rng: np.random.Generator, n_exp: int, windows: int, lam: float, users: int,
           sd_user: float) -> dict[str, Any]:
    """A/A with per-user random effects (users randomised): request-level vs unit = user."""
    hits = {"request_fixed_last": 0, "request_sequential_any": 0, "user_fixed_last": 0, "user_sequential_any": 0,
            "request_fixed_any": 0, "user_fixed_any": 0}
    chunk = CHUNK // 2
    for start in range(0, n_exp, chunk):
        e = min(chunk, n_exp - start)
        counts = rng.poisson(lam, size=(e, 2, windows))
        flat = counts.ravel()
        total = int(flat.sum())
        group = np.repeat(np.arange(flat.size), flat)  # (exp, arm, window) of each request
        user = rng.integers(0, users, size=total)
        effects = rng.normal(0, sd_user, size=(e, 2, users))
        exp_arm = group // windows
        values = pool[rng.integers(0, pool.size, size=total)] + effects.reshape(-1, users)[exp_arm, user]
        # request level
        s = np.bincount(group, weights=values, minlength=flat.size).reshape(counts.shape)
        q = np.bincount(group, weights=values * values, minlength=flat.size).reshape(counts.shape)
        n, s, q = (np.cumsum(x.astype(np.float64), axis=2) for x in (counts, s, q))
        rf, rs = p_values(n[:, 0], s[:, 0], q[:, 0], n[:, 1], s[:, 1], q[:, 1], 50_000)
        # user level: per (exp, arm, user, window) increments, cumulated over windows
        key = (exp_arm * users + user) * windows + group % windows
        size = e * 2 * users * windows
        y = np.cumsum(np.bincount(key, weights=values, minlength=size).reshape(e, 2, users, windows), axis=3)
        c = np.cumsum(np.bincount(key, minlength=size).reshape(e, 2, users, windows).astype(np.float64), axis=3)
        present = (c > 0).astype(np.float64)
        arms = [tuple(x[:, a].sum(axis=1) for x in (present, y, c, y * y, c * c, y * c)) for a in (0, 1)]
        uf, us = user_p_values(arms, 5_000)
        hits["request_fixed_last"] += int(np.sum(rf[:, -1] < ALPHA))
        hits["request_fixed_any"] += int(np.sum((rf < ALPHA).any(axis=1)))
        hits["request_sequential_any"] += int(np.sum((rs < ALPHA).any(axis=1)))
        hits["user_fixed_last"] += int(np.sum(uf[:, -1] < ALPHA))
        hits["user_fixed_any"] += int(np.sum((uf < ALPHA).any(axis=1)))
        hits["user_sequential_any"] += int(np.sum((us < ALPHA).any(axis=1)))
    per_user = lam * windows / users
    return {"experiments": n_exp, "windows": windows, "requests_per_arm_window": lam, "users_per_arm": users,
            "user_effect_sd": sd_user, "requests_per_user": per_user,
            "rates": {k: v / n_exp for k, v in hits.items()}}  # fmt: skip


def part_c(pool: np.ndarray, rng: np.random.Generator, n_exp: int, windows: int, lam: float) -> dict[str, Any]:
    """Power of a -5 % NDCG@10 effect in new_user: BH-adjusted always-valid decisions per cell, by look."""
    factor = np.ones((2, len(CELLS)))
    hit_cells = [i for i, (seg, _s) in enumerate(CELLS) if seg == "new_user"]
    factor[1, hit_cells] = 0.95
    parts = []
    for start in range(0, n_exp, CHUNK):
        cum = cell_sums(pool, rng, min(CHUNK, n_exp - start), windows, lam, factor)
        _cf, cs = p_values(*cum[:, 0].transpose(3, 0, 2, 1), *cum[:, 1].transpose(3, 0, 2, 1), 50_000)
        sign = cum[:, 1, :, :, 1] / cum[:, 1, :, :, 0] - cum[:, 0, :, :, 1] / cum[:, 0, :, :, 0]
        parts.append((cs, sign.transpose(0, 2, 1)))
    cs = np.concatenate([x[0] for x in parts])
    diff_sign = np.concatenate([x[1] for x in parts])
    rejected = bh_reject(cs, ALPHA)  # (E, W, C)
    worse = rejected & (diff_sign < 0)
    ever = worse.any(axis=1)  # (E, C)
    first = np.where(worse.any(axis=1), np.argmax(worse, axis=1) + 1, 0)  # look index, 1-based
    detect = [first[:, i][first[:, i] > 0] * 5 for i in hit_cells]
    false_flags = rejected[:, :, [i for i in range(len(CELLS)) if i not in hit_cells]].any(axis=(1, 2))
    return {
        "experiments": n_exp, "windows": windows, "requests_per_arm_cell_window": lam,
        "flagged_share": {f"{CELLS[i][0]}/{CELLS[i][1]}": float(ever[:, i].mean()) for i in range(len(CELLS))},
        "median_detection_minutes": {f"{CELLS[i][0]}/{CELLS[i][1]}": (float(np.median(d)) if d.size else None)
                                     for i, d in zip(hit_cells, detect, strict=True)},
        "p90_detection_minutes": {f"{CELLS[i][0]}/{CELLS[i][1]}": (float(np.percentile(d, 90)) if d.size else None)
                                  for i, d in zip(hit_cells, detect, strict=True)},
        "experiments_with_a_false_flag": float(false_flags.mean()),
    }  # fmt: skip


def binomial_halfwidth(p: float, n: int) -> float:
    return 1.96 * math.sqrt(max(p * (1 - p), 1e-12) / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", type=int, default=400)
    ap.add_argument("--windows", type=int, default=96, help="5-minute looks per experiment")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    pool = ndcg_pool(20_000, args.seed)
    check_against_module(pool, rng)
    out = {
        "pool": {"requests": int(pool.size), "mean": float(pool.mean()), "sd": float(pool.std(ddof=1))},
        "A_aa_independent": part_a(pool, rng, args.experiments, args.windows, 100),
        "B_aa_user_effects": part_b(pool, rng, args.experiments, min(args.windows, 48), 400, 1000, 0.1),
        "C_power_500": part_c(pool, rng, args.experiments, args.windows, 500),
        "C_power_100": part_c(pool, rng, args.experiments, args.windows, 100),
        "seconds": None,
    }
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    n = args.experiments
    a = out["A_aa_independent"]
    print(f"pool: {out['pool']}; {n} experiments per part; ±binomial 95 % half-width at 5 %: "
          f"{binomial_halfwidth(0.05, n):.3f}")  # fmt: skip
    print("\nA. A/A, independent requests, 100 requests per arm, cell and 5-min window; share ever significant")
    print("| looks | all-segments fixed | all-segments always-valid | any cell (BH) fixed | any cell (BH) always-valid |")
    print("|---|---|---|---|---|")
    for look, r in a["by_look"].items():
        print(f"| {look} | {r['all_fixed']:.1%} | {r['all_sequential']:.1%} | {r['cells_bh_fixed']:.1%} | "
              f"{r['cells_bh_sequential']:.1%} |")  # fmt: skip
    b = out["B_aa_user_effects"]
    print(f"\nB. A/A with per-user effects (sd {b['user_effect_sd']}, {b['users_per_arm']} users per arm, "
          f"{b['requests_per_user']:.0f} requests per user over {b['windows']} looks)")  # fmt: skip
    for k, v in b["rates"].items():
        print(f"  {k}: {v:.1%}")
    for key in ("C_power_500", "C_power_100"):
        c = out[key]
        print(f"\nC. -5 % NDCG@10 in new_user, {c['requests_per_arm_cell_window']} requests per arm, cell and window:")
        print(f"  flagged share per cell: {c['flagged_share']}")
        print(f"  median detection (min): {c['median_detection_minutes']}; p90: {c['p90_detection_minutes']}")
        print(f"  experiments with a false flag in another cell: {c['experiments_with_a_false_flag']:.1%}")
    print(f"\n{out['seconds']} s")


if __name__ == "__main__":
    main()
