"""A sequence of model versions with a known offline-to-online transfer per segment.

Layout: :class:`VersionTransfer` (the settings: true slope per segment, spreads and noises);
:func:`version_comparison` (version ``k`` against version ``k - 1`` -> its ledger entries, one per segment
plus the all-segments line); :func:`version_truth` (the true differences behind one comparison, for tests).

The model of version ``k`` (``k = 1, 2, ...``) against its predecessor, per segment ``s`` with true slope
``b_s``, drawn from ``numpy.random.default_rng([seed, k])`` (so a version's lines do not depend on how
many came before):

- true offline difference ``xi ~ N(0, spread^2)`` of the metric (``ndcg@10``), the segment's change of
  quality that an evaluation set with infinitely many requests would see;
- measured offline ``x = xi + sx * N(0, 1)`` with ``sx ~ U(offline_se)`` (the evaluation set is finite);
- true online difference ``b_s * xi + scatter * N(0, 1)`` (what the offline metric misses), measured
  ``y = that + sy * N(0, 1)`` with ``sy ~ U(online_se)`` (the experiment is finite).

The all-segments line is the equal-share mean of the segments' lines: ``x_all = mean(x_s)`` with
``sx_all = sqrt(sum(sx_s^2)) / S`` (the same for ``y``), so its true slope is the share-weighted mix.
The defaults make offline noise large enough that OLS is visibly attenuated (reliability about 0.8) while
a few dozen versions pin the corrected slope down. ``power_user`` transfers 0.3, above the shipped
floor of RankwatchTransferSlopeBelowFloor (0.2), so the demo raises no transfer alert; a zero slope would.

Why a statistical model and not traffic per version: the demo must stay fast, and the ledger only records
differences with their standard errors; running every version's traffic through the kernel would cost
minutes and show the same thing. Pure: ``recorded_at`` is given by the caller (the application's clock).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rankwatch.pipeline.slicing import ALL_VALUE
from rankwatch.pipeline.transfer.ledger import Difference, LedgerEntry

__all__ = ["VersionTransfer", "version_comparison", "version_truth"]

DEFAULT_SLOPES = {"new_user": 0.5, "returning": 1.0, "power_user": 0.3}


@dataclass(frozen=True)
class VersionTransfer:
    """Settings of the version sequence (module docstring); ``slopes`` maps segment -> true slope."""

    seed: int = 7
    slopes: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SLOPES))
    metric: str = "ndcg@10"
    spread: float = 0.01  # sd of the true offline differences between consecutive versions
    offline_se: tuple[float, float] = (0.003, 0.007)  # U(lo, hi) of the offline standard errors
    online_se: tuple[float, float] = (0.001, 0.003)
    scatter: float = 0.002  # sd of the online difference around the line (what offline misses)
    offline_n: int = 20_000  # evaluation requests per segment (both models score them: paired)
    online_n: int = 200_000  # online requests per segment (both arms)
    name: str = "ranker"  # versions are f"{name}-v{k}"; the experiment is named after the candidate

    def __post_init__(self) -> None:
        if not self.slopes:
            raise ValueError("slopes: at least one segment")
        for label, (lo, hi) in (("offline_se", self.offline_se), ("online_se", self.online_se)):
            if not 0 < lo <= hi or not math.isfinite(hi):
                raise ValueError(f"{label} must be 0 < lo <= hi, got {(lo, hi)}")
        if not (self.spread > 0 and self.scatter >= 0):
            raise ValueError("spread must be > 0 and scatter >= 0")


@dataclass(frozen=True)
class _Draw:
    xi: np.ndarray  # true offline differences, one per segment (in ``slopes`` order)
    x: np.ndarray
    sx: np.ndarray
    online_true: np.ndarray
    y: np.ndarray
    sy: np.ndarray


def _draw(cfg: VersionTransfer, k: int) -> _Draw:
    if k < 1:
        raise ValueError(f"version index must be >= 1, got {k}")
    rng = np.random.default_rng([cfg.seed, k])
    m = len(cfg.slopes)
    slopes = np.array(list(cfg.slopes.values()), dtype=np.float64)
    xi = rng.normal(0.0, cfg.spread, m)
    sx, sy = rng.uniform(*cfg.offline_se, m), rng.uniform(*cfg.online_se, m)
    x = xi + rng.normal(0.0, 1.0, m) * sx
    online_true = slopes * xi + rng.normal(0.0, 1.0, m) * cfg.scatter
    y = online_true + rng.normal(0.0, 1.0, m) * sy
    return _Draw(xi, x, sx, online_true, y, sy)


def version_truth(cfg: VersionTransfer, k: int) -> dict[str, tuple[float, float]]:
    """``{segment: (true offline difference, true online difference)}`` of version ``k`` vs ``k - 1``."""
    d = _draw(cfg, k)
    return {s: (float(d.xi[i]), float(d.online_true[i])) for i, s in enumerate(cfg.slopes)}


def version_comparison(cfg: VersionTransfer, k: int, *, recorded_at: str) -> list[LedgerEntry]:
    """Ledger entries of version ``k`` against ``k - 1``: one per segment, then the all-segments line."""
    d = _draw(cfg, k)
    candidate, reference = f"{cfg.name}-v{k}", f"{cfg.name}-v{k - 1}"
    rows = [(s, float(d.x[i]), float(d.sx[i]), float(d.y[i]), float(d.sy[i]), cfg.offline_n, cfg.online_n)
            for i, s in enumerate(cfg.slopes)]  # fmt: skip
    m = len(rows)
    rows.append((ALL_VALUE, float(d.x.mean()), float(math.sqrt(float(d.sx @ d.sx)) / m), float(d.y.mean()),
                 float(math.sqrt(float(d.sy @ d.sy)) / m), cfg.offline_n * m, cfg.online_n * m))  # fmt: skip
    return [
        LedgerEntry(experiment=candidate, candidate=candidate, reference=reference, segment=seg, surface=ALL_VALUE,
                    metric=cfg.metric, offline=Difference(x, sx, n_off), online=Difference(y, sy, n_on),
                    recorded_at=recorded_at)  # fmt: skip
        for seg, x, sx, y, sy, n_off, n_on in rows
    ]
