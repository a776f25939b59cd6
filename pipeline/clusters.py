"""Request-clustered score histograms: the mergeable state behind the clustered AUC standard errors.

Items of one request are correlated (they share the request's query, user and model quality), so a
pooled AUC's variance computed as if every item were independent is too small when quality varies from
request to request. The fix is a cluster-robust variance with whole requests as clusters. Keeping one
histogram per request would be unbounded, so requests are hashed into :data:`N_CLUSTERS` buckets and
each bucket keeps a score histogram; a bucket holds whole requests, so buckets are valid (coarser)
clusters, and with 32 buckets the variance estimate has up to 31 degrees of freedom.

The bucket of a request is a hash of its own content (the bit patterns of its scores, summed modulo
2**64, and its length), so it does not depend on batch, partition or arrival order: ``a.merge(b)``
equals the state built from the union of their requests, exactly (integer counts per (bucket, score)).

Scores are kept at float32 resolution (24 significant bits; the point estimates use the exact scores).
Memory is bounded: beyond :data:`MAX_BINS` (bucket, score) bins, adjacent scores of a bucket are merged
(valued at the highest). This only coarsens the standard error's score resolution; the point estimates
come from :class:`pipeline.auc.ScoreHistogram`, which is unaffected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

N_CLUSTERS = 1024
MAX_BINS = 65_536


def request_buckets(scores: FloatArray, lengths: IntArray) -> IntArray:
    """Bucket (``0 <= b < N_CLUSTERS``) of every list: a splitmix64 hash of its scores' bits and length.

    Order-free within the list (a wrapping sum), so the same request always lands in the same bucket.
    """
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.int64)
    bits = np.ascontiguousarray(scores, dtype=np.float64).view(np.uint64)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    h = np.zeros(n, dtype=np.uint64)
    full = lengths > 0
    if bits.size:
        h[full] = np.add.reduceat(bits, starts[full])
    h ^= lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    h ^= h >> np.uint64(30)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(27)
    h *= np.uint64(0x94D049BB133111EB)
    h ^= h >> np.uint64(31)
    return (h % np.uint64(N_CLUSTERS)).astype(np.int64)


class ClusterHistograms:
    """Positives and negatives per (bucket, score) bin, sorted by bucket then score; merges exactly."""

    __slots__ = ("bucket", "scores", "pos", "neg")

    def __init__(self, bucket: IntArray, scores: FloatArray, pos: IntArray, neg: IntArray) -> None:
        self.bucket = bucket
        self.scores = scores
        self.pos = pos
        self.neg = neg

    @classmethod
    def empty(cls) -> ClusterHistograms:
        return cls(np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64))

    @property
    def n_bins(self) -> int:
        return int(self.scores.size)

    @classmethod
    def from_bins(
        cls, bucket: npt.ArrayLike, scores: npt.ArrayLike, pos: npt.ArrayLike, neg: npt.ArrayLike
    ) -> ClusterHistograms:
        """Sum duplicate (bucket, score) bins of unsorted input."""
        b = np.asarray(bucket, dtype=np.int64)
        s = np.asarray(scores, dtype=np.float64)
        if b.size == 0:
            return cls.empty()
        order = np.lexsort((s, b))
        b, s = b[order], s[order]
        new = np.empty(b.size, dtype=bool)
        new[0] = True
        new[1:] = (b[1:] != b[:-1]) | (s[1:] != s[:-1])
        starts = np.flatnonzero(new)
        p = np.add.reduceat(np.asarray(pos, dtype=np.int64)[order], starts)
        n = np.add.reduceat(np.asarray(neg, dtype=np.int64)[order], starts)
        return cls(b[starts], s[starts], p, n)

    @classmethod
    def merge_many(cls, parts: list[ClusterHistograms], max_bins: int = MAX_BINS) -> ClusterHistograms:
        parts = [p for p in parts if p.n_bins]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0].compressed(max_bins)
        merged = cls.from_bins(
            np.concatenate([p.bucket for p in parts]),
            np.concatenate([p.scores for p in parts]),
            np.concatenate([p.pos for p in parts]),
            np.concatenate([p.neg for p in parts]),
        )
        return merged.compressed(max_bins)

    def merge(self, other: ClusterHistograms) -> ClusterHistograms:
        return ClusterHistograms.merge_many([self, other])

    def compressed(self, max_bins: int = MAX_BINS) -> ClusterHistograms:
        """At most about ``max_bins`` bins: runs of adjacent scores of one bucket become one bin."""
        n = self.n_bins
        if n <= max_bins:
            return self
        # Bin index within its bucket, scaled so that every bucket keeps about max_bins / n of its bins.
        sizes = np.bincount(self.bucket, minlength=N_CLUSTERS)
        first = np.repeat(np.cumsum(sizes) - sizes, sizes)
        rank = np.arange(n) - first
        coarse = (rank * max_bins) // n
        new = np.empty(n, dtype=bool)
        new[0] = True
        new[1:] = (self.bucket[1:] != self.bucket[:-1]) | (coarse[1:] != coarse[:-1])
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], n) - 1
        return ClusterHistograms(
            self.bucket[starts], self.scores[ends].copy(),
            np.add.reduceat(self.pos, starts), np.add.reduceat(self.neg, starts),
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket.astype("<i8").tobytes(),
            "scores": self.scores.astype("<f8").tobytes(),
            "pos": self.pos.astype("<i8").tobytes(),
            "neg": self.neg.astype("<i8").tobytes(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ClusterHistograms:
        return cls(
            np.frombuffer(state["bucket"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["scores"], dtype="<f8").astype(np.float64),
            np.frombuffer(state["pos"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["neg"], dtype="<i8").astype(np.int64),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterHistograms) and all(
            np.array_equal(getattr(self, a), getattr(other, a)) for a in self.__slots__
        )


def _sortable(scores: FloatArray) -> npt.NDArray[np.uint64]:
    """Order-preserving unsigned codes of the scores rounded to float32 (24-bit mantissa), as uint64."""
    f32 = scores.astype(np.float32)
    f32 += np.float32(0.0)  # turns -0.0 into 0.0
    bits = f32.view(np.uint32)
    flip = (bits.view(np.int32) >> 31).view(np.uint32)  # all ones for negatives
    flip |= np.uint32(0x80000000)
    bits ^= flip
    return bits.astype(np.uint64)


def _unsortable(codes: npt.NDArray[np.uint64]) -> FloatArray:
    u = codes.astype(np.uint32)
    bits = np.where(u >> np.uint32(31), u ^ np.uint32(0x80000000), ~u)
    return bits.view(np.float32).astype(np.float64)


def _equal_count_runs(sorted_keys: npt.NDArray[np.uint64], max_bins: int) -> IntArray:
    """Starts of runs of about ``m / max_bins`` items each, never across buckets (about ``max_bins`` runs).

    Too many items for the state: each bucket's items are cut into equal-count runs, each valued at its
    highest score, as :meth:`ClusterHistograms.compressed` would do, without building every bin first
    (work on ``max_bins``-sized arrays plus one gather). A tie may span two runs; both keep the same score.
    """
    m = sorted_keys.size
    edges = np.searchsorted(sorted_keys, np.arange(N_CLUSTERS + 1, dtype=np.uint64) << np.uint64(33))
    sizes = np.diff(edges)
    runs = np.where(sizes > 0, np.maximum(1, (sizes * max_bins) // m), 0)
    bucket_of_run = np.repeat(np.arange(N_CLUSTERS), runs)
    j = np.arange(runs.sum()) - np.repeat(np.cumsum(runs) - runs, runs)
    return (edges[bucket_of_run] + (j * sizes[bucket_of_run]) // runs[bucket_of_run]).astype(np.int64)


def cluster_histograms_by_group(
    scores: FloatArray, relevant: npt.NDArray[np.bool_], item_bucket: IntArray, item_group: IntArray, n_groups: int,
    max_bins: int = MAX_BINS,
) -> list[ClusterHistograms]:
    """One :class:`ClusterHistograms` per group id in ``range(n_groups)``.

    The state is for standard errors only, so scores are kept at float32 resolution; that makes one
    ``uint64`` key per item, ``bucket << 33 | score code << 1 | relevant``, and a value sort of the keys
    per group gives every bin and its positives (no argsort of the floats, which costs about as much as
    the whole offline run). Groups are split with one radix sort of the group ids, as in
    :func:`pipeline.auc.histograms_by_group`.
    """
    if scores.size == 0:
        return [ClusterHistograms.empty() for _ in range(n_groups)]
    keys = _sortable(scores)
    keys <<= np.uint64(1)
    keys |= relevant
    keys |= item_bucket.astype(np.uint64) << np.uint64(33)
    if n_groups == 1:
        bounds = np.array([0, keys.size])
    else:
        small = np.uint8 if n_groups <= 1 << 8 else np.uint16 if n_groups <= 1 << 16 else np.int64
        by_group = np.argsort(item_group.astype(small), kind="stable")
        bounds = np.searchsorted(item_group[by_group], np.arange(n_groups + 1))
        keys = keys[by_group]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if a == b:
            out.append(ClusterHistograms.empty())
            continue
        k = np.sort(keys[a:b])
        m = k.size
        if m > max_bins:
            starts = _equal_count_runs(k, max_bins)
        else:
            cell = k >> np.uint64(1)  # (bucket, score) of each item
            new = np.empty(m, dtype=bool)
            new[0] = True
            np.not_equal(cell[1:], cell[:-1], out=new[1:])
            starts = np.flatnonzero(new)
        count = np.diff(starts, append=m)
        pos = np.add.reduceat(k & np.uint64(1), starts).astype(np.int64)
        last = k[np.append(starts[1:], m) - 1] >> np.uint64(1)
        out.append(ClusterHistograms(
            (last >> np.uint64(32)).astype(np.int64), _unsortable(last & np.uint64(0xFFFFFFFF)),
            pos, (count - pos).astype(np.int64),
        ))
    return out
