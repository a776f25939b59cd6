"""Background jobs with APScheduler: idle-window ticks, baseline reloads, consumer-lag polling.

Every job runs on the scheduler's worker threads, one instance at a time (``max_instances=1``), with missed
runs coalesced, so a slow reload never piles up. A job that raises is logged and runs again at its next
interval; it never stops the scheduler. :meth:`ExporterScheduler.stop` waits for running jobs to finish.

The tick job only calls the callable it is given: the owner of the stream processor passes a function that
takes its own lock, calls ``processor.tick()`` and hands the published windows to the exporter state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from rankwatch.exporters.baselines import BaselineWatcher
from rankwatch.exporters.state import MetricsState

log = logging.getLogger(__name__)

TICK_JOB = "rankwatch-idle-tick"
BASELINE_JOB = "rankwatch-baseline-reload"
LAG_JOB = "rankwatch-consumer-lag"
TRANSFER_JOB = "rankwatch-transfer-reload"  # [transfer] ledgers


class ExporterScheduler:
    """Owns one ``BackgroundScheduler`` and the rankwatch jobs on it.

    Parameters
    ----------
    tick
        Called every ``tick_interval_s`` seconds (idle ticks: windows close when traffic stops).
    baselines
        Its :meth:`~exporters.baselines.BaselineWatcher.reload` runs every ``reload_interval_s`` seconds.
    lag
        Returns ``{(topic, partition): lag}``; polled every ``lag_interval_s`` seconds into ``state``.
    transfer
        Re-reads the transfer ledgers when they change (``TransferWatcher.reload``), every
        ``transfer_interval_s`` seconds.
    """

    def __init__(
        self,
        *,
        state: MetricsState | None = None,
        tick: Callable[[], object] | None = None,
        tick_interval_s: float = 1.0,
        baselines: BaselineWatcher | None = None,
        reload_interval_s: float = 10.0,
        lag: Callable[[], Mapping[tuple[str, int], int]] | None = None,
        lag_interval_s: float = 5.0,
        transfer: Callable[[], object] | None = None,
        transfer_interval_s: float = 10.0,
    ) -> None:
        if lag is not None and state is None:
            raise ValueError("lag polling needs the state to write into")
        for name, value in (
            ("tick", tick_interval_s),
            ("reload", reload_interval_s),
            ("lag", lag_interval_s),
        ):
            if value <= 0:
                raise ValueError(f"{name} interval must be positive")
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone="UTC",
        )
        if tick is not None:
            self._add(TICK_JOB, tick, tick_interval_s)
        if baselines is not None:
            self._add(BASELINE_JOB, baselines.reload, reload_interval_s)
        if lag is not None:
            assert state is not None
            target = state

            def poll_lag() -> None:
                target.set_consumer_lag(lag())

            self._add(LAG_JOB, poll_lag, lag_interval_s)
        if transfer is not None:  # a TransferWatcher's reload (exporters/transfer.py)
            if transfer_interval_s <= 0:
                raise ValueError("transfer interval must be positive")
            self._add(TRANSFER_JOB, transfer, transfer_interval_s)

    def _add(self, job_id: str, func: Callable[[], object], interval_s: float) -> None:
        def run() -> None:
            try:
                func()
            except Exception:  # a job must never take the scheduler down; it retries next interval
                log.exception("scheduled job %s failed", job_id)

        self._scheduler.add_job(run, "interval", seconds=interval_s, id=job_id, name=job_id)

    @property
    def job_ids(self) -> list[str]:
        return sorted(job.id for job in self._scheduler.get_jobs())

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def start(self) -> ExporterScheduler:
        self._scheduler.start()
        return self

    def stop(self, *, wait: bool = True) -> None:
        """Stop scheduling and (by default) wait for running jobs; idempotent."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=wait)

    def __enter__(self) -> ExporterScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
