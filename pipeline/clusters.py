"""Request-clustered score histograms: the mergeable state behind the clustered AUC standard errors.

Items of one request are correlated (they share the request's query, user and model quality), so a
pooled AUC's variance computed as if every item were independent is too small when quality varies from
request to request. The fix is a cluster-robust variance with whole requests as clusters. Keeping one
histogram per request would be unbounded, so requests are hashed into :data:`N_CLUSTERS` buckets and
each bucket keeps a score histogram; a bucket holds whole requests, so buckets are valid (coarser)
clusters. With 1,024 buckets a window of up to a few hundred requests has nearly one request per bucket.

The bucket of a request is a hash of its own content (the bit patterns of its scores, summed modulo
2**64, and its length), so it does not depend on batch, partition or arrival order: ``a.merge(b)``
equals the state built from the union of their requests, exactly (integer counts per (bucket, score)),
as long as the state stays within :data:`MAX_BINS`.

Scores are kept at a 21-bit order-preserving code (about 2.4e-4 relative resolution; the point estimates
use the exact scores). Memory is bounded, and the bounded state is still a function of the items alone:
a state of more than :data:`MAX_BINS` items folds its buckets to :data:`FOLDED_CLUSTERS` (bucket % 64,
still whole requests per cluster, 63 degrees of freedom, plenty for windows that large), then drops low
bits of the score codes (``level``) until at most :data:`MAX_BINS` cells remain, each valued at its cell's
lowest score. Parts never need a higher level than their union, so merging compressed parts gives the
compressed union exactly (:meth:`ClusterHistograms.compressed`): online windows and offline rows agree
on AUC standard errors to the last digit. The point estimates come from :class:`pipeline.auc.ScoreHistogram`
and are unaffected.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

N_CLUSTERS = 1024
# A state beyond MAX_BINS folds its buckets to FOLDED_CLUSTERS (bucket % 64: still whole requests per
# cluster, 63 degrees of freedom) before merging adjacent scores, so its score resolution stays fine.
FOLDED_CLUSTERS = 64
MAX_BINS = 16_384


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

    __slots__ = ("bucket", "scores", "pos", "neg", "clusters", "level", "_pooled")

    def __init__(
        self, bucket: IntArray, scores: FloatArray, pos: IntArray, neg: IntArray, clusters: int = N_CLUSTERS,
        level: int = 0,
    ) -> None:
        self.bucket = bucket
        self.scores = scores
        self.pos = pos
        self.neg = neg
        self.clusters = clusters  # N_CLUSTERS, or FOLDED_CLUSTERS once folded
        self.level = level  # low bits dropped from the 21-bit score codes (0: full resolution)
        self._pooled: tuple[FloatArray, IntArray, IntArray, IntArray] | None = None

    def pooled(self) -> tuple[FloatArray, IntArray, IntArray, IntArray]:
        """Distinct scores over all buckets, each bin's index into them, and positives and negatives per
        distinct score. Computed once (the arrays are never changed in place): AUC-ROC and AUC-PR standard
        errors of one state both need it, on every exporter rebuild."""
        if self._pooled is None:
            grid, inverse = np.unique(self.scores, return_inverse=True)
            inverse = inverse.reshape(-1)
            pos = np.bincount(inverse, weights=self.pos, minlength=grid.size).astype(np.int64)
            neg = np.bincount(inverse, weights=self.neg, minlength=grid.size).astype(np.int64)
            self._pooled = (grid, inverse, pos, neg)
        return self._pooled

    def folded(self) -> ClusterHistograms:
        """The same counts with buckets folded to ``FOLDED_CLUSTERS`` (bucket % 64)."""
        if self.clusters == FOLDED_CLUSTERS:
            return self
        out = ClusterHistograms.from_bins(self.bucket % FOLDED_CLUSTERS, self.scores, self.pos, self.neg)
        out.clusters, out.level = FOLDED_CLUSTERS, self.level
        return out

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
        # One sort of packed (bucket, dense score rank) keys: 3x faster than lexsort((s, b)), which was
        # the largest single cost of `rankwatch run` on a backlog (window merges, exporter rebuilds).
        _, rank = np.unique(s, return_inverse=True)
        key = (b.astype(np.uint64) << np.uint64(32)) | rank.reshape(-1).astype(np.uint64)
        order = np.argsort(key)
        key = key[order]
        b, s = b[order], s[order]
        new = np.empty(b.size, dtype=bool)
        new[0] = True
        new[1:] = key[1:] != key[:-1]
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
        clusters = min(p.clusters for p in parts)  # a folded part folds the merge
        merged = cls.from_bins(
            np.concatenate([p.bucket % clusters for p in parts]),
            np.concatenate([p.scores for p in parts]),
            np.concatenate([p.pos for p in parts]),
            np.concatenate([p.neg for p in parts]),
        )
        merged.clusters = clusters
        merged.level = max(p.level for p in parts)
        return merged.compressed(max_bins)

    def merge(self, other: ClusterHistograms) -> ClusterHistograms:
        return ClusterHistograms.merge_many([self, other])

    def compressed(self, max_bins: int = MAX_BINS) -> ClusterHistograms:
        """The state of the same items within the bound: a function of the items alone, not of how they
        were merged (see the module docstring).

        More than ``max_bins`` items: buckets folded to :data:`FOLDED_CLUSTERS`. Then the score codes lose
        low bits (``level``) until at most ``max_bins`` (bucket, code) cells remain, each valued at its
        cell's lowest score. A merge starts at the parts' highest level, which is never above the level
        of the union (a part has no more cells than the union at any level), so compressing parts and
        merging gives the state of the union, exactly.
        """
        items = int(self.pos.sum() + self.neg.sum()) if self.n_bins else 0
        if self.level == 0 and items <= max_bins:
            return self
        state = self if self.clusters == FOLDED_CLUSTERS or items <= max_bins else self.folded()
        # Bins are sorted by (bucket, score), so the cells of any level are runs: no sort needed.
        codes = _score_codes(state.scores).astype(np.int64)
        level = _level_for(state.bucket, codes, max_bins, state.level)
        if level == state.level == 0:
            return state
        new = np.empty(codes.size, dtype=bool)
        new[:1] = True
        np.not_equal(state.bucket[1:], state.bucket[:-1], out=new[1:])
        new[1:] |= (codes[1:] >> level) != (codes[:-1] >> level)
        starts = np.flatnonzero(new)
        lowest = (codes[starts] >> level) << level
        return ClusterHistograms(
            state.bucket[starts], _code_scores(lowest.astype(np.uint32)),
            np.add.reduceat(state.pos, starts), np.add.reduceat(state.neg, starts), state.clusters, level,
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket.astype("<i8").tobytes(),
            "scores": self.scores.astype("<f8").tobytes(),
            "pos": self.pos.astype("<i8").tobytes(),
            "neg": self.neg.astype("<i8").tobytes(),
            **({} if self.clusters == N_CLUSTERS else {"clusters": self.clusters}),
            **({} if self.level == 0 else {"level": self.level}),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ClusterHistograms:
        return cls(
            np.frombuffer(state["bucket"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["scores"], dtype="<f8").astype(np.float64),
            np.frombuffer(state["pos"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["neg"], dtype="<i8").astype(np.int64),
            int(state.get("clusters", N_CLUSTERS)), int(state.get("level", 0)),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterHistograms) and (self.clusters, self.level) == (other.clusters, other.level) and all(
            np.array_equal(getattr(self, a), getattr(other, a)) for a in ("bucket", "scores", "pos", "neg")
        )


# One uint32 key per item: bucket (10 bits) | score code (21 bits) | relevant (1 bit).
_CODE_BITS = 21
_BUCKET_SHIFT = _CODE_BITS + 1
_U1 = np.uint32(1)


def _score_codes(scores: FloatArray) -> npt.NDArray[np.uint32]:
    """Order-preserving 21-bit codes of the scores: float32's sign, exponent and top 12 mantissa bits.

    Monotone (a higher score never gets a lower code); scores within about 2.4e-4 relative share a code.
    """
    f32 = np.clip(scores, -3.0e38, 3.0e38).astype(np.float32)  # finite in float32
    f32 += np.float32(0.0)  # turns -0.0 into 0.0
    bits = f32.view(np.uint32)
    flip = (bits.view(np.int32) >> 31).view(np.uint32)  # all ones for negatives
    flip |= np.uint32(0x80000000)
    bits ^= flip
    bits >>= np.uint32(32 - _CODE_BITS)
    return bits


def score_label_codes(scores: FloatArray, relevant: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint32]:
    """``code << 1 | relevant`` per item (:func:`_score_codes`): the low 22 bits of the cluster keys."""
    code = _score_codes(scores)
    code <<= _U1
    code |= relevant
    return code


def _code_scores(codes: npt.NDArray[np.uint32]) -> FloatArray:
    """The lowest score of each code's cell (inverse of :func:`_score_codes` up to the dropped bits)."""
    u = codes.astype(np.uint32) << np.uint32(32 - _CODE_BITS)
    bits = np.where(u >> np.uint32(31), u ^ np.uint32(0x80000000), ~u)
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def _level_for(bucket: IntArray, codes: IntArray, max_bins: int, at_least: int) -> int:
    """The lowest level ``>= at_least`` at which the bins (sorted by bucket, then code) form at most
    ``max_bins`` (bucket, ``code >> level``) cells. Two neighbours of one bucket stay apart at ``level``
    iff their codes differ above it, i.e. iff the bit length of ``code_a ^ code_b`` exceeds it: one
    histogram of those bit lengths gives the cell count of every level at once."""
    if codes.size <= max_bins:
        return at_least
    same = bucket[1:] == bucket[:-1]
    bits = np.frexp((codes[1:] ^ codes[:-1])[same].astype(np.float64))[1]  # bit length (0 for equal codes)
    hist = np.bincount(bits, minlength=_CODE_BITS + 2)
    apart_from = same.size - int(np.count_nonzero(same))  # neighbours in different buckets
    # cells(L) = 1 + apart_from + #{same-bucket neighbours with bit length > L}
    above = hist[::-1].cumsum()[::-1]  # above[b] = #{bit length >= b}
    for level in range(at_least, _CODE_BITS + 1):
        if 1 + apart_from + int(above[level + 1]) <= max_bins:
            return level
    return _CODE_BITS


def cluster_histograms_by_group(
    scores: FloatArray, relevant: npt.NDArray[np.bool_], item_bucket: IntArray, item_group: IntArray, n_groups: int,
    max_bins: int = MAX_BINS, *, coded: npt.NDArray[np.uint32] | None = None,
) -> list[ClusterHistograms]:
    """One :class:`ClusterHistograms` per group id in ``range(n_groups)``, with one sort and no Python
    loop over items.

    The state is for standard errors only, so scores are kept at a 21-bit order-preserving code (about
    2.4e-4 relative resolution). That makes one ``uint64`` key per item, ``group << 32 | bucket << 22 |
    code << 1 | relevant``; one value sort of the keys (numpy's vectorised sort; no argsort of the floats,
    which costs about as much as the whole offline run) orders every group's bins, and bin starts, counts
    and positives follow from vectorised passes. A group with more than ``max_bins`` items is cut into
    equal-count runs per bucket instead (about ``max_bins`` bins, each valued at its highest item's code,
    as :meth:`ClusterHistograms.compressed` would do), so no group's state exceeds the bound.
    """
    m = scores.size
    if m == 0:
        return [ClusterHistograms.empty() for _ in range(n_groups)]
    group_sizes = np.bincount(item_group, minlength=n_groups) if n_groups > 1 else np.array([m])
    folded = group_sizes > max_bins  # these groups' states fold their buckets (see FOLDED_CLUSTERS)
    bucket = item_bucket.astype(np.uint32)
    if folded.all():
        bucket &= np.uint32(FOLDED_CLUSTERS - 1)
    elif folded.any():
        bucket = np.where(folded[item_group], bucket & np.uint32(FOLDED_CLUSTERS - 1), bucket)
    if coded is None:
        code = score_label_codes(scores, relevant)
    else:  # the caller's codes of the same items (shared between calls)
        code = coded.copy()
    code |= bucket << np.uint32(_BUCKET_SHIFT)
    if n_groups > 1:
        keys = code.astype(np.uint64)
        keys |= item_group.astype(np.uint64) << np.uint64(32)
        keys.sort()
    else:  # the key fits 32 bits: a sort of half the width
        code.sort()
        keys = code.astype(np.uint64)
    group_edges = np.searchsorted(keys, np.arange(n_groups + 1, dtype=np.uint64) << np.uint64(32))
    group_edges[-1] = m
    cell = keys >> np.uint64(1)  # (group, bucket, code) of each item
    new = np.empty(m, dtype=bool)
    new[0] = True
    np.not_equal(cell[1:], cell[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    count = np.diff(starts, append=m)
    pos = np.add.reduceat(keys & np.uint64(1), starts).astype(np.int64)
    last = keys[np.append(starts[1:], m) - 1] >> np.uint64(1)
    bin_edges = np.searchsorted(starts, group_edges)
    bin_bucket = ((last >> np.uint64(_CODE_BITS)) & np.uint64(N_CLUSTERS - 1)).astype(np.int64)
    values = _code_scores((last & np.uint64((1 << _CODE_BITS) - 1)).astype(np.uint32))
    neg = (count - pos).astype(np.int64)
    # Groups past the bound (folded above) lose score bits until they fit: ClusterHistograms.compressed,
    # so that a state built here equals any merge of states of its parts.
    return [
        ClusterHistograms(
            bin_bucket[a:b], values[a:b], pos[a:b], neg[a:b], FOLDED_CLUSTERS if folded[g] else N_CLUSTERS
        ).compressed(max_bins)
        if b > a else ClusterHistograms.empty()
        for g, (a, b) in enumerate(zip(bin_edges[:-1], bin_edges[1:], strict=True))
    ]
