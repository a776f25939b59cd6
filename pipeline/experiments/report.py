"""The A/B report (SPEC section 4, ``rankwatch ab --format json``) from an experiment's cells.

For every metric x treatment x slice: n per arm, means, the difference and the lift with fixed and
always-valid intervals, the p-values, the Benjamini-Hochberg adjusted p-value and a verdict; the
sample-ratio-mismatch test on top.

Decisions (docs/experiments.md):

- ``p_value`` is the p-value the decision uses (``p_value_fixed`` and ``p_value_sequential`` are both given):
  the always-valid one (``decision = "sequential"``, the default: safe
  under continuous looking) or the fixed Welch one (``decision = "fixed"``: one planned look);
- Benjamini-Hochberg runs over the segment x surface cells of one (experiment, metric, treatment) family;
  the all-segments slice is decided at ``alpha`` unadjusted (its ``p_adjusted`` is its own p-value);
- verdict ``better`` / ``worse`` when the adjusted p-value is below ``alpha`` (higher is better for every
  ranking metric), else ``inconclusive``; ``insufficient data`` (no numbers) below ``min_requests`` requests
  per arm, or for AUCs below ``min_positives`` / ``min_negatives`` items per arm;
- AUC-ROC and AUC-PR compare the per-arm values with the per-arm standard errors (independent arms:
  variances add); the always-valid interval counts requests as units with ``N*`` of the request unit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rankwatch.pipeline.experiments.auc import auc_standard_errors
from rankwatch.pipeline.experiments.data import ArmCell, ExperimentData
from rankwatch.pipeline.experiments.spec import DEFAULT_N_STAR
from rankwatch.pipeline.experiments.stats import (
    ArmEstimate,
    Comparison,
    benjamini_hochberg,
    compare_means,
    compare_values,
    srm_test,
)
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.slicing import ALL_VALUE, SliceKey

__all__ = ["INSUFFICIENT", "VERDICTS", "experiment_report"]

INSUFFICIENT = "insufficient data"
VERDICTS = ("better", "worse", "inconclusive", INSUFFICIENT)
AucErrors = Callable[[RankingAggregate], dict[str, float | None]]


def experiment_report(data: ExperimentData, *, auc_errors: AucErrors = auc_standard_errors) -> dict[str, Any]:
    """``{"experiment", "srm", "comparisons"}`` (see the module docstring)."""
    spec = data.spec
    observed = data.users if spec.unit == "user" else data.requests
    srm = srm_test(observed, spec.shares)
    slice_keys = data.slice_keys()
    comparisons: list[dict[str, Any]] = []
    # Per-request means and the pooled AUCs: GAUC and the positive rate have no per-arm standard error yet,
    # so they are not compared (docs/experiments.md).
    for metric in (*data.options.rank_metric_names, "auc_roc", "auc_pr"):
        for treatment in spec.treatments:
            family = [_entry(data, metric, treatment, key, auc_errors) for key in slice_keys]
            decision_p = [e["p_value"] for e in family]
            adjusted = benjamini_hochberg([p for p, key in zip(decision_p, slice_keys, strict=True) if key])
            segment_adjusted = iter(adjusted)
            for entry, p, key in zip(family, decision_p, slice_keys, strict=True):
                p_adj = next(segment_adjusted) if key else p
                entry["p_adjusted"] = p_adj
                entry["verdict"] = _verdict(entry, p_adj, spec.alpha)
            comparisons.extend(family)
    experiment = spec.to_dict()
    experiment.update({
        "requests": dict(data.requests), "users": dict(data.users),
        "other_arm_requests": data.other_arm_requests, "before_start_requests": data.before_start_requests,
        "users_folded": data.users_folded, "crossover_users": data.crossover_users,
    })  # fmt: skip
    return {"experiment": experiment, "srm": srm.document(), "comparisons": comparisons}


def _verdict(entry: dict[str, Any], p_adj: float | None, alpha: float) -> str:
    if entry["diff"] is None:
        return INSUFFICIENT
    if p_adj is None or p_adj >= alpha:
        return "inconclusive"
    return "better" if entry["diff"] > 0 else "worse"


def _slice_labels(data: ExperimentData, key: SliceKey) -> dict[str, str]:
    values = dict(key)
    return {lbl: values.get(lbl, ALL_VALUE) for lbl in data.slice_spec.by}


def _entry(data: ExperimentData, metric: str, treatment: str, key: SliceKey, auc_errors: AucErrors) -> dict[str, Any]:
    spec = data.spec
    t, c = data.cells.get((treatment, key)), data.cells.get((spec.control, key))
    out: dict[str, Any] = {"metric": metric, "treatment": treatment, "control": spec.control,
                           **_slice_labels(data, key), "unit": spec.unit}  # fmt: skip
    out.update({"requests": t.aggregate.requests if t else 0, "requests_control": c.aggregate.requests if c else 0})
    cmp, n_t, n_c, mean_t, mean_c = None, 0, 0, None, None
    enough = t is not None and c is not None and min(out["requests"], out["requests_control"]) >= spec.min_requests
    if metric in ("auc_roc", "auc_pr"):
        if t is not None and c is not None:
            n_t, n_c = t.aggregate.items, c.aggregate.items
            mean_t, mean_c = _auc(t, metric), _auc(c, metric)
            if enough and _auc_enough(t, c, spec.min_positives, spec.min_negatives):
                cmp = _compare_auc(t, c, metric, out["requests"] + out["requests_control"], spec, auc_errors)
    elif t is not None and c is not None:
        et, ec, n_t, n_c = _estimate(t, metric, spec.unit), _estimate(c, metric, spec.unit), 0, 0
        n_t, n_c = _units(t, metric, spec.unit), _units(c, metric, spec.unit)
        mean_t, mean_c = (et.mean if et else None), (ec.mean if ec else None)
        if enough and et is not None and ec is not None:
            cmp = compare_means(et, ec, alpha=spec.alpha, n_star=spec.tuning)
    out.update({"n": n_t, "n_control": n_c, "mean": mean_t, "mean_control": mean_c})
    out.update(_numbers(cmp))
    out["p_value"] = out["p_value_sequential"] if spec.decision == "sequential" else out["p_value_fixed"]
    return out


def _numbers(cmp: Comparison | None) -> dict[str, Any]:
    def pair(x: tuple[float, float] | None) -> list[float] | None:
        return None if x is None else [x[0], x[1]]

    if cmp is None:
        return dict.fromkeys(("diff", "diff_stderr", "diff_ci", "diff_ci_sequential", "lift", "lift_ci",
                              "lift_ci_sequential", "p_value_fixed", "p_value_sequential"))  # fmt: skip
    return {"diff": cmp.diff, "diff_stderr": cmp.diff_se, "diff_ci": pair(cmp.diff_ci), "diff_ci_sequential": pair(cmp.diff_ci_sequential),
            "lift": cmp.lift, "lift_ci": pair(cmp.lift_ci), "lift_ci_sequential": pair(cmp.lift_ci_sequential),
            "p_value_fixed": cmp.p_value, "p_value_sequential": cmp.p_value_sequential}  # fmt: skip


def _estimate(cell: ArmCell, metric: str, unit: str) -> ArmEstimate | None:
    if unit == "user":
        u = cell.units.get(metric)
        return None if u is None else ArmEstimate.from_unit_sums(u.n, u.sum_y, u.sum_n, u.sum_yy, u.sum_nn, u.sum_yn)
    s = cell.aggregate.sums[metric]
    return ArmEstimate.from_moments(s.count, s.total, s.total_sq)


def _units(cell: ArmCell, metric: str, unit: str) -> int:
    if unit == "user":
        u = cell.units.get(metric)
        return 0 if u is None else u.n
    return cell.aggregate.sums[metric].count


def _auc(cell: ArmCell, metric: str) -> float | None:
    h = cell.aggregate.histogram
    return h.auc_roc() if metric == "auc_roc" else h.average_precision()


def _auc_enough(t: ArmCell, c: ArmCell, min_pos: int, min_neg: int) -> bool:
    return all(x.aggregate.histogram.positives >= max(min_pos, 2) and x.aggregate.histogram.negatives >= max(min_neg, 2)
               for x in (t, c))  # fmt: skip


def _compare_auc(t: ArmCell, c: ArmCell, metric: str, requests: int, spec: Any, auc_errors: AucErrors) -> Comparison | None:
    vt, vc = _auc(t, metric), _auc(c, metric)
    se_t, se_c = auc_errors(t.aggregate)[metric], auc_errors(c.aggregate)[metric]
    if vt is None or vc is None or se_t is None or se_c is None:
        return None
    return compare_values(vt, se_t, vc, se_c, n_units=requests, alpha=spec.alpha,
                          n_star=spec.n_star or DEFAULT_N_STAR["request"])  # fmt: skip
