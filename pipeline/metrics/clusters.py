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
use the exact scores). Memory is bounded: beyond :data:`MAX_BINS` (bucket, score) bins a state folds its
buckets to :data:`FOLDED_CLUSTERS` (bucket % 64, still whole requests per cluster, 63 degrees of freedom,
plenty for windows that large) and merges runs of adjacent scores of a bucket (valued at the highest).
Beyond the bound the AUC standard errors are therefore approximate (within about 1 % in tests; merging
compressed parts and compressing the union give slightly different runs); the point estimates come from
:class:`pipeline.metrics.auc.ScoreHistogram` and are unaffected.
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
    The hash is of the score values, not their spelling: ``-0.0`` counts as ``0.0`` (a ground truth written
    by pandas, or any JSON writer that drops the sign of zero, must put the request in the same bucket).
    """
    n = lengths.size
    if n == 0:
        return np.zeros(0, np.int64)
    bits = (np.asarray(scores, dtype=np.float64) + 0.0).view(np.uint64)  # + 0.0: -0.0 becomes 0.0
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

    __slots__ = ("bucket", "scores", "pos", "neg", "clusters", "_pooled")

    def __init__(
        self, bucket: IntArray, scores: FloatArray, pos: IntArray, neg: IntArray, clusters: int = N_CLUSTERS
    ) -> None:
        self.bucket = bucket
        self.scores = scores
        self.pos = pos
        self.neg = neg
        self.clusters = clusters  # N_CLUSTERS, or FOLDED_CLUSTERS once folded
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
        out.clusters = FOLDED_CLUSTERS
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
        small = int(b.min()) >= 0 and int(b.max()) < 1 << 16
        key = _bin_keys(b, s) if small else None
        new = np.empty(b.size, dtype=bool)
        new[0] = True
        if key is not None:
            # Merges and folds concatenate parts already sorted by (bucket, score): a stable sort
            # (timsort) of one key merges those runs, about 5x faster than the two sorts below.
            order = np.argsort(key, kind="stable")
            key = key[order]
            np.not_equal(key[1:], key[:-1], out=new[1:])
        else:
            if not small:
                order = np.lexsort((s, b))
            else:
                # One comparison sort of the scores, then a stable radix sort of the buckets (numpy sorts
                # 16-bit keys by radix with kind="stable"): about 1.5-2x faster than the dense score ranks
                # of np.unique packed with the bucket into one key, which took two comparison sorts (and
                # was itself 3x faster than lexsort((s, b))).
                order = np.argsort(s)
                order = order[np.argsort(b[order].astype(np.uint16), kind="stable")]
            sb, ss = b[order], s[order]
            np.not_equal(sb[1:], sb[:-1], out=new[1:])
            new[1:] |= ss[1:] != ss[:-1]  # -0.0 == 0.0, as np.unique had it
        starts = np.flatnonzero(new)
        p = np.add.reduceat(np.asarray(pos, dtype=np.int64)[order], starts)
        n = np.add.reduceat(np.asarray(neg, dtype=np.int64)[order], starts)
        first = order[starts]
        return cls(b[first], s[first], p, n)

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
        return merged.compressed(max_bins)

    def merge(self, other: ClusterHistograms) -> ClusterHistograms:
        return ClusterHistograms.merge_many([self, other])

    def compressed(self, max_bins: int = MAX_BINS) -> ClusterHistograms:
        """At most about ``max_bins`` bins: buckets folded, then runs of adjacent scores of one bucket
        become one bin."""
        n = self.n_bins
        if n <= max_bins:
            return self
        if self.clusters != FOLDED_CLUSTERS:
            return self.folded().compressed(max_bins)
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
            np.add.reduceat(self.pos, starts), np.add.reduceat(self.neg, starts), self.clusters,
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket.astype("<i8").tobytes(),
            "scores": self.scores.astype("<f8").tobytes(),
            "pos": self.pos.astype("<i8").tobytes(),
            "neg": self.neg.astype("<i8").tobytes(),
            **({} if self.clusters == N_CLUSTERS else {"clusters": self.clusters}),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ClusterHistograms:
        return cls(
            np.frombuffer(state["bucket"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["scores"], dtype="<f8").astype(np.float64),
            np.frombuffer(state["pos"], dtype="<i8").astype(np.int64),
            np.frombuffer(state["neg"], dtype="<i8").astype(np.int64),
            int(state.get("clusters", N_CLUSTERS)),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClusterHistograms) and self.clusters == other.clusters and all(
            np.array_equal(getattr(self, a), getattr(other, a)) for a in ("bucket", "scores", "pos", "neg")
        )


def _bin_keys(bucket: IntArray, scores: FloatArray) -> npt.NDArray[np.uint64] | None:
    """``bucket << 32 | order-preserving bits of the float32 score`` per bin, ordered as ``(bucket, score)``
    with equal keys exactly for equal scores (``-0.0`` is ``0.0``); None unless every score is a float32
    value (NaN, infinite or finer scores), as the :func:`_code_scores` of every state built here are.

    ``0 <= bucket < 2**16`` is the caller's to check.
    """
    with np.errstate(over="ignore"):  # beyond float32's range: inf, never equal, so the general path
        f32 = scores.astype(np.float32)
    if not np.array_equal(f32, scores):  # NaN is never equal: NaN scores keep the general path
        return None
    f32 += np.float32(0.0)  # turns -0.0 into 0.0
    bits = f32.view(np.uint32)
    flip = (bits.view(np.int32) >> 31).view(np.uint32)  # all ones for negatives
    flip |= np.uint32(0x80000000)
    bits ^= flip
    key = bucket.astype(np.uint64)
    key <<= np.uint64(32)
    key |= bits
    return key


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
    return _bins_of_sorted(keys, n_groups, folded, max_bins)


def cluster_histograms_by_request_group(
    scores: FloatArray, relevant: npt.NDArray[np.bool_], request_bucket: IntArray, request_group: IntArray,
    lengths: IntArray, n_groups: int, max_bins: int = MAX_BINS, *, coded: npt.NDArray[np.uint32] | None = None,
) -> list[ClusterHistograms]:
    """:func:`cluster_histograms_by_group` for flat lists in request order, with the bucket
    (:func:`request_buckets`) and group of every request (``lengths[j]`` items of list ``j``).

    The same keys and states; the key's bucket and group bits are put together per request and
    expanded once, so no item-level bucket or group array is built (each is a pass over the items, and a
    fresh full-size array), and the group sizes come from the lengths.
    """
    m = scores.size
    if m == 0:
        return [ClusterHistograms.empty() for _ in range(n_groups)]
    grp = np.asarray(request_group, dtype=np.int64)
    size = np.asarray(lengths, dtype=np.int64)
    group_sizes = np.bincount(grp, weights=size, minlength=n_groups).astype(np.int64) if n_groups > 1 else np.array([m])
    folded = group_sizes > max_bins  # these groups' states fold their buckets (see FOLDED_CLUSTERS)
    bucket = np.asarray(request_bucket).astype(np.uint32)
    if folded.all():
        bucket &= np.uint32(FOLDED_CLUSTERS - 1)
    elif folded.any():
        bucket = np.where(folded[grp], bucket & np.uint32(FOLDED_CLUSTERS - 1), bucket)
    code = score_label_codes(scores, relevant) if coded is None else coded
    high = bucket << np.uint32(_BUCKET_SHIFT)
    if n_groups > 1:
        keys = np.repeat((grp.astype(np.uint64) << np.uint64(32)) | high.astype(np.uint64), size)
        keys |= code
        keys.sort()
    else:  # the key fits 32 bits: a sort of half the width
        code32 = np.repeat(high, size)
        code32 |= code
        code32.sort()
        keys = code32.astype(np.uint64)
    return _bins_of_sorted(keys, n_groups, folded, max_bins)


def _bins_of_sorted(
    keys: npt.NDArray[np.uint64], n_groups: int, folded: npt.NDArray[np.bool_], max_bins: int
) -> list[ClusterHistograms]:
    """The states of every group from the sorted item keys (see :func:`cluster_histograms_by_group`)."""
    m = keys.size
    group_edges = np.searchsorted(keys, np.arange(n_groups + 1, dtype=np.uint64) << np.uint64(32))
    group_edges[-1] = m
    sizes = np.diff(group_edges)
    big = np.flatnonzero(sizes > max_bins)
    if big.size < n_groups:  # distinct (bucket, code) bins of the groups within the bound
        cell = keys >> np.uint64(1)  # (group, bucket, code) of each item
        new = np.empty(m, dtype=bool)
        new[0] = True
        np.not_equal(cell[1:], cell[:-1], out=new[1:])
        if big.size:
            new &= np.repeat(sizes <= max_bins, sizes)
        starts = np.flatnonzero(new)
    else:
        starts = np.empty(0, dtype=np.int64)
    if big.size:
        runs = _equal_count_runs(keys, group_edges, big, max_bins)  # ascending already
        starts = np.sort(np.concatenate([starts, runs])) if starts.size else runs
    count = np.diff(starts, append=m)
    ends = np.append(starts[1:], m) - 1
    pos = _ones_per_run(keys, starts, ends)
    last = keys[ends] >> np.uint64(1)
    bin_edges = np.searchsorted(starts, group_edges)
    bin_bucket = ((last >> np.uint64(_CODE_BITS)) & np.uint64(N_CLUSTERS - 1)).astype(np.int64)
    values = _code_scores((last & np.uint64((1 << _CODE_BITS) - 1)).astype(np.uint32))
    neg = (count - pos).astype(np.int64)
    return [
        ClusterHistograms(
            bin_bucket[a:b], values[a:b], pos[a:b], neg[a:b], FOLDED_CLUSTERS if folded[g] else N_CLUSTERS
        )
        if b > a else ClusterHistograms.empty()
        for g, (a, b) in enumerate(zip(bin_edges[:-1], bin_edges[1:], strict=True))
    ]


def _ones_per_run(keys: npt.NDArray[np.uint64], starts: IntArray, ends: IntArray) -> IntArray:
    """Keys with the lowest bit set in each run ``keys[starts[r] : ends[r] + 1]`` (contiguous runs, ascending).

    A ``uint32`` running count of the label bits (read as bytes) and differences at the run ends: about
    twice as fast as a ``reduceat`` of ``keys & 1``, and no full-size ``uint64`` temporary. The
    differences are taken in ``uint32`` arithmetic, exact modulo 2**32 (a run never holds that many items).
    """
    if np.little_endian:  # the label bit sits in each key's first byte
        label = keys.view(np.uint8)[:: keys.itemsize] & np.uint8(1)
    else:
        label = (keys & np.uint64(1)).astype(np.uint8)
    running = np.cumsum(label, dtype=np.uint32)
    at_end = running[ends]
    per_run = at_end.copy()
    per_run[1:] -= at_end[:-1]
    if starts.size and starts[0] > 0:
        per_run[0] -= running[starts[0] - 1]
    return per_run.astype(np.int64)


def _equal_count_runs(
    keys: npt.NDArray[np.uint64], group_edges: IntArray, big: IntArray, max_bins: int
) -> IntArray:
    """Starts of equal-count runs in the groups ``big`` (sorted ``keys``), never across buckets: about
    ``max_bins`` runs per group of ``m_g / max_bins`` items each. A tie may span two runs; both keep the
    same code. Vectorised over the groups and buckets (one search per (group, bucket))."""
    firsts = (big.astype(np.uint64)[:, None] << np.uint64(32)) | (
        np.arange(N_CLUSTERS, dtype=np.uint64)[None, :] << np.uint64(_BUCKET_SHIFT)
    )
    edges = np.searchsorted(keys, firsts.ravel()).reshape(big.size, N_CLUSTERS)
    ends = np.concatenate([edges[:, 1:], group_edges[big + 1][:, None]], axis=1)
    sizes = (ends - edges).ravel()
    m = np.repeat(group_edges[big + 1] - group_edges[big], N_CLUSTERS)
    runs = np.where(sizes > 0, np.maximum(1, (sizes * max_bins) // m), 0)
    cell_of_run = np.repeat(np.arange(sizes.size), runs)
    j = np.arange(runs.sum()) - np.repeat(np.cumsum(runs) - runs, runs)
    return (edges.ravel()[cell_of_run] + (j * sizes[cell_of_run]) // runs[cell_of_run]).astype(np.int64)
