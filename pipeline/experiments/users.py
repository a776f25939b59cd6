"""Online experiments whose unit is the user: per-user sums in the partition pair's state.

:class:`UserUnitAccumulator` folds finalized requests (the processor's kernel batches) into, per (arm,
slice) cell, the request-level counts and metric sums (for the minimum-sample gates) and, per user of the
cell and per metric, ``Y_u`` (the sum of the user's per-request values) and ``N_u`` (their count). The
delta method needs the squares of whole users' sums, which do not add up request by request, so the users
are kept until the experiment ends: :meth:`UserUnitAccumulator.data` gives the
:class:`pipeline.experiments.data.ExperimentData` that :func:`pipeline.experiments.report.experiment_report` reads (the
numbers ``rankwatch ab --unit user`` computes from rows), and :meth:`UserUnitAccumulator.sums` the additive
sums ``n, sum Y_u, sum N_u, sum Y_u^2, sum N_u^2, sum Y_u N_u`` the exporter sends to Prometheus.

Why at finalization and not from published windows (as the request unit): windows hold no per-user
values. A request counts once it is finalized, which is once and for all (the state is checkpointed
with the pair); requests count from their own time ``>= start`` (the request unit counts whole windows
from the first window starting at or after it).

Bounded: the first ``spec.max_users`` users (64-bit keys of ``user_id``; a request without one is its own
user) are kept one by one; later users share ``spec.user_buckets`` buckets (key modulo the bucket count),
unions of whole users, so the variance stays valid (coarser clusters). Online ``users_folded`` counts the
*requests* of such users: telling a folded user seen before from a new one would need the state the cap
avoids. Memory: about ``16 * metrics + 120`` bytes per (user, cell) in use, so with ten metrics and a user
in three cells, about 1 KB per user (docs/experiments.md).

Exact over a fleet when each user's events reach one partition pair (producers key both topics by
``user_id``); otherwise a user's parts count as separate units (docs/experiments.md, "Online").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rankwatch.pipeline.experiments.data import ArmCell, ExperimentData, UnitSums
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.metrics.aggregates import MetricSum, RankingAggregate
from rankwatch.pipeline.metrics.kernel import PerRequestMetrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.metrics.uncertainty import shifted_moments
from rankwatch.pipeline.slicing import SliceKey, SliceSpec

__all__ = ["UnitCellSums", "UserUnitAccumulator", "UserUnitSums"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# (arm, slice) -> (requests, users, {metric: (n, sum_y, sum_n, sum_yy, sum_nn, sum_yn)})
UnitCellSums = dict[tuple[str, SliceKey], tuple[int, int, dict[str, tuple[int, float, float, float, float, float]]]]


class _UserCell:
    """One (arm, slice): request-level sums and, per user row, ``Y_u`` and ``N_u`` of every metric."""

    __slots__ = ("agg", "rows", "y", "n")

    def __init__(self, options: MetricOptions, n_metrics: int) -> None:
        self.agg = RankingAggregate(options)
        self.rows: dict[int, int] = {}  # user code -> row
        self.y = np.zeros((0, n_metrics))
        self.n = np.zeros((0, n_metrics))

    def add(self, codes: IntArray, y: FloatArray, n: FloatArray) -> None:
        """Add per-user sums (``codes`` distinct) to the users' rows, making rows for new users."""
        rows = self.rows
        idx = np.empty(codes.size, dtype=np.int64)
        for i, code in enumerate(codes.tolist()):
            row = rows.get(code)
            if row is None:
                row = rows[code] = len(rows)
            idx[i] = row
        used = len(rows)
        if used > self.y.shape[0]:
            size = max(used, 2 * self.y.shape[0], 16)
            for name in ("y", "n"):
                grown = np.zeros((size, self.y.shape[1]))
                grown[: getattr(self, name).shape[0]] = getattr(self, name)
                setattr(self, name, grown)
        np.add.at(self.y, idx, y)
        np.add.at(self.n, idx, n)

    def unit_sums(self, names: list[str]) -> dict[str, UnitSums]:
        used = len(self.rows)
        y, n = self.y[:used], self.n[:used]
        present = (n > 0).sum(axis=0)
        sy, sn = y.sum(axis=0), n.sum(axis=0)
        syy, snn, syn = (y * y).sum(axis=0), (n * n).sum(axis=0), (y * n).sum(axis=0)
        return {m: UnitSums(int(present[i]), float(sy[i]), float(sn[i]), float(syy[i]), float(snn[i]), float(syn[i]))
                for i, m in enumerate(names)}  # fmt: skip


class UserUnitAccumulator:
    """Per-(arm, slice) request sums and per-user sums of a ``unit = "user"`` experiment (module docstring)."""

    def __init__(self, spec: ExperimentSpec, options: MetricOptions, *, slice_by: tuple[str, ...]) -> None:
        if spec.unit != "user":
            raise ValueError("UserUnitAccumulator is for unit = 'user' experiments")
        self.spec, self.options = spec, options
        self.slice_spec = SliceSpec(by=tuple(b for b in slice_by if b != spec.label))
        self.metric_names = list(options.rank_metric_names)
        self.cells: dict[tuple[str, SliceKey], _UserCell] = {}
        self.codes: dict[int, int] = {}  # user key -> code (first max_users users)
        self.user_arms: dict[int, int] = {}  # user code -> bit mask of the arms it was seen in
        self.other_arm_requests = 0
        self.before_start_requests = 0
        self.users_folded = 0  # requests of users past max_users (module docstring)
        self._start_ms = None if spec.start is None else int(spec.start.timestamp() * 1000)
        self._combo_cells: dict[tuple[tuple[str, str], ...], tuple[int, SliceKey]] = {}

    # -- folding ---------------------------------------------------------------------------------------
    def add(self, metrics: PerRequestMetrics, combo: IntArray, combo_keys: Sequence[SliceKey], users: IntArray,
            ts_ms: IntArray) -> None:  # fmt: skip
        """Fold one batch of finalized requests: request ``j`` has the full slice key (with the arm label)
        ``combo_keys[combo[j]]``, the user key ``users[j]`` and the time ``ts_ms[j]``."""
        n = metrics.n_requests
        if n == 0:
            return
        # Arm and slice (without the arm label) once per distinct combo, not once per request.
        combos, inverse = np.unique(np.asarray(combo, dtype=np.int64), return_inverse=True)
        cells = [self._cell_of(combo_keys[c]) for c in combos.tolist()]
        rest_keys = list(dict.fromkeys(r for _a, r in cells))
        rest_index = {r: i for i, r in enumerate(rest_keys)}
        inverse = inverse.reshape(-1)
        arm = np.array([a for a, _r in cells], dtype=np.int64)[inverse]
        rest = np.array([rest_index[r] for _a, r in cells], dtype=np.int64)[inverse]
        in_arms = arm >= 0
        early = np.zeros(n, dtype=bool) if self._start_ms is None else ts_ms < self._start_ms
        self.other_arm_requests += int(np.count_nonzero(~in_arms))
        self.before_start_requests += int(np.count_nonzero(in_arms & early))
        keep = in_arms & ~early
        if not keep.any():
            return
        codes = self._codes(np.asarray(users, dtype=np.int64)[keep])
        k_arm, k_rest = arm[keep], rest[keep]
        for pair in np.unique(codes * len(self.spec.arms) + k_arm).tolist():  # once per (user, arm)
            c, a = divmod(pair, len(self.spec.arms))
            self.user_arms[c] = self.user_arms.get(c, 0) | (1 << a)
        # Per-request values and counts under the no-relevant policy (as pipeline.experiments.data).
        has_rel = metrics.n_relevant[keep] > 0
        zero = self.options.no_relevant == "zero"
        defined = np.ones(has_rel.size, dtype=bool) if zero else has_rel
        y = np.stack([np.where(defined, np.nan_to_num(metrics.values[m][keep]), 0.0) for m in self.metric_names], axis=1)
        cnt = np.repeat(defined.astype(np.float64)[:, None], len(self.metric_names), axis=1)
        n_rest = len(rest_keys)
        kept = _select(metrics, keep)
        for with_slice in (True, False):
            if with_slice and not self.slice_spec.by:
                continue
            cell_id = k_arm * (n_rest + 1) + (k_rest if with_slice else n_rest)
            self._fold(kept, cell_id, (n_rest + 1) * len(self.spec.arms), rest_keys, n_rest, codes, y, cnt)

    def _fold(self, kept: PerRequestMetrics, cell_id: IntArray, n_cells: int, rest_keys: list[SliceKey], n_rest: int,
              codes: IntArray, y: FloatArray, cnt: FloatArray) -> None:  # fmt: skip
        aggs = self._request_sums(kept, cell_id, n_cells)
        key = cell_id * (1 << 32) + codes
        uniq, inverse = np.unique(key, return_inverse=True)
        inverse = inverse.reshape(-1)
        ys = np.stack([np.bincount(inverse, weights=y[:, i], minlength=uniq.size) for i in range(y.shape[1])], axis=1)
        ns = np.stack([np.bincount(inverse, weights=cnt[:, i], minlength=uniq.size) for i in range(y.shape[1])], axis=1)
        ucell, ucode = uniq >> 32, uniq & 0xFFFFFFFF
        for c in np.unique(ucell).tolist():
            a, s = divmod(c, n_rest + 1)
            target = (self.spec.arms[a], () if s == n_rest else rest_keys[s])
            cell = self.cells.get(target)
            if cell is None:
                cell = self.cells[target] = _UserCell(self.options, len(self.metric_names))
            sel = ucell == c
            cell.add(ucode[sel], ys[sel], ns[sel])
            _merge_sums(cell.agg, aggs[c])

    def _request_sums(self, kept: PerRequestMetrics, cell_id: IntArray, n_cells: int) -> list[RankingAggregate]:
        """Request counts and metric sums per cell, as :func:`pipeline.metrics.aggregates.aggregate_groups` makes
        them (no AUC, position or GAUC state online: those need the items)."""
        has_rel = kept.n_relevant > 0
        requests = np.bincount(cell_id, minlength=n_cells)
        with_rel = np.bincount(cell_id[has_rel], minlength=n_cells)
        items = np.bincount(cell_id, weights=kept.lengths, minlength=n_cells)
        out = []
        for c in range(n_cells):
            agg = RankingAggregate(self.options)
            agg.requests, agg.requests_with_relevant, agg.items = int(requests[c]), int(with_rel[c]), int(items[c])
            out.append(agg)
        for name, vals in kept.values.items():
            if self.options.no_relevant == "zero":
                v, g = np.where(has_rel, vals, 0.0), cell_id
            else:
                v, g = vals[has_rel], cell_id[has_rel]
            count, total, m2 = shifted_moments(v, g, n_cells)
            total_sq = np.bincount(g, weights=v * v, minlength=n_cells)
            for c in range(n_cells):
                out[c].sums[name] = MetricSum(int(count[c]), float(total[c]), float(total_sq[c]), float(m2[c]))
        return out

    def _cell_of(self, key: SliceKey) -> tuple[int, SliceKey]:
        got = self._combo_cells.get(key)
        if got is None:
            labels = dict(key)
            value = labels.get(self.spec.label)
            arm = self.spec.arms.index(value) if value in self.spec.arms else -1
            rest: SliceKey = tuple((lbl, labels[lbl]) for lbl in self.slice_spec.by if lbl in labels)
            got = self._combo_cells[key] = (arm, rest)
        return got

    def _codes(self, keys: IntArray) -> IntArray:
        """Dense codes of user keys: the first ``max_users`` one by one, later ones hashed into buckets."""
        uniq, inverse = np.unique(keys, return_inverse=True)
        out = np.empty(uniq.size, dtype=np.int64)
        cap, buckets = self.spec.max_users, self.spec.user_buckets
        folded = np.zeros(uniq.size, dtype=bool)
        for i, k in enumerate(uniq.tolist()):
            code = self.codes.get(k)
            if code is None:
                if len(self.codes) < cap:
                    code = self.codes[k] = len(self.codes)
                else:
                    code, folded[i] = cap + k % buckets, True
            out[i] = code
        self.users_folded += int(np.count_nonzero(folded[inverse]))
        return out[inverse.reshape(-1)]

    # -- reading ---------------------------------------------------------------------------------------
    def data(self) -> ExperimentData:
        """The experiment's cells and counts, for :func:`pipeline.experiments.report.experiment_report`."""
        cells: dict[tuple[str, SliceKey], ArmCell] = {}
        for key, cell in self.cells.items():
            cells[key] = ArmCell(_copy_sums(cell.agg), units=cell.unit_sums(self.metric_names), users=len(cell.rows))
        for a in self.spec.arms:
            cells.setdefault((a, ()), ArmCell(RankingAggregate(self.options)))
        return ExperimentData(
            spec=self.spec, options=self.options, slice_spec=self.slice_spec, cells=cells,
            requests={a: cells[(a, ())].aggregate.requests for a in self.spec.arms},
            users=self._users_per_arm(), other_arm_requests=self.other_arm_requests,
            before_start_requests=self.before_start_requests, users_folded=self.users_folded,
            crossover_users=sum(1 for m in self.user_arms.values() if m & (m - 1)),
        )  # fmt: skip

    def _users_per_arm(self) -> dict[str, int]:
        masks = np.fromiter(self.user_arms.values(), dtype=np.int64, count=len(self.user_arms))
        return {a: int(np.count_nonzero(masks & (1 << i))) for i, a in enumerate(self.spec.arms)}

    def sums(self) -> UserUnitSums:
        """A small, immutable copy of the additive sums (for the exporter, taken on the consuming thread)."""
        cells: UnitCellSums = {}
        for key, cell in self.cells.items():
            units = cell.unit_sums(self.metric_names)
            cells[key] = (cell.agg.requests, len(cell.rows),
                          {m: (u.n, u.sum_y, u.sum_n, u.sum_yy, u.sum_nn, u.sum_yn) for m, u in units.items()})
        return UserUnitSums(self.spec, cells, self._users_per_arm())

    # -- state -----------------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """msgpack-able state (for checkpoints): users as little-endian arrays, not one object each."""
        cells = []
        for (arm, key), cell in self.cells.items():
            used = len(cell.rows)
            cells.append([arm, [list(p) for p in key], cell.agg.to_state(),
                          np.fromiter(cell.rows, dtype="<i8", count=used).tobytes(),
                          np.ascontiguousarray(cell.y[:used], dtype="<f8").tobytes(),
                          np.ascontiguousarray(cell.n[:used], dtype="<f8").tobytes()])
        return {
            "unit": "user", "spec": self.spec.to_dict(), "cells": cells,
            "codes": [np.fromiter(self.codes, dtype="<i8", count=len(self.codes)).tobytes(),
                      np.fromiter(self.codes.values(), dtype="<i8", count=len(self.codes)).tobytes()],
            "arms": [np.fromiter(self.user_arms, dtype="<i8", count=len(self.user_arms)).tobytes(),
                     np.fromiter(self.user_arms.values(), dtype="<i8", count=len(self.user_arms)).tobytes()],
            "counts": [self.other_arm_requests, self.before_start_requests, self.users_folded],
        }  # fmt: skip

    def restore(self, state: dict[str, Any]) -> None:
        """Load :meth:`to_state`'s output (a state of a differently defined experiment is refused)."""
        if state.get("spec") != self.spec.to_dict():
            raise ValueError(f"experiment {self.spec.name!r} was redefined; its state cannot be restored")
        m = len(self.metric_names)
        self.cells = {}
        for arm, key, agg, codes, y, n in state["cells"]:
            cell = _UserCell(self.options, m)
            cell.agg = RankingAggregate.from_state(agg, self.options)
            cell.rows = {int(c): i for i, c in enumerate(np.frombuffer(codes, dtype="<i8").tolist())}
            cell.y = np.frombuffer(y, dtype="<f8").reshape(-1, m).copy()
            cell.n = np.frombuffer(n, dtype="<f8").reshape(-1, m).copy()
            self.cells[(arm, tuple((lbl, val) for lbl, val in key))] = cell
        keys, codes = (np.frombuffer(b, dtype="<i8").tolist() for b in state["codes"])
        self.codes = dict(zip(keys, codes, strict=True))
        keys, masks = (np.frombuffer(b, dtype="<i8").tolist() for b in state["arms"])
        self.user_arms = dict(zip(keys, masks, strict=True))
        self.other_arm_requests, self.before_start_requests, self.users_folded = (int(x) for x in state["counts"])


@dataclass(frozen=True)
class UserUnitSums:
    """Additive sums of one user-unit experiment (see :meth:`UserUnitAccumulator.sums`); add up over pairs."""

    spec: ExperimentSpec
    cells: UnitCellSums
    users: dict[str, int]  # distinct users per arm (for the sample-ratio test)

    @staticmethod
    def total(parts: list[UserUnitSums]) -> tuple[UnitCellSums, dict[str, int]]:
        """Cell-wise sums over parts (partition pairs), and the users per arm."""
        out: dict[tuple[str, SliceKey], list[Any]] = {}
        users: dict[str, int] = {}
        for part in parts:
            for arm, k in part.users.items():
                users[arm] = users.get(arm, 0) + k
            for key, (requests, n_users, metrics) in part.cells.items():
                slot = out.setdefault(key, [0, 0, {}])
                slot[0] += requests
                slot[1] += n_users
                for name, sums in metrics.items():
                    prev = slot[2].get(name, (0, 0.0, 0.0, 0.0, 0.0, 0.0))
                    slot[2][name] = tuple(a + b for a, b in zip(prev, sums, strict=True))
        return {key: (int(v[0]), int(v[1]), dict(v[2])) for key, v in out.items()}, users


def _select(metrics: PerRequestMetrics, keep: npt.NDArray[np.bool_]) -> PerRequestMetrics:
    return PerRequestMetrics({m: v[keep] for m, v in metrics.values.items()}, metrics.n_relevant[keep],
                             metrics.lengths[keep])  # fmt: skip


def _merge_sums(target: RankingAggregate, part: RankingAggregate) -> None:
    target.requests += part.requests
    target.requests_with_relevant += part.requests_with_relevant
    target.items += part.items
    for name, s in part.sums.items():
        target.sums[name].merge(s)


def _copy_sums(agg: RankingAggregate) -> RankingAggregate:
    out = RankingAggregate(agg.options)
    _merge_sums(out, agg)
    return out
