"""The experiments whose cumulative state rides in one stream processor's snapshot (docs/experiments.md).

:class:`StreamExperiments` holds one :class:`pipeline.experiments.online.ExperimentAccumulator` per request-unit
experiment (fed the processor's published windows of the smallest size) and one
:class:`pipeline.experiments.users.UserUnitAccumulator` per user-unit experiment (fed its finalized kernel batches).
Only experiments whose arm label the windows are sliced by are kept (``rankwatch run`` refuses the others).
The processor asks it for the stats' sums, its snapshot part and the restore, in one place.

Why a module of its own: the processor's stream handling and the experiments' bookkeeping change for
different reasons; the accumulators are imported only when experiments are configured.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rankwatch.pipeline.metrics.kernel import PerRequestMetrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceKey
from rankwatch.pipeline.stream.join import FinalizedBatch

__all__ = ["StreamExperiments"]


class StreamExperiments:
    """Request-unit and user-unit experiment state of one processor (see the module docstring)."""

    def __init__(self, experiments: Sequence[Any], options: MetricOptions, *, slice_by: tuple[str, ...],
                 smallest_window: str) -> None:  # fmt: skip
        specs = [spec for spec in experiments if spec.label in slice_by]
        self.by_window: list[Any] = []
        self.by_user: list[Any] = []
        if any(spec.unit == "request" for spec in specs):
            from rankwatch.pipeline.experiments.online import ExperimentAccumulator

            self.by_window = [ExperimentAccumulator(spec, options, slice_by=slice_by, window=smallest_window,
                                                    keep_histograms=False)
                              for spec in specs if spec.unit == "request"]  # fmt: skip
        if any(spec.unit == "user" for spec in specs):
            from rankwatch.pipeline.experiments.users import UserUnitAccumulator

            self.by_user = [UserUnitAccumulator(spec, options, slice_by=slice_by) for spec in specs if spec.unit == "user"]
        self._all = (*self.by_window, *self.by_user)
        self.any = bool(self._all)  # an experiment kept: it reads the windows or the kernel batches
        self._anonymous = -1  # user keys of requests without one (see fold)

    def windows(self, windows: list[PublishedWindow]) -> list[PublishedWindow]:
        """Fold published windows into the request-unit experiments; returns them unchanged."""
        for acc in self.by_window:
            for pw in windows:
                acc.add(pw)
        return windows

    def fold(self, batch: FinalizedBatch, metrics: PerRequestMetrics, combo_keys: Sequence[SliceKey]) -> None:
        """Per-user sums of the user-unit experiments from one kernel batch (``combo_keys``: the processor's
        table of slice keys, indexed by ``batch.combo``)."""
        if not self.by_user:
            return
        users = batch.users
        if users is None:  # staged before users were carried (an old snapshot): each request its own unit
            users = np.arange(self._anonymous, self._anonymous - batch.n_requests, -1, dtype=np.int64)
            self._anonymous -= batch.n_requests
        for acc in self.by_user:
            acc.add(metrics, batch.combo, combo_keys, users, batch.ts_ms)

    def sums(self) -> dict[str, Any]:
        """Name -> the small, immutable sums the exporter reads (abonline / abusers ``sums()``)."""
        return {acc.spec.name: acc.sums() for acc in self._all}

    def data(self, name: str) -> Any:
        """The :class:`pipeline.experiments.data.ExperimentData` of experiment ``name``."""
        for acc in self._all:
            if acc.spec.name == name:
                return acc.data()
        raise KeyError(name)

    def to_state(self) -> dict[str, Any]:
        return {acc.spec.name: acc.to_state() for acc in self._all}

    def restore(self, saved: dict[str, Any]) -> None:
        """Load :meth:`to_state`'s output; an experiment added or redefined since the snapshot starts empty."""
        for acc in self._all:
            if saved.get(acc.spec.name, {}).get("spec") == acc.spec.to_dict():
                acc.restore(saved[acc.spec.name])
