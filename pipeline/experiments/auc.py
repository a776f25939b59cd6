"""Standard errors of one arm's pooled AUC-ROC and AUC-PR, the interface the A/B report reads.

They are the shared ones of :mod:`rankwatch.pipeline.metrics.uncertainty` (DeLong from the score histogram for
AUC-ROC, the infinitesimal jackknife for AUC-PR; request-clustered where the aggregate keeps its request
buckets, see docs/metrics.md section 4a), so an arm's AUC interval in `rankwatch ab` is the one the
result documents and the exporter show. Arms are independent, so the variance of a difference is the sum.
"""

from __future__ import annotations

from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.uncertainty import auc_pr_stderr, auc_roc_stderr

__all__ = ["auc_standard_errors"]


def auc_standard_errors(aggregate: RankingAggregate) -> dict[str, float | None]:
    """``{"auc_roc": se, "auc_pr": se}`` of one arm and slice (None where undefined, never 0)."""
    hist = aggregate.histogram
    if hist.auc_roc() is None:
        return {"auc_roc": None, "auc_pr": None}
    return {"auc_roc": auc_roc_stderr(hist, aggregate.clusters), "auc_pr": auc_pr_stderr(hist, aggregate.clusters)}
