r"""GAUC's mergeable state (:class:`GaucSums`): sums of the closed groups, the items of the groups still open.

Layout: :func:`dense_ids` (the open groups' users numbered in key order), :class:`GaucSums` (merge, close,
value and standard error, snapshot state), :func:`weighted_moments` (per-slice sums and second moments of
per-group AUCs). The per-group AUC itself is :mod:`pipeline.metrics.gauc`'s.

Why apart from it: the group AUC is a kernel over one batch of items; this is what the online windows
carry across batches (a user's requests span them) and what the result document closes, with its SE.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rankwatch.pipeline.metrics.gauc import (
    BoolArray,
    FloatArray,
    GroupAuc,
    IntArray,
    ScoreImage,
    group_auc,
    run_starts,
)
from rankwatch.pipeline.metrics.uncertainty import ratio_variance


def dense_ids(keys: IntArray) -> tuple[IntArray, IntArray]:
    """``(ids, uniques)``: what ``np.unique(keys, return_inverse=True)`` gives, reversed, computed over the runs
    of equal keys.

    An open group's keys are its users', one per item, so they come in runs (a request's items); the sort is of
    one key a run. About 4x faster than ``pd.factorize(keys, sort=True)`` (the former way, hashing every item)
    and 20x faster than ``np.unique`` on 2 M items of 100k requests, and it keeps pandas out of the streaming
    core's imports (``rankwatch replay`` imports no pandas).
    """
    keys = np.asarray(keys)
    if keys.size == 0:
        return np.empty(0, dtype=np.int64), keys.copy()
    starts = run_starts(keys)
    uniques, run_ids = np.unique(keys[starts], return_inverse=True)
    lengths = np.diff(starts, append=keys.size)
    return np.repeat(run_ids.astype(np.int64, copy=False), lengths), uniques


class GaucSums:
    """Mergeable GAUC state of a slice: closed sums, plus the items of still-open groups (online, by user).

    ``weighted`` = sum of ``w_g AUC_g`` and ``weight`` = sum of ``w_g`` over closed two-class groups;
    ``groups``/``excluded`` count closed groups with/without both classes. The open items (a 64-bit
    group key, score, relevance) belong to groups that may still grow; :meth:`value` evaluates them.
    They are kept as a list of chunks, joined only when read, so merging many small batches into a
    window costs linear time. At most ``max_open_items`` are kept by :meth:`merge`; the rest are dropped
    and counted in ``dropped``. ``available`` is False when the input had no group key (offline without
    ``user_id``): GAUC is then null.
    """

    __slots__ = ("weighted", "weight", "groups", "excluded", "available", "dropped", "_chunks", "_n_open", "moments",
                 "_closed_memo")

    def __init__(
        self,
        weighted: float = 0.0,
        weight: float = 0.0,
        groups: int = 0,
        excluded: int = 0,
        available: bool = True,
        dropped: int = 0,
        open_keys: IntArray | None = None,
        open_scores: FloatArray | None = None,
        open_relevant: BoolArray | None = None,
        moments: tuple[float, float, float] | None = (0.0, 0.0, 0.0),
    ) -> None:
        self.weighted, self.weight, self.groups, self.excluded = weighted, weight, groups, excluded
        self.available, self.dropped = available, dropped
        # sum (w_g AUC_g)^2, sum w_g^2, sum w_g^2 AUC_g over the closed groups (the GAUC standard error);
        # None for states written before the moments were kept.
        self.moments = moments
        self._chunks: list[tuple[IntArray, FloatArray, BoolArray]] = []
        self._n_open = 0
        # _closed() per weight kind until the next merge: a result document asks for the value and its
        # SE, each of which closes every open group (a sort of all open items).
        self._closed_memo: dict[str, tuple[float, float, int, int, tuple[float, float, float] | None]] = {}
        if open_keys is not None and open_keys.size:
            assert open_scores is not None and open_relevant is not None
            self._chunks.append((open_keys, open_scores, open_relevant))
            self._n_open = int(open_keys.size)

    @property
    def n_open(self) -> int:
        return self._n_open

    def open_items(self) -> tuple[IntArray, FloatArray, BoolArray]:
        """The open items as three arrays (the chunks joined once, then kept joined)."""
        if not self._chunks:
            return np.empty(0, np.int64), np.empty(0), np.empty(0, bool)
        if len(self._chunks) > 1:
            self._chunks = [tuple(np.concatenate(parts) for parts in zip(*self._chunks, strict=True))]  # type: ignore[list-item]
        return self._chunks[0]

    def merge(self, other: GaucSums, max_open_items: int) -> None:
        self._closed_memo.clear()
        self.weighted += other.weighted
        self.weight += other.weight
        self.groups += other.groups
        self.excluded += other.excluded
        self.available = self.available and other.available
        self.dropped += other.dropped
        self.moments = _add_moments(self.moments, other.moments)
        room = max(max_open_items - self._n_open, 0)
        for keys, scores, rel in other._chunks:
            take = min(room, keys.size)
            self.dropped += int(keys.size) - take
            if take:
                self._chunks.append((keys[:take], scores[:take], rel[:take]))
                self._n_open += take
                room -= take

    def totals(self, weight_kind: str, distinct: FloatArray | None = None) -> tuple[float, float, int, int]:
        """``(weighted, weight, groups, excluded)`` including the open groups (``distinct``: see :meth:`value`)."""
        return self._closed(weight_kind, distinct)[:4]  # type: ignore[return-value]

    def _closed(self, weight_kind: str, distinct: FloatArray | None = None,
                ) -> tuple[float, float, int, int, tuple[float, float, float] | None]:
        """The sums and moments with the open groups closed (not stored: they may still grow)."""
        if self._n_open == 0:
            return self.weighted, self.weight, self.groups, self.excluded, self.moments
        memo = self._closed_memo.get(weight_kind)
        if memo is not None:
            return memo
        keys, scores, rel = self.open_items()
        dense, codes = dense_ids(keys)
        if distinct is None:
            counts = group_auc(dense, scores, rel, codes.size)
        else:  # the scores' image without a sort of every score (GroupAuc's many-ties case sorted twice)
            counts = group_auc(dense, scores, rel, codes.size,
                               image=ScoreImage.of(scores, rel, codes.size, distinct=distinct))
        w, s, g, e, m = weighted_moments(counts, np.zeros(codes.size, np.int64), 1, weight_kind)
        memo = (self.weighted + float(w[0]), self.weight + float(s[0]), self.groups + int(g[0]),
                self.excluded + int(e[0]), _add_moments(self.moments, _moments_of(m[0])))  # fmt: skip
        self._closed_memo[weight_kind] = memo
        return memo

    def value(self, weight_kind: str, distinct: FloatArray | None = None) -> tuple[float | None, int | None, int | None]:
        """``(gauc, groups, excluded)``; GAUC is None without a two-class group or without a group key.

        ``distinct``: the sorted distinct scores of the open items, where the caller knows them (an exact AUC
        histogram of the same items): closing the groups then sorts the items once."""
        if not self.available:
            return None, None, None
        weighted, weight, groups, excluded = self.totals(weight_kind, distinct)
        return (weighted / weight if weight > 0 else None), groups, excluded

    def stderr(self, weight_kind: str, distinct: FloatArray | None = None) -> float | None:
        r"""SE of GAUC as a ratio of sums over independent groups (users), by the delta method.

        :math:`GAUC = \sum_g w_g A_g / \sum_g w_g`; with :math:`Y_g = w_g A_g` and :math:`N_g = w_g` this
        is :func:`pipeline.metrics.uncertainty.ratio_variance` over the two-class groups, which counts both the
        spread of the groups' AUCs and each group's own estimation noise (a group-clustered SE). None
        below two groups, without a group key, or for a state from before the moments were kept.
        """
        if not self.available:
            return None
        weighted, weight, groups, _excluded, moments = self._closed(weight_kind, distinct)
        if moments is None:
            return None
        var = ratio_variance(groups, weighted, weight, moments[0], moments[1], moments[2])
        return None if var is None else math.sqrt(var)

    def to_state(self) -> dict[str, Any]:
        keys, scores, rel = self.open_items()
        return {
            "sums": [self.weighted, self.weight, self.groups, self.excluded, self.available, self.dropped],
            **({} if self.moments is None else {"moments": list(self.moments)}),
            "keys": keys.astype("<i8").tobytes(),
            "scores": scores.astype("<f8").tobytes(),
            "relevant": rel.astype("u1").tobytes(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GaucSums:
        w, s, g, e, a, d = state["sums"]
        moments = state.get("moments")
        return cls(
            float(w), float(s), int(g), int(e), bool(a), int(d),
            np.frombuffer(state["keys"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["scores"], dtype="<f8").astype(np.float64),
            np.frombuffer(state["relevant"], dtype="u1").astype(bool),
            None if moments is None else _moments_of(moments),
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GaucSums) and self.to_state() == other.to_state()


def weighted_moments(
    counts: GroupAuc, slice_of_group: IntArray, n_slices: int, weight_kind: str
) -> tuple[FloatArray, FloatArray, IntArray, IntArray, FloatArray]:
    """Per slice: ``sum w_g AUC_g``, ``sum w_g``, two-class groups, one-class groups (non-empty), and the
    second moments ``sum (w_g AUC_g)^2``, ``sum w_g^2``, ``sum w_g^2 AUC_g`` (columns of the last array)
    that the GAUC standard error needs."""
    present = (counts.pos + counts.neg) > 0
    mixed = (counts.pos > 0) & (counts.neg > 0)
    w = (counts.pos + counts.neg if weight_kind == "impressions" else counts.pos).astype(np.float64)
    sl, auc, wm = slice_of_group[mixed], counts.auc()[mixed], w[mixed]
    wa = wm * auc
    weighted = np.bincount(sl, weights=wa, minlength=n_slices).astype(np.float64)
    weight = np.bincount(sl, weights=wm, minlength=n_slices).astype(np.float64)
    groups = np.bincount(sl, minlength=n_slices).astype(np.int64)
    excluded = np.bincount(slice_of_group[present & ~mixed], minlength=n_slices).astype(np.int64)
    moments = np.stack([np.bincount(sl, weights=x, minlength=n_slices) for x in (wa * wa, wm * wm, wa * wm)],
                       axis=1).astype(np.float64)  # fmt: skip
    return weighted, weight, groups, excluded, moments


def _moments_of(values: Any) -> tuple[float, float, float]:
    a, b, c = (float(x) for x in values)
    return a, b, c


def _add_moments(
    a: tuple[float, float, float] | None, b: tuple[float, float, float] | None
) -> tuple[float, float, float] | None:
    """Moments of two disjoint sets of groups; unknown (None) if either is."""
    return None if a is None or b is None else (a[0] + b[0], a[1] + b[1], a[2] + b[2])
