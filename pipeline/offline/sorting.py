"""Rank order of an evaluation set's rows: every request's items by position, or by score descending.

Split from :mod:`pipeline.offline.baseline` (which re-exports :func:`rank_order`): the ordering is the one part of
a baseline computed per row before any per-slice work, and :mod:`pipeline.offline.partial` and
:mod:`pipeline.experiments.data` use it too. Rank order within a request (SPEC section 2): by ``position`` when the
column exists, otherwise by ``score`` descending with ties kept in input order.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.metrics.kernel import offsets_from_lengths
from rankwatch.pipeline.offline.grouping import order_by_request

__all__ = ["rank_order"]

IntArray = npt.NDArray[np.int64]


def rank_order(
    request_codes: IntArray,
    *,
    position: IntArray | None = None,
    scores: npt.NDArray[np.float64] | None = None,
    lengths: IntArray | None = None,
) -> IntArray:
    """Permutation of the rows that groups them by request, each request in rank order.

    ``request_codes`` numbers the requests ``0..n-1``. Rank order is ``position`` ascending when given,
    otherwise ``scores`` descending with ties in input order. ``lengths``: ``np.bincount(request_codes)``
    when the caller has it (a pass over the rows fewer).

    Notes
    -----
    By score, the lists are laid out as rows of a 2-D array (padded with ``-inf`` when their lengths
    differ, as long as the padding at most doubles the size) and each row is sorted with a stable
    ``argsort``: short sorts that stay in cache. Otherwise the scores are replaced by their dense rank and
    one stable integer sort of ``(request, rank)`` does it.
    """
    codes = np.asarray(request_codes, dtype=np.int64)
    if position is not None:
        return order_by_request(codes, np.asarray(position, dtype=np.int64))
    if scores is None:
        raise ValueError("rank_order needs positions or scores")
    sc = np.asarray(scores, dtype=np.float64)
    if sc.size == 0:
        return np.empty(0, dtype=np.int64)
    lengths = np.bincount(codes) if lengths is None else np.asarray(lengths, dtype=np.int64)
    n, width = lengths.size, int(lengths.max())
    if n * width > 2 * sc.size + 1024:
        return order_by_request(codes, _descending_dense_rank(sc))
    grouped = bool(np.all(codes[1:] >= codes[:-1]))
    uniform = bool(np.all(lengths == width))
    row_start = (np.arange(n, dtype=np.int64) * width)[:, None]
    if grouped and uniform:  # the common case: top-k lists, one after the other
        return _row_order(sc.reshape(n, width)).ravel()
    by_request = np.arange(sc.size, dtype=np.int64) if grouped else np.argsort(codes, kind="stable")
    if uniform:
        slot = np.arange(sc.size, dtype=np.int64)  # item i of list j sits at j * width + i
    else:
        starts = offsets_from_lengths(lengths)[:-1]
        sorted_codes = codes[by_request]
        slot = sorted_codes * width + (np.arange(sc.size, dtype=np.int64) - starts[sorted_codes])
    grid = np.full(n * width, np.inf)  # negated scores: padding sorts last
    grid[slot] = -sc[by_request]
    cell = (np.argsort(grid.reshape(n, width), axis=1, kind="stable") + row_start).ravel()
    row_of_cell = np.full(n * width, -1, dtype=np.int64)
    row_of_cell[slot] = by_request
    picked = row_of_cell[cell]
    return picked[picked >= 0]


def _row_order(grid: npt.NDArray[np.float64]) -> IntArray:
    """``np.argsort(-grid, axis=1, kind="stable")`` plus each row's offset ``row * width``, from a value
    sort of packed ``uint64`` keys.

    Each key is the score's order-reversing ``uint64`` image with its column index in the low bits, so
    one row-wise value sort (several times faster than a stable argsort) gives the order, equal scores
    by column. Rows where two distinct scores agree above those low bits are redone with the argsort.
    Works in place on one array (fresh large arrays cost page faults).
    """
    n, width = grid.shape
    bits = max((width - 1).bit_length(), 1)
    row_start = (np.arange(n, dtype=np.int64) * width)[:, None]
    if bits > 16 or not bool(np.all(np.isfinite(grid))):
        return np.argsort(-grid, axis=1, kind="stable") + row_start
    low = np.uint64((1 << bits) - 1)
    keys = _descending_image(grid)
    keys &= ~low
    keys |= np.arange(width, dtype=np.uint64)
    keys.sort(axis=1)
    if _neighbours_close(keys.ravel(), low):  # equal scores are fine (ties by column); rows with distinct ones are redone
        shared = np.bitwise_xor(keys[:, 1:], keys[:, :-1]) <= low
        rows = np.flatnonzero(shared.any(axis=1))
        cols = (keys[rows] & low).view(np.int64)
        exact = np.take_along_axis(_descending_image(grid[rows]), cols, axis=1)
        redo = rows[np.any(shared[rows] & (exact[:, 1:] != exact[:, :-1]), axis=1)]
        if redo.size:
            keys[redo] = np.argsort(-grid[redo], axis=1, kind="stable").view(np.uint64)
    keys &= low
    order = keys.view(np.int64)
    order += row_start
    return order


def _descending_image(grid: npt.NDArray[np.float64]) -> npt.NDArray[np.uint64]:
    """``uint64`` images of finite scores, lower for a higher score (-0.0 and 0.0 alike)."""
    image = (grid + 0.0).view(np.uint64)  # + 0.0 copies and turns -0.0 into 0.0
    flip = image.view(np.int64) >> np.int64(63)
    np.invert(flip, out=flip)
    fl = flip.view(np.uint64)
    fl &= np.uint64(0x7FFF_FFFF_FFFF_FFFF)  # positives: all bits but the sign; negatives: none
    image ^= fl
    return image


def _neighbours_close(flat: npt.NDArray[np.uint64], low: np.uint64) -> bool:
    """Whether two neighbours of ``flat`` agree above the bits ``low`` (in cache-sized blocks)."""
    step = 1 << 16
    buf = np.empty(min(step, max(flat.size - 1, 0)), dtype=np.uint64)
    for a in range(0, flat.size - 1, step):
        b = min(a + step, flat.size - 1)
        x = buf[: b - a]
        np.bitwise_xor(flat[a + 1 : b + 1], flat[a:b], out=x)
        if x.min() <= low:
            return True
    return False


def _descending_dense_rank(scores: npt.NDArray[np.float64]) -> IntArray:
    """0 for the highest distinct score, 1 for the next, ... (equal scores share a rank)."""
    ordered = np.sort(scores)  # a value sort: much faster than an argsort or np.unique (hashing)
    uniq = ordered[np.append(True, ordered[1:] != ordered[:-1])]
    return (uniq.size - 1 - np.searchsorted(uniq, scores)).astype(np.int64)
