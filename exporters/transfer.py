"""Transfer ledgers for the exporter: load them, compute the transfer statistics, reload on change.

Layout: :func:`transfer_samples` (ledger entries -> the samples of every ``rankwatch_transfer_*`` family);
:class:`TransferWatcher` (the ``[transfer] ledgers`` files, re-read when one changes, like
:class:`~exporters.baselines.BaselineWatcher`); :func:`transfer_families` (a snapshot's samples -> families,
what the collector yields).

Why here and at load time: the statistics need a bootstrap (2000 resamples per group); a scrape must stay a
copy of a snapshot, so they are computed once per ledger change on the reload job's thread and handed to
``MetricsState.set_transfer``.

Families (docs/exporter.md, "Transfer"): one group per ``(metric, segment)`` of the ledgers' latest lines
(``rankwatch transfer --by segment``: the ``all`` segment is the ledgers' all-segments lines, so no
comparison counts twice); ``metric`` is the offline metric, or ``offline->online`` when a line's
``online_metric`` differs. A statistic that is undefined (too few comparisons, denominator <= 0) has no
sample.

- ``rankwatch_transfer_slope{metric, segment, estimator}`` (``ols``, ``corrected``)
- ``rankwatch_transfer_slope_lower`` / ``_upper{metric, segment}``: the corrected slope's 95 % interval (jackknife t)
- ``rankwatch_transfer_correlation{metric, segment}`` (corrected), ``rankwatch_transfer_sign_agreement``,
  ``rankwatch_transfer_comparisons{metric, segment}``
- ``rankwatch_transfer_offline_diff`` / ``rankwatch_transfer_online_diff{metric, segment, experiment,
  candidate}``: one point per comparison, for the XY chart
- ``rankwatch_transfer_load_errors_total``: failed (re)loads (a broken ledger keeps the last good statistics)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from rankwatch.exporters import names
from rankwatch.pipeline.transfer.ledger import LedgerEntry, LedgerError, read_ledgers
from rankwatch.pipeline.transfer.report import transfer_groups

__all__ = ["FAMILY_HELP", "TransferSink", "TransferWatcher", "transfer_families", "transfer_samples"]

log = logging.getLogger(__name__)

FAMILY_HELP: dict[str, str] = {
    names.TRANSFER_SLOPE: "Slope of online on offline differences across comparisons (ols, or corrected "
    "for offline noise: errors-in-variables).",
    names.TRANSFER_SLOPE_LOWER: "Lower end of the corrected slope's 95 % interval (jackknife t).",
    names.TRANSFER_SLOPE_UPPER: "Upper end of the corrected slope's 95 % interval (jackknife t).",
    names.TRANSFER_CORRELATION: "Correlation of offline and online differences, corrected for their noise.",
    names.TRANSFER_SIGN_AGREEMENT: "Share of significant online differences whose sign the offline one had.",
    names.TRANSFER_COMPARISONS: "Comparisons (ledger lines, latest per comparison) behind the statistics.",
    names.TRANSFER_OFFLINE_DIFF: "Offline difference (candidate - reference) of one comparison.",
    names.TRANSFER_ONLINE_DIFF: "Online difference (candidate - reference) of one comparison.",
}


class TransferSink(Protocol):
    """Where computed samples go (the exporter's ``MetricsState``)."""

    def set_transfer(self, samples: Mapping[str, tuple[Sample, ...]] | None, load_errors: int) -> None:
        """``samples`` None: keep the served ones, update the error count."""


def _metric_label(entry_metric: str, online_metric: str) -> str:
    return entry_metric if online_metric == entry_metric else f"{entry_metric}->{online_metric}"


def transfer_samples(
    entries: Iterable[LedgerEntry], *, seed: int = 0, resamples: int = 2000
) -> dict[str, tuple[Sample, ...]]:
    """The samples of every transfer family (keys of :data:`FAMILY_HELP`), per metric and segment."""
    out: dict[str, list[Sample]] = {name: [] for name in FAMILY_HELP}

    def add(family: str, labels: dict[str, str], value: float | None) -> None:
        if value is not None:
            out[family].append(Sample(family, labels, float(value)))

    for g in transfer_groups(entries, by_segment=True, seed=seed, resamples=resamples):
        labels = {"metric": _metric_label(g.metric, g.online_metric), "segment": g.segment}
        add(names.TRANSFER_SLOPE, {**labels, "estimator": "ols"}, g.slope_ols)
        add(names.TRANSFER_SLOPE, {**labels, "estimator": "corrected"}, g.slope_corrected)
        interval = g.slope_corrected_ci.interval
        if interval is not None:
            add(names.TRANSFER_SLOPE_LOWER, labels, interval[0])
            add(names.TRANSFER_SLOPE_UPPER, labels, interval[1])
        add(names.TRANSFER_CORRELATION, labels, g.correlation_corrected)
        add(names.TRANSFER_SIGN_AGREEMENT, labels, g.sign_agreement)
        add(names.TRANSFER_COMPARISONS, labels, float(g.n))
        for c in g.comparisons:
            point = {**labels, "experiment": c.entry.experiment, "candidate": c.entry.candidate}
            add(names.TRANSFER_OFFLINE_DIFF, point, c.entry.offline.diff)
            add(names.TRANSFER_ONLINE_DIFF, point, c.entry.online.diff)
    return {name: tuple(samples) for name, samples in out.items()}


def transfer_families(samples: Mapping[str, tuple[Sample, ...]], load_errors: int) -> Iterator[Metric]:
    """Every transfer family (empty ones too, so names are always described), then the error counter."""
    for name, help_text in FAMILY_HELP.items():
        metric = Metric(name, help_text, "gauge")
        metric.samples = list(samples.get(name, ()))
        yield metric
    errors = Metric(names.TRANSFER_LOAD_ERRORS, "Failed (re)loads of the transfer ledgers.", "counter")
    errors.add_sample(names.TRANSFER_LOAD_ERRORS + "_total", {}, float(load_errors))
    yield errors


class TransferWatcher:
    """Keeps the statistics of the ledgers ``paths`` in a :class:`TransferSink`; :meth:`reload` re-reads them
    all when any file's (mtime, size, inode) changed. Safe to call from any thread (one reload at a time)."""

    def __init__(
        self, paths: Sequence[str | os.PathLike[str]], sink: TransferSink, *, seed: int = 0, resamples: int = 2000
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self._sink = sink
        self._seed, self._resamples = seed, resamples
        self._lock = threading.Lock()
        self._stamps: tuple[tuple[int, int, int] | None, ...] | None = None
        self._failed = False
        self.load_errors = 0
        self.last_error: str | None = None

    def load_initial(self) -> None:
        """First load (a broken ledger is logged and counted, never fatal: it is retried at every reload)."""
        self.reload()

    def reload(self) -> bool:
        """Re-read the ledgers if one changed (or the last load failed); True when the statistics changed."""
        with self._lock:
            stamps = tuple(_stamp(p) for p in self.paths)
            if stamps == self._stamps and not self._failed:
                return False
            self._stamps = stamps
            try:
                entries = read_ledgers(self.paths)
                samples = transfer_samples(entries, seed=self._seed, resamples=self._resamples)
            except (LedgerError, OSError) as e:
                level = logging.DEBUG if self.last_error == str(e) else logging.WARNING
                log.log(level, "transfer ledgers not (re)loaded, keeping the previous statistics: %s", e)
                self.last_error, self._failed = str(e), True
                self.load_errors += 1
                self._sink.set_transfer(None, self.load_errors)
                return False
            self.last_error, self._failed = None, False
            self._sink.set_transfer(samples, self.load_errors)
            return True


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)
