"""The demo's model versions: a transfer ledger that fills in while the demo runs.

Layout: :class:`DemoVersions` (appends version comparisons to a ledger as event time passes, and re-reads
the ledger into the exporter); :func:`write_versions` (``rankwatch simulate --ledger``: a run of versions
spread over the traffic's event time); :func:`transfer_line` (one plain line of the served corrected slopes).

Version ``k`` of :mod:`pipeline.traffic.versions` is compared with ``k - 1`` every ``every_s`` seconds of
event time; ``history`` versions are written at start-up with ``recorded_at`` in the past (a ledger a team
would already have), so the slopes are defined from the first scrape. ``recorded_at`` comes from the demo's
event clock (the application's clock), never from the pure core. The ledger is the demo's temporary file
unless ``ledger`` names one (then lines are appended to it and it is kept). Statistics are recomputed by the
exporter's :class:`~exporters.transfer.TransferWatcher` (``watcher.reload``), which the demo runs as the
scheduler's transfer job every couple of seconds, off the main loop: at 60 comparisons a reload takes about
0.1 s on a busy machine (2000 resamples), too much to repeat after every append at 600x; a scrape copies
the last snapshot. 500 bootstrap resamples (the correlation's interval; the slope's is a jackknife) keep
the reloads light next to the demo's main loop.

Why in the demo: the transfer row of the overview dashboard has something to show on a first look, and
the live Prometheus test can query its panels against real samples.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from rankwatch.exporters import names
from rankwatch.exporters.state import MetricsState, Snapshot
from rankwatch.exporters.transfer import TransferWatcher
from rankwatch.pipeline.traffic.versions import VersionTransfer, version_comparison
from rankwatch.pipeline.transfer.ledger import append_to_ledger

__all__ = ["DemoVersions", "transfer_line", "write_versions"]


def _rfc3339(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


class DemoVersions:
    """Writes version comparisons to ``ledger`` as event time passes and serves them through ``state``."""

    def __init__(self, ledger: Path, state: MetricsState, start: datetime, *, seed: int, every_s: float,
                 history: int, max_versions: int, resamples: int = 500) -> None:  # fmt: skip
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self.ledger = ledger
        self.config = VersionTransfer(seed=seed)
        self.start = start
        self.every = timedelta(seconds=every_s)
        self.history = max(0, history)
        self.max_versions = max_versions
        self.versions = 0  # comparisons written so far
        self.watcher = TransferWatcher([ledger], state, seed=seed, resamples=resamples)

    def start_up(self) -> None:
        """Write the history (recorded before ``start``) and load the ledger into the exporter."""
        for k in range(1, min(self.history, self.max_versions) + 1):
            self._write(k, self.start - (self.history - k) * self.every)
        self.watcher.load_initial()

    def advance(self, now: datetime) -> bool:
        """Write every version due by event time ``now``; True when the ledger grew (``watcher.reload`` reads it)."""
        grew = False
        while self.versions < self.max_versions:
            due = self.start + (self.versions - self.history + 1) * self.every
            if due > now:
                break
            self._write(self.versions + 1, due)
            grew = True
        return grew

    def _write(self, k: int, at: datetime) -> None:
        append_to_ledger(self.ledger, version_comparison(self.config, k, recorded_at=_rfc3339(at)))
        self.versions = k


def write_versions(ledger: Path, *, seed: int, start: datetime, duration_s: float, count: int) -> int:
    """Append versions ``1..count`` to ``ledger``, version ``k`` recorded at ``start + k * duration / count``
    (event time of ``rankwatch simulate``'s traffic); returns the lines written."""
    cfg = VersionTransfer(seed=seed)
    step = timedelta(seconds=duration_s / max(count, 1))
    return append_to_ledger(ledger, [e for k in range(1, count + 1)
                                     for e in version_comparison(cfg, k, recorded_at=_rfc3339(start + k * step))])  # fmt: skip


def transfer_line(snap: Snapshot) -> str | None:
    """``transfer ndcg@10: new_user 0.48 [0.21, 0.74] (12), ...``: the served corrected slopes per segment."""
    samples = snap.transfer
    if not samples:
        return None
    slopes = {(s.labels["metric"], s.labels["segment"]): s.value
              for s in samples.get(names.TRANSFER_SLOPE, ()) if s.labels.get("estimator") == "corrected"}  # fmt: skip
    lower = {(s.labels["metric"], s.labels["segment"]): s.value for s in samples.get(names.TRANSFER_SLOPE_LOWER, ())}
    upper = {(s.labels["metric"], s.labels["segment"]): s.value for s in samples.get(names.TRANSFER_SLOPE_UPPER, ())}
    count = {(s.labels["metric"], s.labels["segment"]): s.value for s in samples.get(names.TRANSFER_COMPARISONS, ())}
    if not count:
        return None
    parts = []
    for key in sorted(count, key=lambda k: (k[0], k[1] != "all", k[1])):
        slope = "-" if key not in slopes else f"{slopes[key]:.2f}"
        interval = f" [{lower[key]:.2f}, {upper[key]:.2f}]" if key in lower and key in upper else ""
        parts.append(f"{key[1]} {slope}{interval} ({int(count[key])})")
    metrics = sorted({k[0] for k in count})
    return f"transfer {', '.join(metrics)} corrected slope: " + "; ".join(parts)
