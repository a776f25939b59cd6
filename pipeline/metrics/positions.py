r"""Click-through by position and the positive rate, as integer counts that merge exactly.

For a slice and the 1-based rank ``r <= K``:

.. math::

    CTR_r = \frac{\#\{\text{shown items at rank } r \text{ with } rel > 0\}}{\#\{\text{shown items at rank } r\}},
    \qquad positive\ rate = \frac{\#\{\text{items with } rel > 0\}}{\#\{\text{items}\}}

A rank is the place in the list's rank order (served position online, ``position`` or score offline).
A change of UI or position bias moves the curve's shape; a model regression moves the relevant items
down the ranks. Counts are kept, not rates, so windows, partitions and slices add up exactly.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def position_counts(
    labels: npt.NDArray[np.float64],
    offsets: IntArray,
    request_group: IntArray,
    n_groups: int,
    ranks: int,
) -> tuple[IntArray, IntArray, IntArray]:
    """``(shown, positive, positives)`` per group: shown and positive items at ranks 1..``ranks``
    (arrays of shape ``(n_groups, ranks)``) and all positive items of the group (shape ``(n_groups,)``).

    Only the relevant items are located (``searchsorted`` of their flat index in ``offsets``); the shown
    counts come from the list lengths alone (a list of length ``L`` shows ranks ``1..L``).
    """
    lengths = np.diff(offsets)
    # shown[g, r] = lists of group g longer than r: count lists by min(length, ranks), then a reverse cumsum.
    capped = np.minimum(lengths, ranks)
    by_length = np.bincount(request_group * (ranks + 1) + capped, minlength=n_groups * (ranks + 1))
    by_length = by_length.reshape(n_groups, ranks + 1)
    shown = np.cumsum(by_length[:, ::-1], axis=1)[:, ::-1][:, 1:].astype(np.int64)
    hits = np.flatnonzero(labels > 0)
    width = int(lengths[0]) if lengths.size else 0
    if width and hits.size and int(lengths.min()) == int(lengths.max()):
        hit_request, rank0 = np.divmod(hits, width)  # lists of one length (top-k): no search needed
    else:
        hit_request = np.searchsorted(offsets, hits, side="right") - 1
        rank0 = hits - offsets[hit_request]
    hit_group = request_group[hit_request]
    positives = np.bincount(hit_group, minlength=n_groups).astype(np.int64)
    top = rank0 < ranks
    positive = np.bincount(hit_group[top] * ranks + rank0[top], minlength=n_groups * ranks)
    return shown, positive.reshape(n_groups, ranks).astype(np.int64), positives


def rates(positive: IntArray, shown: IntArray) -> list[float | None]:
    """``positive / shown`` per rank, None where nothing was shown."""
    return [None if s == 0 else p / s for p, s in zip(positive.tolist(), shown.tolist(), strict=True)]
