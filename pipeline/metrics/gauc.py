r"""GAUC: the impression-weighted mean of per-group AUC-ROC (DIN paper), for many groups at once.

.. math::

    GAUC = \frac{\sum_g w_g \, AUC_g}{\sum_g w_g}, \qquad
    AUC_g = \frac{1}{P_g N_g} \sum_{i \in g,\, rel_i > 0} \big(N_g^{<s_i} + \tfrac12 N_g^{=s_i}\big)

over the groups g (users, or requests) whose items hold both classes; ``w_g`` is the group's shown items
(``P_g + N_g``, the default) or its relevant items (``P_g``). One-class groups are left out and counted.
``AUC_g`` is scikit-learn's ``roc_auc_score`` on the group's items (ties count one half).

Speed: no per-group Python loop and no float argsort. Every item becomes one ``uint64`` key,
``group | score prefix | label``, where the score prefix is the top bits of the score's order-preserving
integer image; one value sort of these keys (vectorised, several times faster than an argsort) orders the
items by group, then score, negatives before positives within a tie. Runs of equal ``(group, prefix)``
give the counts, and cumulative sums give every positive's negatives below. The prefix is exact unless
two distinct scores share one; that is checked globally on the sorted distinct scores, and only the
buckets where it happens are recomputed from the true scores (a lexsort of those few items).

Without a :class:`ScoreImage` shared between calls, :func:`group_auc` first sorts the keys alone: only the
``(group, prefix)`` buckets of several items (ties, or distinct scores sharing a prefix) can be miscounted,
pairs being counted within a group only, so when they are few their terms are recounted from the true scores
and the global sort of every score is saved (1.6-1.8x faster on 2 M items of distinct floats, float32 or
4-decimal scores); when many items tie, the image is built as above and the keys already sorted are reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_U64 = np.uint64
_MIN_PREFIX_BITS = 24  # below this many score bits (over ~2^38 groups) use the exact lexsort
_BLOCK = 1 << 16  # items per block of the passes done in cache-sized pieces
# group_auc without a shared image sorts only its keys while at most this share of the items lie in buckets of
# several items (ties, or scores sharing a prefix); beyond it (many ties) the image's way is cheaper.
_ONE_SORT_SUSPECTS = 1 / 16


@dataclass(frozen=True)
class ScoreImage:
    """The per-item part of the sort keys, built once and shared by the GAUC calls on the same items.

    ``low[i] = prefix(score_i) << 1 | rel_i`` where the prefix is the top ``prefix_bits`` bits of the
    score's order-preserving ``uint64`` image, with ``prefix_bits = 63 - bits(max_groups)`` so that a
    group id fits above it. ``affected`` lists the items whose prefix another distinct score shares (their
    order is recomputed exactly), ``has_ties`` says whether two items have the same score.
    """

    scores: FloatArray
    relevant: BoolArray
    prefix_bits: int
    low: npt.NDArray[np.uint64]
    affected: IntArray
    has_ties: bool

    @property
    def max_groups(self) -> int:
        return 1 << (63 - self.prefix_bits)

    @classmethod
    def of(
        cls, scores: npt.ArrayLike, relevant: npt.ArrayLike, max_groups: int, *, distinct: FloatArray | None = None
    ) -> ScoreImage:
        """``distinct``: the sorted distinct values of ``scores`` when the caller has them (the overall AUC
        histogram's scores), which saves a sort."""
        sc = np.ascontiguousarray(scores, dtype=np.float64)
        rel = np.asarray(relevant, dtype=bool)
        if sc.shape != rel.shape or sc.ndim != 1:
            raise ValueError("scores and relevant must be 1-D arrays of one length")
        prefix_bits = _prefix_bits(max_groups)
        empty_ids = np.empty(0, dtype=np.int64)
        if prefix_bits < _MIN_PREFIX_BITS:  # the exact lexsort path needs no image
            return cls(sc, rel, prefix_bits, np.empty(0, dtype=_U64), empty_ids, True)
        image = _orderable(sc)
        drop = _U64(64 - prefix_bits)
        if distinct is None:
            ordered = np.sort(image)
            keep = np.empty(ordered.size, dtype=bool)  # make the sorted images distinct
            keep[:1] = True
            np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
            has_ties = not bool(keep.all())
            shared = _shared_prefixes(ordered[keep] if has_ties else ordered, drop, floats=False)
        else:
            has_ties = distinct.size < sc.size
            shared = _shared_prefixes(np.ascontiguousarray(distinct, dtype=np.float64), drop, floats=True)
        # ``image`` becomes the prefixes, then the low key bits, in place (a fresh 4 M-item array costs
        # page faults).
        prefix = image
        prefix >>= drop
        affected = empty_ids
        if shared.size:
            # Membership of a few prefixes: a bit table on their low 20 bits first (read in blocks), then an
            # exact search.
            table = np.zeros(1 << 20, dtype=bool)
            table[(shared & _U64(0xFFFFF)).view(np.int64)] = True
            in_table = np.empty(prefix.size, dtype=bool)
            for a in range(0, prefix.size, _BLOCK):
                block = prefix[a : a + _BLOCK] & _U64(0xFFFFF)
                np.take(table, block.view(np.int64), out=in_table[a : a + _BLOCK])
            candidates = np.flatnonzero(in_table)
            at = np.minimum(np.searchsorted(shared, prefix[candidates]), shared.size - 1)
            affected = candidates[shared[at] == prefix[candidates]]
        low = prefix
        low <<= _U64(1)
        low |= rel  # the label in the lowest bit
        return cls(sc, rel, prefix_bits, low, affected, has_ties)


@dataclass(frozen=True)
class GroupAuc:
    """Per group: positives, negatives and the AUC numerator ``sum_pos (neg below + neg tied / 2)``."""

    pos: IntArray
    neg: IntArray
    numerator: FloatArray

    def auc(self) -> FloatArray:
        """AUC-ROC per group, NaN for one-class groups."""
        pairs = (self.pos * self.neg).astype(np.float64)
        out = np.full(pairs.shape, np.nan)
        np.divide(self.numerator, pairs, out=out, where=pairs > 0)
        return out


def group_auc(
    group: npt.ArrayLike,
    scores: npt.ArrayLike,
    relevant: npt.ArrayLike,
    n_groups: int,
    *,
    image: ScoreImage | None = None,
) -> GroupAuc:
    """AUC counts of every group id in ``range(n_groups)`` (see the module notes for the method).

    ``image`` may pass :meth:`ScoreImage.of` of the same scores and labels to share that work.
    """
    grp = np.asarray(group, dtype=np.int64)
    rel = np.asarray(relevant, dtype=bool)
    if grp.shape != rel.shape or grp.ndim != 1:
        raise ValueError("group, scores and relevant must be 1-D arrays of one length")
    if grp.size and (grp.min() < 0 or grp.max() >= n_groups):
        raise ValueError("group ids must lie in range(n_groups)")
    pos = np.bincount(grp[rel], minlength=n_groups).astype(np.int64)
    size = np.bincount(grp, minlength=n_groups).astype(np.int64)
    if image is None:
        one_sort = _group_auc_one_sort(grp, np.ascontiguousarray(scores, dtype=np.float64), rel, pos, size)
        if isinstance(one_sort, GroupAuc):
            return one_sort
        if one_sort is not None:  # many ties: the image finds which buckets two distinct scores share
            return _group_auc(grp, pos, size, ScoreImage.of(scores, rel, n_groups), sorted_keys=one_sort)
    return _group_auc(grp, pos, size, image or ScoreImage.of(scores, rel, n_groups))


def _group_auc_one_sort(grp: IntArray, sc: FloatArray, rel: BoolArray, pos: IntArray,
                        size: IntArray) -> GroupAuc | tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]] | None:
    """:func:`group_auc` with one sort, when no image is shared: the keys' sort alone, then the exact terms of the
    few ``(group, prefix)`` buckets that hold several items. None (the caller builds the image and the keys) when
    the scores leave too few prefix bits; when those items exceed :data:`_ONE_SORT_SUSPECTS` of all (many ties),
    the sorted keys and the items' buckets in input order, for :func:`_group_auc` with an image.

    Why it is exact: pairs are counted within a group only, and the key sort orders a group's items by score
    prefix, negatives before positives within a prefix. So every pair across two buckets of a group is counted
    as by the scores, and the only miscounted pairs lie inside a bucket of several items (a tie, or two distinct
    scores sharing a prefix). Those buckets' counted terms (``pos * neg``: every negative below every positive)
    are replaced by the exact ones, from the items' true scores (ties one half), as :func:`_group_auc` does for
    its image's affected items. The image's own sort of every score (only to find ties and shared prefixes
    anywhere, across groups too) is what this saves: on typical scores (distinct floats) about 45 % of the call.
    """
    n_groups = int(pos.size)
    prefix_bits = _prefix_bits(n_groups)
    if prefix_bits < _MIN_PREFIX_BITS:
        return None
    numerator = np.zeros(n_groups)
    if sc.size == 0 or not np.any((pos > 0) & (pos < size)):
        return GroupAuc(pos, size - pos, numerator)
    bucket = _orderable(sc)  # in place below: the score prefix, then the group above it
    bucket >>= _U64(64 - prefix_bits)
    bucket |= (grp << prefix_bits).view(_U64)
    keys = bucket << _U64(1)
    keys |= rel
    keys.sort()
    shared = np.flatnonzero((keys[1:] >> _U64(1)) == (keys[:-1] >> _U64(1)))  # item i and i + 1 share a bucket
    if 2 * shared.size > _ONE_SORT_SUSPECTS * keys.size:  # at least shared.size + 1 such items: many ties
        return keys, bucket
    numerator += _numerators_of_sorted(keys, pos, size)
    if shared.size == 0:
        return GroupAuc(pos, size - pos, numerator)
    # The items of those buckets, in input order: each item's bucket looked up among theirs (sorted).
    shared_buckets = keys[shared] >> _U64(1)
    shared_buckets = shared_buckets[run_starts(shared_buckets)]
    at = np.minimum(np.searchsorted(shared_buckets, bucket), shared_buckets.size - 1)
    items = np.flatnonzero(shared_buckets[at] == bucket)
    numerator += _recounted(bucket[items], sc[items], rel[items], 1.0, prefix_bits, n_groups)
    return GroupAuc(pos, size - pos, numerator)


def request_group_auc(
    request_group: IntArray, lengths: IntArray, n_relevant: IntArray, n_groups: int, image: ScoreImage
) -> GroupAuc:
    """:func:`group_auc` with a group id per request (lists flat, in request order): the per-group counts
    come from the per-request lengths and relevant counts, not from passes over the items."""
    pos = np.bincount(request_group, weights=n_relevant, minlength=n_groups).astype(np.int64)
    size = np.bincount(request_group, weights=lengths, minlength=n_groups).astype(np.int64)
    if image.prefix_bits < _MIN_PREFIX_BITS or n_groups > image.max_groups:
        return _group_auc(np.repeat(request_group, lengths), pos, size, image)
    # Shift the group ids per request, then expand: one pass over the items fewer.
    keys = np.repeat((request_group << (image.prefix_bits + 1)).view(_U64), lengths)
    if keys.shape != image.low.shape:
        raise ValueError("the score image was built from other items")
    keys |= image.low
    return _group_auc(None, pos, size, image, keys=keys)


def _group_auc(
    grp: IntArray | None, pos: IntArray, size: IntArray, image: ScoreImage, *, keys: npt.NDArray[np.uint64] | None = None,
    sorted_keys: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]] | None = None,
) -> GroupAuc:
    """The counts from ``image`` (see the module notes). ``sorted_keys``: the keys already sorted, with every
    item's bucket (``key >> 1``) in input order, as :func:`_group_auc_one_sort` leaves them."""
    n_groups = int(pos.size)
    numerator = np.zeros(n_groups)
    n_items = grp.size if grp is not None else (keys.size if keys is not None else 0)
    if n_items != image.scores.size:
        raise ValueError("the score image was built from other items")
    if n_groups > image.max_groups:
        raise ValueError(f"the score image holds at most {image.max_groups} groups")
    if n_items == 0 or not np.any((pos > 0) & (pos < size)):
        return GroupAuc(pos, size - pos, numerator)
    # One-class groups get a zero numerator below; they are sorted along (filtering costs more gathers).
    prefix_bits = image.prefix_bits
    if prefix_bits < _MIN_PREFIX_BITS:
        assert grp is not None
        order = np.lexsort((image.scores, grp))
        ids, num = _sorted_runs(grp[order], image.scores[order], image.relevant[order])
        return GroupAuc(pos, size - pos, numerator + np.bincount(ids, weights=num, minlength=n_groups))
    if sorted_keys is not None:
        ordered, bucket_of = sorted_keys
        affected_bucket = bucket_of[image.affected] if image.affected.size else None
    else:
        if keys is None:
            assert grp is not None
            keys = (grp << (prefix_bits + 1)).view(_U64) | image.low
        # The keys are built for this call: sort them in place (the affected items' buckets are read first).
        affected_bucket = keys[image.affected] >> _U64(1) if image.affected.size else None
        keys.sort()
        ordered = keys
    numerator += _numerators_of_sorted(ordered, pos, size)
    tie_share = 1.0  # what the sort counted for each positive/negative pair inside one bucket
    if image.has_ties:
        bucket = ordered >> _U64(1)
        tied = bucket[1:] == bucket[:-1]
        if tied.any():
            # A positive counted every negative of its tie run as below it; ties count one half.
            in_run = np.zeros(bucket.size, dtype=bool)
            in_run[1:] |= tied
            in_run[:-1] |= tied
            run_bucket, run_pos, run_neg = _runs(bucket[in_run], (ordered[in_run] & _U64(1)).astype(np.int64))
            run_group = (run_bucket >> _U64(prefix_bits)).astype(np.int64)
            numerator -= np.bincount(run_group, weights=0.5 * run_pos * run_neg, minlength=n_groups)
        tie_share = 0.5
    if image.affected.size:
        # Buckets whose prefix two distinct scores share: the sort ranked their pairs as ties. Replace
        # that term with the exact one, from those items' true scores.
        assert affected_bucket is not None
        numerator += _recounted(affected_bucket, image.scores[image.affected], image.relevant[image.affected],
                                tie_share, prefix_bits, n_groups)
    return GroupAuc(pos, size - pos, numerator)


def _recounted(item_bucket: npt.NDArray[Any], scores: FloatArray, rel: BoolArray, counted_share: float,
               prefix_bits: int, n_groups: int) -> FloatArray:
    """Per group: the exact terms of the buckets of these items (all of each bucket's items), less what the key
    sort counted for their pairs (``counted_share`` of ``pos * neg`` a bucket), from the items' true scores."""
    item_bucket = item_bucket.astype(np.int64)
    order = np.lexsort((scores, item_bucket))
    item_bucket, item_sc, item_rel = item_bucket[order], scores[order], rel[order]
    b_ids, b_pos, b_neg = _runs(item_bucket, item_rel.astype(np.int64))
    out = -np.bincount(b_ids >> prefix_bits, weights=counted_share * b_pos * b_neg, minlength=n_groups)
    e_ids, e_num = _sorted_runs(item_bucket, item_sc, item_rel)
    return np.asarray(out + np.bincount(e_ids >> prefix_bits, weights=e_num, minlength=n_groups), dtype=np.float64)


def _numerators_of_sorted(ordered: npt.NDArray[np.uint64], pos: IntArray, size: IntArray) -> FloatArray:
    """Per group: sum over its positives of the negatives sorted before them in the group.

    Items are sorted by group (group ``g`` holds ``size[g]`` items, ``pos[g]`` positive) and the label is
    the key's lowest bit. With ``l_1 < ... < l_P`` the positives' places inside the group, the ``k``-th
    has ``l_k - (k - 1)`` negatives before it: the sum is ``sum_k l_k - P (P - 1) / 2`` (Mann-Whitney).
    ``sum_k l_k`` is one ``reduceat`` over the positives' flat indices minus ``P`` times the group's start.
    """
    if np.little_endian:  # the label bit sits in each key's first byte: read bytes, not whole keys
        label = ordered.view(np.uint8)[::8] & 1
    else:
        label = (ordered & _U64(1)).astype(np.uint8)
    # The positives of group g are the hits cut[g]:cut[g] + pos[g] (groups are contiguous and in order), so
    # summing their places needs only the positives, not a weighted pass over every item.
    hits = np.flatnonzero(label.view(np.bool_))  # 0/1 bytes read as booleans: numpy's fast nonzero path
    starts = np.cumsum(size) - size
    has_pos = pos > 0
    index_sum = np.zeros(size.size, dtype=np.int64)
    if hits.size:
        index_sum[has_pos] = np.add.reduceat(hits, (np.cumsum(pos) - pos)[has_pos])
    return (index_sum - pos * starts - pos * (pos - 1) // 2).astype(np.float64)


def _prefix_bits(max_groups: int) -> int:
    """Score bits left in a 64-bit key beside a group id below ``max_groups`` and the label bit."""
    return 63 - max(int(max_groups - 1).bit_length(), 1)


def run_starts(values: npt.NDArray[Any]) -> IntArray:
    """Where each run of equal consecutive ``values`` starts (empty for no values)."""
    new_run = np.empty(values.size, dtype=bool)
    new_run[:1] = True
    np.not_equal(values[1:], values[:-1], out=new_run[1:])
    return np.flatnonzero(new_run)


def _runs(outer: npt.NDArray[Any], ones: IntArray) -> tuple[npt.NDArray[Any], IntArray, IntArray]:
    """Runs of equal ``outer`` values (sorted): each run's value, its sum of ``ones`` and its other items."""
    starts = run_starts(outer)
    run_pos = np.add.reduceat(ones, starts) if starts.size else np.empty(0, np.int64)
    return outer[starts], run_pos, np.diff(starts, append=outer.size).astype(np.int64) - run_pos


def _shared_prefixes(ordered: npt.NDArray[Any], drop: np.uint64, *, floats: bool) -> npt.NDArray[np.uint64]:
    """Sorted distinct score prefixes (``image >> drop``) that two neighbours of ``ordered`` share.

    ``ordered`` holds sorted distinct scores: their ``uint64`` images, or the float scores themselves when
    ``floats`` (imaged here). Two distinct scores share a prefix iff neighbours in sorted order do. Done
    in cache-sized blocks (overlapping by one item): no full-size image or prefix array.
    """
    found = []
    for a in range(0, max(ordered.size - 1, 0), _BLOCK):
        block = ordered[a : a + _BLOCK + 1]
        pref = _orderable(block) if floats else block >> drop
        if floats:
            pref >>= drop
        same = pref[1:] == pref[:-1]
        if same.any():
            found.append(pref[1:][same])
    return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=_U64)


def _orderable(scores: FloatArray) -> npt.NDArray[np.uint64]:
    """A ``uint64`` image of float64 scores with the same order (IEEE 754 bits: flip all bits of a
    negative number, set the sign bit of a positive one). ``-0.0`` is mapped to ``+0.0`` first."""
    bits = (scores + 0.0).view(_U64)  # a new array: modified in place below
    # The flip mask is built in cache-sized blocks: one small buffer instead of a second full-size array.
    flip = np.empty(min(_BLOCK, bits.size), dtype=np.int64)
    for a in range(0, bits.size, _BLOCK):
        block = bits[a : a + _BLOCK]
        mask = flip[: block.size]
        np.right_shift(block.view(np.int64), 63, out=mask)
        umask = mask.view(_U64)
        umask |= _U64(1 << 63)
        block ^= umask
    return bits


def _sorted_runs(outer: IntArray, scores: FloatArray, rel: BoolArray) -> tuple[IntArray, FloatArray]:
    """Items sorted by ``(outer, score)``: per run of equal ``(outer, score)``, its outer id and numerator."""
    new_run = np.empty(outer.size, dtype=bool)
    if outer.size:
        new_run[0] = True
        np.not_equal(outer[1:], outer[:-1], out=new_run[1:])
        new_run[1:] |= scores[1:] != scores[:-1]
    starts = np.flatnonzero(new_run)
    run_pos = np.add.reduceat(rel.astype(np.int64), starts) if starts.size else np.empty(0, np.int64)
    run_neg = np.diff(starts, append=outer.size).astype(np.int64) - run_pos
    run_outer = outer[starts]
    return run_outer, _numerators(run_outer, run_pos, run_neg)


def _numerators(run_outer: IntArray, run_pos: IntArray, run_neg: IntArray) -> FloatArray:
    """``pos_r * (negatives of earlier runs of the same outer id + neg_r / 2)`` for runs sorted by outer id."""
    neg_before = np.cumsum(run_neg) - run_neg
    first = np.empty(run_outer.size, dtype=bool)
    if run_outer.size:
        first[0] = True
        np.not_equal(run_outer[1:], run_outer[:-1], out=first[1:])
    # Negatives before the outer id's first run, carried forward over its runs.
    base = np.maximum.accumulate(np.where(first, neg_before, 0))
    out = np.asarray(run_pos * ((neg_before - base) + 0.5 * run_neg), dtype=np.float64)
    return out
