"""Naive pure-Python metric definitions (SPEC section 2), written from the formulas, for oracle tests."""

from __future__ import annotations

import math
from collections.abc import Sequence


def reciprocal_rank(labels: Sequence[float]) -> float | None:
    for i, rel in enumerate(labels, start=1):
        if rel > 0:
            return 1.0 / i
    return None


def ndcg(labels: Sequence[float], k: int, gain: str = "exponential") -> float | None:
    def g(rel: float) -> float:
        return 2.0**rel - 1.0 if gain == "exponential" else float(rel)

    def dcg(ls: Sequence[float]) -> float:
        return sum(g(rel) / math.log2(i + 1) for i, rel in enumerate(ls[:k], start=1))

    if not any(rel > 0 for rel in labels):
        return None
    return dcg(labels) / dcg(sorted(labels, reverse=True))


def average_precision(labels: Sequence[float], k: int, normalization: str = "relevant") -> float | None:
    n_rel = sum(1 for rel in labels if rel > 0)
    if n_rel == 0:
        return None
    hits, total = 0, 0.0
    for i, rel in enumerate(labels[:k], start=1):
        if rel > 0:
            hits += 1
            total += hits / i
    return total / (n_rel if normalization == "relevant" else min(n_rel, k))


def request_metrics(
    labels: Sequence[float],
    *,
    ndcg_cutoffs: Sequence[int] = (5, 10),
    map_cutoffs: Sequence[int] = (10,),
    gain: str = "exponential",
    map_normalization: str = "relevant",
) -> dict[str, float | None]:
    out: dict[str, float | None] = {"mrr": reciprocal_rank(labels)}
    for k in ndcg_cutoffs:
        out[f"ndcg@{k}"] = ndcg(labels, k, gain)
    for k in map_cutoffs:
        out[f"map@{k}"] = average_precision(labels, k, map_normalization)
    return out


def mean_metrics(
    lists: Sequence[Sequence[float]], *, no_relevant: str = "skip", **kwargs: object
) -> dict[str, float | None]:
    """Mean of each metric over lists, with the R = 0 policy applied (None when nothing counts)."""
    per = [request_metrics(ls, **kwargs) for ls in lists]  # type: ignore[arg-type]
    names = list(per[0]) if per else []
    out: dict[str, float | None] = {}
    for name in names:
        vals = [p[name] if p[name] is not None else (0.0 if no_relevant == "zero" else None) for p in per]
        kept = [v for v in vals if v is not None]
        out[name] = sum(kept) / len(kept) if kept else None
    return out


def auc_roc(scores: Sequence[float], relevant: Sequence[bool]) -> float | None:
    """Pairwise definition: P(score_pos > score_neg) + 0.5 P(equal)."""
    pos = [s for s, r in zip(scores, relevant, strict=True) if r]
    neg = [s for s, r in zip(scores, relevant, strict=True) if not r]
    if not pos or not neg:
        return None
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def order_by_score(scores: Sequence[float]) -> list[int]:
    """Indices by score descending, ties in input order (SPEC section 2, offline rows without position)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])
