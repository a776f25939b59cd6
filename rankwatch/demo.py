"""``rankwatch demo``: the whole loop in one process, no external service.

Simulated traffic (``pipeline.traffic.generator``) is fed in event-time order into the streaming core, whose
windows go to the exporter on ``127.0.0.1:9108`` next to an offline baseline computed from a simulated
evaluation set of the same traffic without the regression. Event time runs ``speed`` times faster than
wall time through an injected :class:`pipeline.clock.ManualClock`, so 5-minute windows close every few
seconds. A live terminal table (rich) shows online vs offline per slice and the drift; when stdout is not
a terminal, one plain line per published 5m window is printed instead.

Threads: the main thread generates and processes events; the scheduler's workers run the idle tick
(under the same lock as the main thread) and the baseline reload; the HTTP server answers scrapes from
snapshots. Signal handlers only set an event; the main loop notices it and shuts everything down.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rankwatch.demo_transfer import DemoVersions, transfer_line
from rankwatch.errors import RankwatchError
from rankwatch.exporters.baselines import BaselineWatcher
from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.experiments import ExperimentCollector
from rankwatch.exporters.http import MetricsServer
from rankwatch.exporters.scheduling import ExporterScheduler
from rankwatch.exporters.state import MetricsState, Snapshot
from rankwatch.pipeline.clock import ManualClock, datetime_to_ms, ms_to_datetime
from rankwatch.pipeline.offline.baseline import compute_baseline, write_baseline
from rankwatch.pipeline.published import PublishedWindow
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.traffic.generator import (
    ExperimentTraffic,
    Regression,
    TrafficConfig,
    evaluation_frame,
    generate_events,
)

DEMO_SLICE_BY = ("segment", "surface", "variant")
VIEW_METRICS = ("ndcg@10", "mrr", "auc_roc")


@dataclass(frozen=True)
class DemoOptions:
    """Settings of one demo run (see ``rankwatch demo --help``)."""

    duration_s: float | None = None  # wall seconds; None = until interrupted
    speed: float = 120.0  # event seconds per wall second
    seed: int = 7
    bind: str = "127.0.0.1"
    port: int = 9108
    requests_per_second: float = 8.0  # event-time traffic
    regression_segment: str | None = "new_user"
    regression_at_s: float = 900.0  # event-time offset from the start
    regression_drop: float = 0.4
    windows_out: Path | None = None
    # 20,000 (about 1,700 per slice): the baseline's own SE then stays near the online 1h window's, so
    # a healthy slice's baseline is rarely off by a significant amount (docs/alerts.md, multiplicity).
    baseline_requests: int = 20_000
    attribution_window_s: float = 300.0
    segments: tuple[str, ...] = ("new_user", "returning", "power_user")
    surfaces: tuple[str, ...] = ("home_feed", "search")
    variants: tuple[str, ...] = ("control", "treatment")
    refresh_s: float = 0.5
    experiment: ExperimentTraffic | None = None  # an A/B experiment in the traffic, shown in the view
    # model versions with a known transfer, appended to a ledger served as rankwatch_transfer_*
    transfer: bool = True
    transfer_every_s: float = 300.0  # event time between two versions
    transfer_history: int = 8  # versions already in the ledger at start-up
    transfer_versions: int = 60  # at most this many versions in all
    ledger: Path | None = None  # keep the ledger here (appended to); default: a temporary file


@dataclass
class DemoSummary:
    events: int = 0
    windows: list[tuple[str, str]] = field(default_factory=list)  # (window size, start RFC 3339)
    url: str = ""
    interrupted: bool = False


def demo_traffic(options: DemoOptions, start: datetime) -> TrafficConfig:
    regression = None
    if options.regression_segment:
        regression = Regression(options.regression_segment, options.regression_at_s, options.regression_drop)
    duration = (options.duration_s if options.duration_s is not None else 7 * 86400) * options.speed + 3600
    return TrafficConfig(
        seed=options.seed,
        start=start,
        requests_per_second=options.requests_per_second,
        duration_s=duration,
        segments=options.segments,
        surfaces=options.surfaces,
        variants=options.variants,
        regression=regression,
        attribution_window_ms=int(options.attribution_window_s * 1000),
        experiment=options.experiment,
        # A little of the usual mess, so the health families have something to show; none of it changes
        # a metric.
        duplicate_rate=0.002,
        malformed_rate=0.002,
    )


def write_demo_baseline(
    traffic: TrafficConfig, options: DemoOptions, path: Path, config: StreamConfig
) -> None:
    """The offline baseline: the same model on a simulated evaluation set, before any regression."""
    frame = evaluation_frame(
        replace(traffic, regression=None, seed=traffic.seed + 1, experiment=None), options.baseline_requests
    )
    result = compute_baseline(frame, options=config.metric_options, slice_spec=config.slice_spec)
    write_baseline(path, result, clock=_WallClock())


class _WallClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class DemoRunner:
    """Wires generator, streaming core, exporter, scheduler and view; :meth:`run` blocks until done."""

    def __init__(self, options: DemoOptions, *, console: Console, stop: threading.Event) -> None:
        self.options = options
        self.console = console
        self.stop = stop
        wall_now = datetime.now(UTC)
        # Event time starts at the current 5-minute boundary, so windows line up with the wall clock.
        self.start = wall_now.replace(minute=wall_now.minute - wall_now.minute % 5, second=0, microsecond=0)
        self.traffic = demo_traffic(options, self.start)
        self.config = StreamConfig(
            windows=("5m", "1h"),
            attribution_window_ms=int(options.attribution_window_s * 1000),
            allowed_disorder_ms=10_000,
            idle_timeout_ms=30_000,
            slice_spec=SliceSpec(by=DEMO_SLICE_BY),
        )
        self.clock = ManualClock(self.start)
        self.processor = StreamProcessor(self.config, clock=self.clock)
        self.state = MetricsState.for_stream(self.config, version=_version())
        self.lock = threading.Lock()  # the processor is single-threaded: main loop and tick job share it
        self.summary = DemoSummary()
        self._windows_out: IO[str] | None = None
        self._lines: list[str] = []
        self.experiment = demo_experiment(options, self.config)
        self.experiments = ExperimentCollector([self.experiment])  # rankwatch_experiment_* (the A/B board)
        self.versions: DemoVersions | None = None  # rankwatch/demo_transfer.py

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self) -> DemoSummary:
        with tempfile.TemporaryDirectory(prefix="rankwatch-demo-") as tmp:
            baseline_path = Path(tmp) / "baseline-ranker.json"
            self._say(
                f"computing the offline baseline from {self.options.baseline_requests} simulated requests"
            )
            write_demo_baseline(self.traffic, self.options, baseline_path, self.config)
            watcher = BaselineWatcher([baseline_path], self.state)
            watcher.load_initial(strict=True)
            if self.options.transfer:
                ledger = self.options.ledger or Path(tmp) / "transfer-ledger.jsonl"
                self.versions = DemoVersions(ledger, self.state, self.start, seed=self.options.seed,
                                             every_s=self.options.transfer_every_s,
                                             history=self.options.transfer_history,
                                             max_versions=self.options.transfer_versions)  # fmt: skip
                try:
                    self.versions.start_up()
                except OSError as e:
                    raise RankwatchError(f"--ledger {ledger}: {e.strerror or e}") from None
            registry = build_registry(self.state, event_clock=self.clock)
            registry.register(self.experiments)
            server = MetricsServer(
                registry,
                bind=self.options.bind,
                port=self.options.port,
            )
            try:
                server.start()
            except OSError as e:
                raise RankwatchError(
                    f"demo: cannot listen on {self.options.bind}:{self.options.port}: {e.strerror or e}"
                ) from None
            self.summary.url = server.url + "/metrics"
            scheduler = ExporterScheduler(
                tick=self._tick, tick_interval_s=1.0, baselines=watcher, reload_interval_s=5.0,
                transfer=None if self.versions is None else self.versions.watcher.reload, transfer_interval_s=2.0,
            )  # fmt: skip
            try:
                if self.options.windows_out is not None:
                    try:
                        self._windows_out = self.options.windows_out.open("a", encoding="utf-8")
                    except OSError as e:
                        raise RankwatchError(
                            f"--windows-out {self.options.windows_out}: {e.strerror or e}"
                        ) from None
                scheduler.start()
                self._say(f"serving {self.summary.url}  (speed {self.options.speed:g}x, Ctrl-C to stop)")
                self._loop()
            finally:
                scheduler.stop()
                server.stop()
                if self._windows_out is not None:
                    self._windows_out.close()
        self.summary.interrupted = self.stop.is_set()
        return self.summary

    def _loop(self) -> None:
        opts = self.options
        wall_start = time.monotonic()
        deadline = None if opts.duration_s is None else wall_start + opts.duration_s
        start_ms = datetime_to_ms(self.start)
        live = self.console.is_terminal
        next_view = 0.0
        view = (
            Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            if live
            else None
        )
        if view is not None:
            view.start()
        try:
            for event in generate_events(self.traffic):
                # Pace: event time may not run ahead of speed x wall time.
                due = wall_start + (event.ts_ms - start_ms) / 1000.0 / opts.speed
                while True:
                    now = time.monotonic()
                    if self.stop.is_set() or (deadline is not None and now >= deadline):
                        return
                    if view is not None and now >= next_view:
                        view.update(self._render())
                        next_view = now + opts.refresh_s
                    if now >= due:
                        break
                    # Ahead of schedule: let the event clock follow wall time up to the next event, so idle
                    # ticks see time pass; it never passes an event still to be processed.
                    sim_now = self.start + timedelta(seconds=(now - wall_start) * opts.speed)
                    with self.lock:
                        self.clock.set(max(self.clock.now(), min(sim_now, ms_to_datetime(event.ts_ms))))
                    self.stop.wait(min(due - now, opts.refresh_s))
                with self.lock:
                    self.clock.set(max(self.clock.now(), ms_to_datetime(event.ts_ms)))
                    if event.stream == "impressions":
                        published = self.processor.process_impression(event.value)
                    else:
                        published = self.processor.process_feedback(event.value)
                    self.summary.events += 1
                    self._publish(published)
                    if self.summary.events % 2000 == 0:
                        self.state.set_stream_stats(self.processor.stats())
                if self.versions is not None and self.versions.advance(self.clock.now()) and not live:
                    self._say(transfer_line(self.state.snapshot()) or "transfer: no statistics yet")
        finally:
            if view is not None:
                view.update(self._render())
                view.stop()

    def _tick(self) -> None:
        """Idle tick (scheduler thread): lets windows close if traffic pauses, and refreshes health."""
        with self.lock:
            self._publish(self.processor.tick())
            self.state.set_stream_stats(self.processor.stats())

    def _publish(self, windows: list[PublishedWindow]) -> None:
        for pw in windows:
            self.state.publish_window(pw)
            self.experiments.publish_window(pw)
            doc = pw.document()
            self.summary.windows.append((pw.window, doc["start"]))
            if self._windows_out is not None:
                self._windows_out.write(json.dumps(doc) + "\n")
                self._windows_out.flush()
            if not self.console.is_terminal and pw.window == "5m":
                self._say(plain_line(pw, self.state.snapshot()))
                if self.options.experiment is not None:
                    self._say(experiment_line(self.experiment))

    # -- output --------------------------------------------------------------------------------------------
    def _say(self, line: str) -> None:
        self.console.print(line, highlight=False, soft_wrap=True)

    def _render(self) -> Group:
        snap = self.state.snapshot()
        view = render_view(snap, self.clock.now(), self.options, self.summary.url)
        line = transfer_line(snap) if self.versions is not None else None
        if line is not None:
            view = Group(view, Text(line, style="cyan"))
        if self.options.experiment is None:
            return view
        with self.lock:  # the accumulator is fed under this lock (main loop and tick job)
            table = experiment_table(self.experiment)
        return Group(view, table)


EXPERIMENT_METRIC = "ndcg@10"


def demo_experiment(options: DemoOptions, config: StreamConfig) -> Any:
    """The cumulative A/B state of the demo's variants (an A/A test unless ``options.experiment`` is set)."""
    from rankwatch.pipeline.experiments.online import ExperimentAccumulator
    from rankwatch.pipeline.experiments.spec import ExperimentSpec

    arms = options.experiment.arms if options.experiment else options.variants
    shares = options.experiment.shares if options.experiment else (1.0,) * len(arms)
    spec = ExperimentSpec(name="demo", control=arms[0], treatments=arms[1:], min_requests=200,
                          split=dict(zip(arms, shares, strict=True)))  # fmt: skip
    return ExperimentAccumulator(spec, config.metric_options, slice_by=("segment", "surface"), window="5m",
                                 keep_histograms=False)  # bounded memory: the view and the exports use sums


def _experiment_rows(acc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from rankwatch.pipeline.experiments.report import experiment_report

    doc = experiment_report(acc.data())
    return doc, [c for c in doc["comparisons"] if c["metric"] == EXPERIMENT_METRIC]


def experiment_line(acc: Any) -> str:
    """One plain line: the all-segments lift with its always-valid interval, the SRM p-value."""
    doc, rows = _experiment_rows(acc)
    overall = rows[0]
    lift = "insufficient data" if overall["lift"] is None else (
        f"{overall['lift']:+.2%} always-valid [{overall['lift_ci_sequential'][0]:+.2%}, "
        f"{overall['lift_ci_sequential'][1]:+.2%}] {overall['verdict']}")  # fmt: skip
    worst = [c for c in rows[1:] if c["verdict"] == "worse"]
    srm = doc["srm"]
    p = "-" if srm["p_value"] is None else f"{srm['p_value']:.4f}"
    line = f"experiment {EXPERIMENT_METRIC} lift {lift}; SRM p={p}"
    if srm["mismatch"]:
        line += " MISMATCH"
    if worst:
        line += "; worse in " + ", ".join(f"{c['segment']}/{c['surface']}" for c in worst)
    return line


def experiment_table(acc: Any) -> Group:
    """Per segment: n per arm, lift with fixed and always-valid intervals, adjusted p, verdict; SRM banner."""
    doc, rows = _experiment_rows(acc)
    srm = doc["srm"]
    table = Table(header_style="bold", title=None)
    for col in ("segment", "surface", "n treatment", "n control", f"{EXPERIMENT_METRIC} lift", "fixed 95 %", "always-valid",
                "p adj", "verdict"):
        table.add_column(col, justify="left" if col in ("segment", "surface", "verdict") else "right")

    def pct(pair: list[float] | None) -> str:
        return "-" if pair is None else f"[{pair[0]:+.1%}, {pair[1]:+.1%}]"

    for c in rows:
        style = {"worse": "red bold", "better": "green"}.get(c["verdict"], "")
        table.add_row(c["segment"], c["surface"], str(c["n"]), str(c["n_control"]), "-" if c["lift"] is None else f"{c['lift']:+.2%}",
                      pct(c["lift_ci"]), pct(c["lift_ci_sequential"]),
                      "-" if c["p_adjusted"] is None else f"{c['p_adjusted']:.4f}", c["verdict"], style=style)  # fmt: skip
    observed = ", ".join(f"{a} {n}" for a, n in srm["observed"].items())
    p = "-" if srm["p_value"] is None else f"{srm['p_value']:.4f}"
    banner = Text(f"experiment (cumulative since start): requests {observed}; SRM p = {p}",
                  style="red bold" if srm["mismatch"] else "dim")  # fmt: skip
    if srm["mismatch"]:
        banner.append("  SAMPLE RATIO MISMATCH: results untrustworthy")
    return Group(banner, table)


def _version() -> str:
    from rankwatch import __version__

    return __version__


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


_Z95 = 1.959963984540054


def _fmt_se(value: float | None, se: float | None) -> str:
    """``0.812 ±0.031``: the value and the half-width of its 95 % interval (1.96 SE)."""
    if value is None:
        return "-"
    return _fmt(value) if se is None else f"{value:.3f} ±{_Z95 * se:.3f}"


def drift_interval(
    on: float | None, on_se: float | None, off: float | None, off_se: float | None
) -> tuple[float, float, float] | None:
    """Drift online - offline and its 95 % interval; SE = sqrt(SE_on^2 + SE_off^2) (independent samples)."""
    if on is None or off is None:
        return None
    delta = on - off
    if on_se is None:
        return delta, delta, delta
    half = _Z95 * math.sqrt(on_se**2 + (off_se or 0.0) ** 2)
    return delta, delta - half, delta + half


def _fmt_drift(d: tuple[float, float, float] | None) -> str:
    if d is None:
        return "-"
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def slice_drift(snap: Snapshot, window: str, labels: tuple[str, str, str], metric: str) -> tuple[float, float, float] | None:
    """Drift of one slice and metric with its 95 % interval, from a snapshot."""
    online = snap.online.get(window)
    values = online.series.get(labels) if online else None
    offline = snap.offline.get(labels)
    if values is None or offline is None:
        return None
    return drift_interval(
        values.metrics.get(metric), values.stderr.get(metric), offline.metrics.get(metric), offline.stderr.get(metric)
    )


def plain_line(pw: PublishedWindow, snap: Snapshot) -> str:
    """One line per published 5m window: overall online vs offline and the worst slice drift, with intervals."""
    window = snap.online.get(pw.window)
    start = pw.start.strftime("%H:%M")
    end = pw.end.strftime("%H:%M")
    overall = ("all", "all", "all")
    on_values = window.series.get(overall) if window else None
    on = on_values.metrics.get("ndcg@10") if on_values else None
    on_se = on_values.stderr.get("ndcg@10") if on_values else None
    off_values = snap.offline.get(overall)
    off = off_values.metrics.get("ndcg@10") if off_values else None
    off_se = off_values.stderr.get("ndcg@10") if off_values else None
    worst = None
    result = snap.drifts.get(pw.window)
    if result:
        drifts = [
            (v, lbl) for (lbl, metric), v in result.values.items() if metric == "ndcg@10" and lbl != overall
        ]
        worst = min(drifts, default=None)
    line = (
        f"[{pw.window} {start}-{end}] requests {pw.overall.requests} ndcg@10 online {_fmt_se(on, on_se)} "
        f"offline {_fmt_se(off, off_se)}"
    )
    if worst is not None:
        interval = slice_drift(snap, pw.window, worst[1], "ndcg@10")
        line += f"; worst drift {'/'.join(worst[1])} {_fmt_drift(interval)} (95 %)"
    return line


def render_view(snap: Snapshot, event_now: datetime, options: DemoOptions, url: str) -> Group:
    """The live table: per slice, the last 5m window next to the baseline, with drift; every value with the
    half-width of its 95 % interval, every drift with its interval. A drift is red when significant (the
    interval lies below 0) and larger than 0.05."""
    window = snap.online.get("5m")
    title = Text.assemble(
        ("rankwatch demo", "bold"),
        f"  event time {event_now:%Y-%m-%d %H:%M:%S}Z  speed {options.speed:g}x  ",
        (url, "cyan"),
    )
    table = Table(title=None, expand=False, header_style="bold")
    for col in ("segment", "surface", "variant", "requests"):
        table.add_column(col, justify="right" if col == "requests" else "left")
    for metric in VIEW_METRICS:
        table.add_column(f"{metric} online", justify="right")
        table.add_column("offline", justify="right")
        table.add_column("drift", justify="right")
    if window is not None:
        for labels in sorted(window.series, key=lambda lbl: (lbl.count("all") < 3, lbl)):
            if labels.count("all") not in (0, 3):
                continue  # the roll-ups are exported; the view keeps to slices and overall
            values = window.series[labels]
            offline = snap.offline.get(labels)
            row = [*labels, str(values.requests)]
            for metric in VIEW_METRICS:
                on, on_se = values.metrics.get(metric), values.stderr.get(metric)
                off = offline.metrics.get(metric) if offline else None
                off_se = offline.stderr.get(metric) if offline else None
                d = drift_interval(on, on_se, off, off_se)
                style = (
                    "red bold"
                    if d is not None and d[0] < -0.05 and d[2] < 0
                    else ("green" if d is not None else "")
                )
                row += [_fmt_se(on, on_se), _fmt_se(off, off_se), Text(_fmt_drift(d), style=style)]  # type: ignore[list-item]
            table.add_row(*row)
        caption = f"last 5m window {window.start:%H:%M}-{window.end:%H:%M}Z"
    else:
        caption = "waiting for the first 5m window to close (attribution window + allowed disorder)..."
    lines: list[Any] = [title, table, Text(caption, style="dim")]
    if options.regression_segment:
        at = options.regression_at_s
        lines.append(
            Text(
                f"injected regression: segment {options.regression_segment} loses {options.regression_drop:g} "
                f"quality from event time +{at / 60:g} min",
                style="yellow",
            )
        )
        seen = _regression_report(snap, options.regression_segment)
        if seen:
            lines.append(Text(seen, style="yellow"))
    published = ", ".join(f"{w}: {n}" for w, n in sorted(snap.windows_published.items())) or "none yet"
    events = snap.health.events
    counts = {
        o: sum(n for (_, outcome), n in events.items() if outcome == o) for o in ("accepted", "rejected")
    }
    lines.append(
        Text(
            f"windows published {published}; events accepted {counts['accepted']}, rejected {counts['rejected']}",
            style="dim",
        )
    )
    return Group(*lines)


def _regression_report(snap: Snapshot, segment: str) -> str | None:
    """The regressed segment's worst ndcg@10 slice drift with its 95 % interval, e.g.
    ``new_user/search/control ndcg@10 drift -0.313 [-0.373, -0.254]``."""
    window = snap.online.get("5m")
    if window is None:
        return None
    found = [
        (d, labels)
        for labels in window.series
        if labels[0] == segment and "all" not in labels
        for d in [slice_drift(snap, "5m", labels, "ndcg@10")]
        if d is not None
    ]
    if not found:
        return None
    d, labels = min(found)
    verdict = "significant" if d[2] < 0 else "not significant yet"
    return f"seen: {'/'.join(labels)} ndcg@10 drift {_fmt_drift(d)} (95 %, {verdict})"


def run_demo(
    options: DemoOptions,
    *,
    console: Console | None = None,
    stop: threading.Event | None = None,
    install_signals: Callable[[threading.Event], Callable[[], None]] | None = None,
) -> DemoSummary:
    """Run the demo until ``options.duration_s`` elapses or ``stop`` is set."""
    stop = stop or threading.Event()
    restore = install_signals(stop) if install_signals else None
    try:
        return DemoRunner(options, console=console or Console(), stop=stop).run()
    finally:
        if restore is not None:
            restore()
