"""Cumulative experiment state from published windows (request unit), for the demo and the service.

:class:`ExperimentAccumulator` folds the slices of every published window of one size (the smallest, so
each request is counted once) whose start is at or after the experiment's start into one
:class:`pipeline.metrics.aggregates.RankingAggregate` per (arm, slice), cumulative since the start. The windows must
be sliced by the arm label too (e.g. ``segment, surface, variant``). Its :meth:`data` is the
:class:`pipeline.experiments.data.ExperimentData` that :func:`pipeline.experiments.report.experiment_report` reads, so the
online verdicts are computed exactly as ``rankwatch ab``'s.

Windows carry no users, so this is the request unit; ``unit = "user"`` experiments keep per-user sums
from the finalized requests instead (pipeline/experiments/users.py).
"""

from __future__ import annotations

from typing import Any

from rankwatch.pipeline.experiments.data import ArmCell, ExperimentData
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceKey, SliceSpec

__all__ = ["CellSums", "ExperimentAccumulator", "ExperimentSums"]

# (arm, slice key) -> (requests, {metric: (count, sum, sum of squares)}): what the exporter needs.
CellSums = dict[tuple[str, SliceKey], tuple[int, dict[str, tuple[int, float, float]]]]


class ExperimentAccumulator:
    """Per-(arm, slice) aggregates cumulative since ``spec.start`` (see the module docstring)."""

    def __init__(
        self, spec: ExperimentSpec, options: MetricOptions, *, slice_by: tuple[str, ...], window: str,
        keep_histograms: bool = True,
    ) -> None:
        self.spec, self.options, self.window = spec, options, window
        # Without histograms the state is a few numbers per cell (no AUC comparisons): what checkpoints carry.
        self.keep_histograms = keep_histograms
        self.slice_spec = SliceSpec(by=tuple(b for b in slice_by if b != spec.label))
        self.cells: dict[tuple[str, SliceKey], RankingAggregate] = {}
        self.other_arm_requests = 0
        self.before_start_requests = 0

    def add(self, pw: PublishedWindow) -> None:
        """Fold one published window in (windows of other sizes are ignored)."""
        if pw.window != self.window:
            return
        early = self.spec.start is not None and pw.start < self.spec.start
        for key, agg in sorted(pw.slices.items()):
            labels = dict(key)
            arm = labels.get(self.spec.label)
            if arm not in self.spec.arms:
                self.other_arm_requests += agg.requests
                continue
            if early:
                self.before_start_requests += agg.requests
                continue
            rest: SliceKey = tuple((lbl, labels[lbl]) for lbl in self.slice_spec.by if lbl in labels)
            if not self.keep_histograms:
                agg = _sums_only(agg)
            for target in {(arm, rest), (arm, ())}:
                if target in self.cells:
                    self.cells[target].merge(agg)
                else:
                    self.cells[target] = agg.copy()

    def data(self) -> ExperimentData:
        """The experiment's cells and counts, for :func:`pipeline.experiments.report.experiment_report`."""
        empty = RankingAggregate(self.options)
        cells = {key: ArmCell(agg) for key, agg in self.cells.items()}
        for arm in self.spec.arms:
            cells.setdefault((arm, ()), ArmCell(empty.copy()))
        return ExperimentData(
            spec=self.spec, options=self.options, slice_spec=self.slice_spec, cells=cells,
            requests={arm: cells[(arm, ())].aggregate.requests for arm in self.spec.arms},
            users=dict.fromkeys(self.spec.arms, 0),
            other_arm_requests=self.other_arm_requests, before_start_requests=self.before_start_requests,
        )  # fmt: skip

    def sums(self) -> ExperimentSums:
        """A small, immutable copy of the cumulative sums (for the exporter, taken on the consuming thread)."""
        cells: CellSums = {key: (agg.requests, {m: (x.count, x.total, x.total_sq) for m, x in agg.sums.items()})
                           for key, agg in self.cells.items()}  # fmt: skip
        return ExperimentSums(self.spec, cells)

    def to_state(self) -> dict[str, Any]:
        """msgpack-able state (for checkpoints)."""
        return {"cells": [[arm, [list(p) for p in key], agg.to_state()] for (arm, key), agg in self.cells.items()],
                "other": self.other_arm_requests, "before": self.before_start_requests,
                "spec": self.spec.to_dict()}  # fmt: skip

    def restore(self, state: dict[str, Any]) -> None:
        """Load :meth:`to_state`'s output (a state of a differently defined experiment is refused)."""
        if state.get("spec", self.spec.to_dict()) != self.spec.to_dict():
            raise ValueError(f"experiment {self.spec.name!r} was redefined; its state cannot be restored")
        self.cells = {(arm, tuple((lbl, val) for lbl, val in key)): RankingAggregate.from_state(s, self.options)
                      for arm, key, s in state["cells"]}  # fmt: skip
        self.other_arm_requests, self.before_start_requests = int(state["other"]), int(state["before"])


def _sums_only(agg: RankingAggregate) -> RankingAggregate:
    """The aggregate's counts and metric sums, with an empty score histogram."""
    out = RankingAggregate(agg.options)
    out.requests, out.requests_with_relevant, out.items = agg.requests, agg.requests_with_relevant, agg.items
    for name, s in agg.sums.items():
        out.sums[name].merge(s)
    return out


class ExperimentSums:
    """Cumulative sums of one experiment (see :meth:`ExperimentAccumulator.sums`); add up over pairs."""

    __slots__ = ("spec", "cells")

    def __init__(self, spec: ExperimentSpec, cells: CellSums) -> None:
        self.spec, self.cells = spec, cells

    @staticmethod
    def total(parts: list[ExperimentSums]) -> CellSums:
        """Cell-wise sums over parts (partition pairs) of one experiment."""
        out: dict[tuple[str, SliceKey], list[Any]] = {}
        for part in parts:
            for key, (requests, metrics) in part.cells.items():
                slot = out.setdefault(key, [0, {}])
                slot[0] += requests
                for m, (c, t, t2) in metrics.items():
                    c0, t0, q0 = slot[1].get(m, (0, 0.0, 0.0))
                    slot[1][m] = (c0 + c, t0 + t, q0 + t2)
        return {key: (int(v[0]), dict(v[1])) for key, v in out.items()}
