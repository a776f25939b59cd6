"""Prometheus families of the experiments' cumulative sufficient statistics (``rankwatch_experiment_*``).

One :class:`ExperimentCollector` serves every experiment of an instance, from the cumulative state that
lives in each partition pair's snapshot (so it moves and restores with the pair): per experiment, arm and slice
(``segment="all", surface="all"`` for the all-segments slice) the request count and, per metric, the
count, sum and sum of squares of the per-request values since the experiment's start. The sums of these
over instances are the fleet's, so the recording rules of ``deploy/prometheus/rules/rankwatch-experiments.yml``
compute the fleet-wide difference, lift and their fixed and always-valid intervals exactly.

Families (docs/experiments.md, "Online"):

- ``rankwatch_experiment_requests{experiment, arm, role, segment, surface}``
- ``rankwatch_experiment_observations{experiment, arm, role, metric, segment, surface}``
- ``rankwatch_experiment_sum_of_values{...same...}``, ``rankwatch_experiment_sum_of_squares{...same...}``
- ``rankwatch_experiment_expected_share{experiment, arm, role}`` (the configured split, for the SRM rule)
- ``rankwatch_experiment_start_timestamp_seconds{experiment}`` (0 when the experiment has no start)

``unit = "user"`` experiments (pipeline/experiments/users.py) export, instead of the three per-request families,
the per-user sums the delta method needs, per metric (``n`` users with a value, and the sums of ``Y_u``,
``N_u``, ``Y_u^2``, ``N_u^2``, ``Y_u N_u``), plus the distinct users per arm for the sample-ratio test:

- ``rankwatch_experiment_units``, ``rankwatch_experiment_unit_sum_of_values``,
  ``rankwatch_experiment_unit_sum_of_counts``, ``rankwatch_experiment_unit_sum_of_squared_values``,
  ``rankwatch_experiment_unit_sum_of_squared_counts``, ``rankwatch_experiment_unit_sum_of_products``
  ``{experiment, arm, role, metric, segment, surface}``
- ``rankwatch_experiment_users{experiment, arm, role}``

``role`` is ``control`` or ``treatment``, so a rule can pair each treatment with its control.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from rankwatch.pipeline.experiments.online import CellSums, ExperimentAccumulator, ExperimentSums
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.experiments.users import UnitCellSums, UserUnitSums
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import ALL_VALUE

__all__ = ["ExperimentCollector", "FAMILIES", "UNIT_FAMILIES"]

FAMILIES = (
    "rankwatch_experiment_requests", "rankwatch_experiment_observations", "rankwatch_experiment_sum_of_values",
    "rankwatch_experiment_sum_of_squares", "rankwatch_experiment_expected_share",
    "rankwatch_experiment_start_timestamp_seconds",
)  # fmt: skip
UNIT_FAMILIES = (
    "rankwatch_experiment_units", "rankwatch_experiment_unit_sum_of_values", "rankwatch_experiment_unit_sum_of_counts",
    "rankwatch_experiment_unit_sum_of_squared_values", "rankwatch_experiment_unit_sum_of_squared_counts",
    "rankwatch_experiment_unit_sum_of_products", "rankwatch_experiment_users",
)  # fmt: skip


class ExperimentCollector(Collector):
    """The experiments' sums, from the partition pairs' states (service) or local accumulators (demo).

    ``set_parts({pair: stats.experiments})`` replaces the per-pair sums (the service calls it from its
    health callback, on the consuming thread, about once a second); ``publish_window`` feeds local
    accumulators. ``collect`` adds the parts up cell by cell under a lock.
    """

    def __init__(self, accumulators: list[ExperimentAccumulator] | None = None, *,
                 specs: list[ExperimentSpec] | None = None) -> None:  # fmt: skip
        self.accumulators = list(accumulators or [])
        self.specs = list(specs if specs is not None else [a.spec for a in self.accumulators])
        self._parts: dict[Any, dict[str, ExperimentSums | UserUnitSums]] = {}
        self._lock = threading.Lock()

    def publish_window(self, pw: PublishedWindow) -> None:
        """The ``on_window`` target for local accumulators."""
        with self._lock:
            for acc in self.accumulators:
                acc.add(pw)
            self._parts["local"] = {acc.spec.name: acc.sums() for acc in self.accumulators}

    def set_parts(self, parts: dict[Any, dict[str, ExperimentSums | UserUnitSums]]) -> None:
        """The sums of every partition pair this instance owns now (replacing the previous ones)."""
        with self._lock:
            self._parts = dict(parts)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            parts = list(self._parts.values())
        families = {n: Metric(n, _HELP[n], "gauge") for n in (*FAMILIES, *UNIT_FAMILIES)}
        for spec in self.specs:
            found = [p[spec.name] for p in parts if spec.name in p]
            if spec.unit == "user":
                rows = _user_rows(spec, *UserUnitSums.total([f for f in found if isinstance(f, UserUnitSums)]))
            else:
                rows = _rows(spec, ExperimentSums.total([f for f in found if isinstance(f, ExperimentSums)]))
            for name, samples in rows.items():
                families[name].samples.extend(samples)
        yield from families.values()


def _rows(spec: ExperimentSpec, cells: CellSums) -> dict[str, list[Sample]]:
    out = _spec_rows(spec, FAMILIES)
    for (arm, key), (requests, metrics) in sorted(cells.items()):
        labels = _cell_labels(spec, arm, key)
        out["rankwatch_experiment_requests"].append(Sample("rankwatch_experiment_requests", labels, float(requests)))
        for metric, (count, total, total_sq) in metrics.items():
            m = {**labels, "metric": metric}
            out["rankwatch_experiment_observations"].append(Sample("rankwatch_experiment_observations", m, float(count)))
            out["rankwatch_experiment_sum_of_values"].append(Sample("rankwatch_experiment_sum_of_values", m, total))
            out["rankwatch_experiment_sum_of_squares"].append(Sample("rankwatch_experiment_sum_of_squares", m, total_sq))
    return out


def _user_rows(spec: ExperimentSpec, cells: UnitCellSums, users: dict[str, int]) -> dict[str, list[Sample]]:
    out = _spec_rows(spec, (*FAMILIES, *UNIT_FAMILIES))
    for arm in spec.arms:
        out["rankwatch_experiment_users"].append(Sample(
            "rankwatch_experiment_users", {"experiment": spec.name, "arm": arm, "role": _role(spec, arm)},
            float(users.get(arm, 0))))  # fmt: skip
    for (arm, key), (requests, _n_users, metrics) in sorted(cells.items()):
        labels = _cell_labels(spec, arm, key)
        out["rankwatch_experiment_requests"].append(Sample("rankwatch_experiment_requests", labels, float(requests)))
        for metric, sums in metrics.items():
            m = {**labels, "metric": metric}
            for family, value in zip(UNIT_FAMILIES[:6], sums, strict=True):
                out[family].append(Sample(family, m, float(value)))
    return out


def _spec_rows(spec: ExperimentSpec, families: tuple[str, ...]) -> dict[str, list[Sample]]:
    """Empty sample lists of ``families``, with the experiment's start and expected shares filled in."""
    out: dict[str, list[Sample]] = {n: [] for n in families}
    start = 0.0 if spec.start is None else spec.start.timestamp()
    out["rankwatch_experiment_start_timestamp_seconds"].append(
        Sample("rankwatch_experiment_start_timestamp_seconds", {"experiment": spec.name}, start))
    for arm, share in spec.shares.items():
        out["rankwatch_experiment_expected_share"].append(Sample(
            "rankwatch_experiment_expected_share", {"experiment": spec.name, "arm": arm, "role": _role(spec, arm)},
            share))  # fmt: skip
    return out


def _cell_labels(spec: ExperimentSpec, arm: str, key: Any) -> dict[str, Any]:
    """Labels of one (arm, slice) cell; ``all`` for a label the slice does not fix."""
    values = dict(key)
    return {"experiment": spec.name, "arm": arm, "role": _role(spec, arm),
            **{lbl: values.get(lbl, ALL_VALUE) for lbl in ("segment", "surface")}}  # fmt: skip


def _role(spec: Any, arm: str) -> str:
    return "control" if arm == spec.control else "treatment"


_HELP = {
    "rankwatch_experiment_requests": "Requests per experiment arm and slice since the experiment's start.",
    "rankwatch_experiment_observations": "Per-request metric values counted per arm and slice since the start.",
    "rankwatch_experiment_sum_of_values": "Sum of per-request metric values per arm and slice since the start.",
    "rankwatch_experiment_sum_of_squares": "Sum of squared per-request metric values per arm and slice since the start.",
    "rankwatch_experiment_expected_share": "Configured share of traffic of each arm.",
    "rankwatch_experiment_start_timestamp_seconds": "Experiment start (0: none configured).",
    "rankwatch_experiment_units": "Users with a value of the metric per arm and slice (unit = user).",
    "rankwatch_experiment_unit_sum_of_values": "Sum over users of Y_u, the user's sum of per-request values.",
    "rankwatch_experiment_unit_sum_of_counts": "Sum over users of N_u, the user's count of per-request values.",
    "rankwatch_experiment_unit_sum_of_squared_values": "Sum over users of Y_u squared.",
    "rankwatch_experiment_unit_sum_of_squared_counts": "Sum over users of N_u squared.",
    "rankwatch_experiment_unit_sum_of_products": "Sum over users of Y_u times N_u.",
    "rankwatch_experiment_users": "Distinct users per experiment arm since the start (unit = user).",
}
