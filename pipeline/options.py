"""Options of the metric kernel (SPEC section 2), kept apart from the code they configure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Gain = Literal["exponential", "linear"]
MapNormalization = Literal["relevant", "min_relevant_k"]
NoRelevantPolicy = Literal["skip", "zero"]


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
    """

    ndcg_cutoffs: tuple[int, ...] = (5, 10)
    map_cutoffs: tuple[int, ...] = (10,)
    gain: Gain = "exponential"
    map_normalization: MapNormalization = "relevant"
    no_relevant: NoRelevantPolicy = "skip"
    # Cap on distinct scores kept per AUC state; beyond it adjacent scores are merged (see pipeline.auc).
    max_distinct_scores: int = field(default=200_000)

    def __post_init__(self) -> None:
        for k in (*self.ndcg_cutoffs, *self.map_cutoffs):
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

    @property
    def rank_metric_names(self) -> tuple[str, ...]:
        """Names of the per-request metrics, in result-document order: ``mrr, ndcg@5, ndcg@10, map@10``."""
        return ("mrr", *(f"ndcg@{k}" for k in self.ndcg_cutoffs), *(f"map@{k}" for k in self.map_cutoffs))

    @property
    def metric_names(self) -> tuple[str, ...]:
        """All metric names, including the pooled ``auc_roc`` and ``auc_pr``."""
        return (*self.rank_metric_names, "auc_roc", "auc_pr")

    def to_dict(self) -> dict[str, object]:
        return {
            "ndcg_cutoffs": list(self.ndcg_cutoffs),
            "map_cutoffs": list(self.map_cutoffs),
            "gain": self.gain,
            "map_normalization": self.map_normalization,
            "no_relevant": self.no_relevant,
            "max_distinct_scores": self.max_distinct_scores,
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
        )
