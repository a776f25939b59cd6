"""Prometheus families of the experiments' cumulative sufficient statistics (``rankwatch_experiment_*``).

One :class:`ExperimentCollector` serves every experiment of an instance: per experiment, arm and slice
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

``role`` is ``control`` or ``treatment``, so a rule can pair each treatment with its control.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from rankwatch.pipeline.abonline import ExperimentAccumulator
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import ALL_VALUE

__all__ = ["ExperimentCollector", "FAMILIES"]

FAMILIES = (
    "rankwatch_experiment_requests", "rankwatch_experiment_observations", "rankwatch_experiment_sum_of_values",
    "rankwatch_experiment_sum_of_squares", "rankwatch_experiment_expected_share",
    "rankwatch_experiment_start_timestamp_seconds",
)  # fmt: skip


class ExperimentCollector(Collector):
    """Folds published windows into one accumulator per experiment; ``collect`` reads them under a lock."""

    def __init__(self, accumulators: list[ExperimentAccumulator]) -> None:
        self.accumulators = accumulators
        self._lock = threading.Lock()

    def publish_window(self, pw: PublishedWindow) -> None:
        """The ``on_window`` target."""
        with self._lock:
            for acc in self.accumulators:
                acc.add(pw)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [self._rows(acc) for acc in self.accumulators]
        names = {n: Metric(n, _HELP[n], "gauge") for n in FAMILIES}
        for per_family in rows:
            for name, samples in per_family.items():
                names[name].samples.extend(samples)
        yield from names.values()

    @staticmethod
    def _rows(acc: ExperimentAccumulator) -> dict[str, list[Sample]]:
        spec = acc.spec
        out: dict[str, list[Sample]] = {n: [] for n in FAMILIES}
        start = 0.0 if spec.start is None else spec.start.timestamp()
        out["rankwatch_experiment_start_timestamp_seconds"].append(
            Sample("rankwatch_experiment_start_timestamp_seconds", {"experiment": spec.name}, start))
        for arm, share in spec.shares.items():
            out["rankwatch_experiment_expected_share"].append(Sample(
                "rankwatch_experiment_expected_share", {"experiment": spec.name, "arm": arm, "role": _role(spec, arm)},
                share))  # fmt: skip
        for (arm, key), agg in sorted(acc.cells.items()):
            labels: dict[str, Any] = {"experiment": spec.name, "arm": arm, "role": _role(spec, arm)}
            values = dict(key)
            labels.update({lbl: values.get(lbl, ALL_VALUE) for lbl in ("segment", "surface")})
            out["rankwatch_experiment_requests"].append(Sample("rankwatch_experiment_requests", labels,
                                                               float(agg.requests)))  # fmt: skip
            for metric, s in agg.sums.items():
                m = {**labels, "metric": metric}
                out["rankwatch_experiment_observations"].append(Sample("rankwatch_experiment_observations", m, float(s.count)))
                out["rankwatch_experiment_sum_of_values"].append(Sample("rankwatch_experiment_sum_of_values", m, s.total))
                out["rankwatch_experiment_sum_of_squares"].append(Sample("rankwatch_experiment_sum_of_squares", m, s.total_sq))
        return out


def _role(spec: Any, arm: str) -> str:
    return "control" if arm == spec.control else "treatment"


_HELP = {
    "rankwatch_experiment_requests": "Requests per experiment arm and slice since the experiment's start.",
    "rankwatch_experiment_observations": "Per-request metric values counted per arm and slice since the start.",
    "rankwatch_experiment_sum_of_values": "Sum of per-request metric values per arm and slice since the start.",
    "rankwatch_experiment_sum_of_squares": "Sum of squared per-request metric values per arm and slice since the start.",
    "rankwatch_experiment_expected_share": "Configured share of traffic of each arm.",
    "rankwatch_experiment_start_timestamp_seconds": "Experiment start (0: none configured).",
}
