"""Ledger entries -> transfer groups -> the JSON document of ``rankwatch transfer`` (SPEC section 7).

Layout: :class:`ComparisonRatio` (one comparison with its Fieller ratio); :class:`TransferGroup` (the
statistics of one group); :func:`group_key`; :func:`transfer_groups` (entries -> groups);
:func:`groups_document` (groups -> ``{"groups": [...]}``, JSON-ready: ``None`` for every undefined value,
never NaN).

Groups: the comparisons of one ``(metric, online_metric)`` pair, and with ``by_segment`` of one segment too
(``segment`` is ``"all"`` otherwise). A comparison recorded more than once counts once, at its latest
``recorded_at`` (:func:`.ledger.latest_entries`). Groups are sorted by ``(metric, online_metric, segment)``
and comparisons within a group by ``(experiment, candidate, reference, segment, surface)``; the bootstrap
of every group starts from the same ``seed``, so a group's intervals do not depend on which other groups
were asked for or on the order of the ledger lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rankwatch.pipeline.transfer.bootstrap import BootstrapInterval, bootstrap_transfer
from rankwatch.pipeline.transfer.fieller import Z95, FiellerInterval, fieller_interval
from rankwatch.pipeline.transfer.ledger import LedgerEntry, latest_entries
from rankwatch.pipeline.transfer.statistics import (
    correlation_corrected,
    kendall_tau_b,
    moments,
    sign_agreement,
    slope_corrected,
    slope_ols,
)

__all__ = ["ALL_SEGMENTS", "ComparisonRatio", "TransferGroup", "group_key", "groups_document", "transfer_groups"]

ALL_SEGMENTS = "all"


@dataclass(frozen=True)
class ComparisonRatio:
    """One ledger entry and its ratio ``online.diff / offline.diff`` with Fieller's 95 % interval."""

    entry: LedgerEntry
    ratio: FiellerInterval


@dataclass(frozen=True)
class TransferGroup:
    """Transfer statistics of one group of comparisons (``None``: undefined, see docs/transfer.md)."""

    metric: str
    online_metric: str
    segment: str
    n: int
    slope_ols: float | None
    slope_corrected: float | None
    slope_corrected_ci: BootstrapInterval
    correlation_corrected: float | None
    correlation_corrected_ci: BootstrapInterval
    sign_agreement: float | None
    sign_agreement_n: int
    kendall_tau: float | None
    predicted_online: float | None
    predicted_online_ci: BootstrapInterval | None
    comparisons: tuple[ComparisonRatio, ...]


def group_key(entry: LedgerEntry, by_segment: bool = False) -> tuple[str, str, str]:
    """``(metric, online_metric, segment or "all")``."""
    return (entry.metric, entry.online_metric or entry.metric, entry.segment if by_segment else ALL_SEGMENTS)


def _order(entry: LedgerEntry) -> tuple[str, ...]:
    return (entry.experiment, entry.candidate, entry.reference, entry.segment, entry.surface)


def _group(
    key: tuple[str, str, str], entries: list[LedgerEntry], candidate: tuple[float, float] | None,
    seed: int, resamples: int,
) -> TransferGroup:  # fmt: skip
    x = np.array([e.offline.diff for e in entries])
    sx = np.array([e.offline.stderr for e in entries])
    y = np.array([e.online.diff for e in entries])
    sy = np.array([e.online.stderr for e in entries])
    m = moments(x, y, sx, sy)
    slope = slope_corrected(m)
    boot = bootstrap_transfer(x, y, sx, sy, resamples=resamples, seed=seed, candidate=candidate)
    share, share_n = sign_agreement(x, y, sy, Z95)
    predicted = None if candidate is None or slope is None else slope * candidate[0]
    ratios = tuple(ComparisonRatio(e, fieller_interval(e.online.diff, e.online.stderr, e.offline.diff,
                                                       e.offline.stderr, Z95)) for e in entries)  # fmt: skip
    return TransferGroup(
        metric=key[0], online_metric=key[1], segment=key[2], n=len(entries), slope_ols=slope_ols(m),
        slope_corrected=slope, slope_corrected_ci=boot.slope_corrected,
        correlation_corrected=correlation_corrected(m), correlation_corrected_ci=boot.correlation_corrected,
        sign_agreement=share, sign_agreement_n=share_n, kendall_tau=kendall_tau_b(x, y),
        predicted_online=predicted, predicted_online_ci=boot.predicted_online if candidate is not None else None,
        comparisons=ratios,
    )  # fmt: skip


def transfer_groups(
    entries: Iterable[LedgerEntry],
    metric: str | None = None,
    by_segment: bool = False,
    candidate: tuple[float, float] | None = None,
    seed: int = 0,
    resamples: int = 2000,
) -> list[TransferGroup]:
    """The transfer statistics per group of ``entries`` (``metric`` keeps only that offline metric).

    ``candidate = (diff, stderr)`` of a new model's offline difference adds ``predicted_online``; ``seed``
    and ``resamples`` drive the bootstrap.
    """
    grouped: dict[tuple[str, str, str], list[LedgerEntry]] = {}
    for entry in latest_entries(entries):
        if metric is None or entry.metric == metric:
            grouped.setdefault(group_key(entry, by_segment), []).append(entry)
    return [_group(key, sorted(grouped[key], key=_order), candidate, seed, resamples) for key in sorted(grouped)]


def _interval(b: BootstrapInterval | None) -> list[float] | None:
    return None if b is None else b.interval


def groups_document(groups: Iterable[TransferGroup]) -> dict[str, Any]:
    """``{"groups": [...]}`` with the keys of SPEC section 7, in its order; undefined values are ``None``."""
    out = []
    for g in groups:
        comparisons = [{
            "experiment": c.entry.experiment, "candidate": c.entry.candidate, "reference": c.entry.reference,
            "segment": c.entry.segment, "surface": c.entry.surface, "ratio": c.ratio.ratio,
            "ratio_ci": [c.ratio.lo, c.ratio.hi] if c.ratio.bounded else None,
        } for c in g.comparisons]  # fmt: skip
        out.append({
            "metric": g.metric, "online_metric": g.online_metric, "segment": g.segment, "n": g.n,
            "slope_ols": g.slope_ols, "slope_corrected": g.slope_corrected,
            "slope_corrected_ci": _interval(g.slope_corrected_ci),
            "correlation_corrected": g.correlation_corrected,
            "correlation_corrected_ci": _interval(g.correlation_corrected_ci),
            "sign_agreement": g.sign_agreement, "sign_agreement_n": g.sign_agreement_n,
            "kendall_tau": g.kendall_tau, "predicted_online": g.predicted_online,
            "predicted_online_ci": _interval(g.predicted_online_ci), "comparisons": comparisons,
        })  # fmt: skip
    return {"groups": out}
