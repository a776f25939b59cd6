"""Options of the metric kernel (SPEC section 2), kept apart from the code they configure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Gain = Literal["exponential", "linear"]
MapNormalization = Literal["relevant", "min_relevant_k"]
NoRelevantPolicy = Literal["skip", "zero"]
GaucGroup = Literal["user", "request"]
GaucWeight = Literal["impressions", "clicks"]


@dataclass(frozen=True)
class MetricOptions:
    """How ranking metrics are computed.

    Parameters
    ----------
    ndcg_cutoffs, map_cutoffs
        The k of NDCG@k and MAP@k. Defaults: NDCG@5, NDCG@10, MAP@10.
    gain
        ``"exponential"`` (``2**rel - 1``, the default, ranx ``ndcg_burges``) or ``"linear"`` (``rel``,
        trec_eval ``ndcg_cut``).
    map_normalization
        ``"relevant"`` divides AP@k by R, the number of relevant items in the whole list (trec_eval
        ``map_cut``, the default); ``"min_relevant_k"`` divides by ``min(R, k)``.
    no_relevant
        ``"skip"`` leaves requests without any relevant item out of MRR, NDCG and MAP (default);
        ``"zero"`` counts them as 0.
    precision_cutoffs, recall_cutoffs, hit_rate_cutoffs
        The k of precision@k, recall@k and hit_rate@k. Defaults: precision@5, precision@10,
        recall@10, hit_rate@10. R = 0 requests follow ``no_relevant`` like MRR/NDCG/MAP.
    gauc_group, gauc_weight
        GAUC groups (``"user"``, the DIN paper's default, or ``"request"``) and their weights
        (``"impressions"``: shown items, or ``"clicks"``: relevant items).
    gauc_max_items
        Online cap on the items a window keeps for groups that are still open (user GAUC); items beyond it
        are dropped and counted (``gauc_items_dropped``).
    ctr_ranks
        Click-through by position is reported for ranks 1..``ctr_ranks``.
    drift_bins
        Quantile bins of the baseline's score distribution (PSI/KS against online windows).
    """

    ndcg_cutoffs: tuple[int, ...] = (5, 10)
    map_cutoffs: tuple[int, ...] = (10,)
    gain: Gain = "exponential"
    map_normalization: MapNormalization = "relevant"
    no_relevant: NoRelevantPolicy = "skip"
    # Cap on distinct scores kept per AUC state; beyond it adjacent scores are merged (see pipeline.metrics.auc).
    max_distinct_scores: int = field(default=200_000)
    # -- (kept after the original fields so positional construction is unchanged) --
    precision_cutoffs: tuple[int, ...] = (5, 10)
    recall_cutoffs: tuple[int, ...] = (10,)
    hit_rate_cutoffs: tuple[int, ...] = (10,)
    gauc_group: GaucGroup = "user"
    gauc_weight: GaucWeight = "impressions"
    gauc_max_items: int = 500_000
    ctr_ranks: int = 10
    drift_bins: int = 20

    def __post_init__(self) -> None:
        cutoffs = (*self.ndcg_cutoffs, *self.map_cutoffs, *self.precision_cutoffs, *self.recall_cutoffs)
        for k in (*cutoffs, *self.hit_rate_cutoffs):
            if not isinstance(k, int) or k < 1:
                raise ValueError(f"cut-off must be a positive integer, got {k!r}")
        if self.gain not in ("exponential", "linear"):
            raise ValueError(f"gain must be 'exponential' or 'linear', got {self.gain!r}")
        if self.map_normalization not in ("relevant", "min_relevant_k"):
            raise ValueError(f"map_normalization must be 'relevant' or 'min_relevant_k', got {self.map_normalization!r}")
        if self.no_relevant not in ("skip", "zero"):
            raise ValueError(f"no_relevant must be 'skip' or 'zero', got {self.no_relevant!r}")
        if self.max_distinct_scores < 2:
            raise ValueError("max_distinct_scores must be at least 2")
        if self.gauc_group not in ("user", "request"):
            raise ValueError(f"gauc_group must be 'user' or 'request', got {self.gauc_group!r}")
        if self.gauc_weight not in ("impressions", "clicks"):
            raise ValueError(f"gauc_weight must be 'impressions' or 'clicks', got {self.gauc_weight!r}")
        for name in ("gauc_max_items", "ctr_ranks", "drift_bins"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def rank_metric_names(self) -> tuple[str, ...]:
        """Names of the per-request metrics, in result-document order: ``mrr, ndcg@5, ndcg@10, map@10``,
        then ``precision@5, precision@10, recall@10, hit_rate@10``."""
        return (
            "mrr",
            *(f"ndcg@{k}" for k in self.ndcg_cutoffs),
            *(f"map@{k}" for k in self.map_cutoffs),
            *(f"precision@{k}" for k in self.precision_cutoffs),
            *(f"recall@{k}" for k in self.recall_cutoffs),
            *(f"hit_rate@{k}" for k in self.hit_rate_cutoffs),
        )

    @property
    def metric_names(self) -> tuple[str, ...]:
        """All metric names, including the pooled ``auc_roc``, ``auc_pr``, then ``gauc`` and ``positive_rate``."""
        return (*self.rank_metric_names, "auc_roc", "auc_pr", "gauc", "positive_rate")

    def to_dict(self) -> dict[str, object]:
        return {
            "ndcg_cutoffs": list(self.ndcg_cutoffs),
            "map_cutoffs": list(self.map_cutoffs),
            "gain": self.gain,
            "map_normalization": self.map_normalization,
            "no_relevant": self.no_relevant,
            "max_distinct_scores": self.max_distinct_scores,
            "precision_cutoffs": list(self.precision_cutoffs),
            "recall_cutoffs": list(self.recall_cutoffs),
            "hit_rate_cutoffs": list(self.hit_rate_cutoffs),
            "gauc_group": self.gauc_group,
            "gauc_weight": self.gauc_weight,
            "gauc_max_items": self.gauc_max_items,
            "ctr_ranks": self.ctr_ranks,
            "drift_bins": self.drift_bins,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> MetricOptions:
        return cls(
            ndcg_cutoffs=tuple(int(k) for k in data.get("ndcg_cutoffs", (5, 10))),  # type: ignore[attr-defined]
            map_cutoffs=tuple(int(k) for k in data.get("map_cutoffs", (10,))),  # type: ignore[attr-defined]
            gain=data.get("gain", "exponential"),  # type: ignore[arg-type]
            map_normalization=data.get("map_normalization", "relevant"),  # type: ignore[arg-type]
            no_relevant=data.get("no_relevant", "skip"),  # type: ignore[arg-type]
            max_distinct_scores=int(data.get("max_distinct_scores", 200_000)),  # type: ignore[call-overload]
            precision_cutoffs=tuple(int(k) for k in data.get("precision_cutoffs", (5, 10))),  # type: ignore[attr-defined]
            recall_cutoffs=tuple(int(k) for k in data.get("recall_cutoffs", (10,))),  # type: ignore[attr-defined]
            hit_rate_cutoffs=tuple(int(k) for k in data.get("hit_rate_cutoffs", (10,))),  # type: ignore[attr-defined]
            gauc_group=data.get("gauc_group", "user"),  # type: ignore[arg-type]
            gauc_weight=data.get("gauc_weight", "impressions"),  # type: ignore[arg-type]
            gauc_max_items=int(data.get("gauc_max_items", 500_000)),  # type: ignore[call-overload]
            ctr_ranks=int(data.get("ctr_ranks", 10)),  # type: ignore[call-overload]
            drift_bins=int(data.get("drift_bins", 20)),  # type: ignore[call-overload]
        )
