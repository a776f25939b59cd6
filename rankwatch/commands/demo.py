"""``rankwatch demo``: generator, streaming core, offline baseline and exporter in one process."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from rankwatch.errors import ConfigError


def _seconds(text: str, option: str) -> float:
    """``900``, ``900s``, ``15m`` or ``1h`` to seconds."""
    from rankwatch.pipeline.stream.durations import parse_duration_ms

    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration_ms(text) / 1000.0
    except ValueError:
        raise ConfigError(f"{option}: not a duration: {text!r} (use e.g. 900, 15m, 1h)") from None


def _install_signals(stop: threading.Event) -> Callable[[], None]:
    """Ctrl-C and SIGTERM only set ``stop``; the main loop exits cleanly. Returns the undo function."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


@click.command("demo")
@click.option("--duration", type=float, default=None, help="Wall seconds to run (default: until Ctrl-C).")
@click.option(
    "--speed",
    type=float,
    default=120.0,
    show_default=True,
    help="Event-time acceleration: event seconds per wall second (5m windows close every 300/speed s).",
)
@click.option(
    "--rate", type=float, default=8.0, show_default=True, help="Simulated requests per event-time second."
)
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the simulated traffic.")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address the exporter listens on.")
@click.option(
    "--port", type=int, default=9108, show_default=True, help="Port of the exporter (0: any free port)."
)
@click.option(
    "--regression-segment",
    default="new_user",
    show_default=True,
    help="Segment whose ranking quality drops ('' for no regression).",
)
@click.option(
    "--regression-at",
    default="15m",
    show_default=True,
    help="Event time after the start when the regression begins (e.g. 900, 15m).",
)
@click.option(
    "--regression-drop",
    type=float,
    default=0.4,
    show_default=True,
    help="How much model quality the regressed segment loses (0..1).",
)
@click.option(
    "--windows-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append one JSON line per published window to FILE.",
)
@click.option("--experiment-effect", "experiment_effects", multiple=True, metavar="ARM:SEGMENT:DELTA",
              help="Run an A/B experiment (arms control, treatment, per user): ARM's model quality changes by "
                   "DELTA in SEGMENT ('*' for all); repeatable. The view then shows the experiment.")
@click.option("--experiment-users", type=click.IntRange(min=1), default=None, help="Users in the experiment.")
@click.option("--user-effect-sd", type=click.FloatRange(min=0), default=None,
              help="Per-user random effect on model quality (sd).")
@click.option("--broken-split", type=click.FloatRange(min=0, max=0.99), default=None,
              help="Share of treatment requests lost before logging (shows the SRM banner).")
@click.option("--transfer/--no-transfer", default=True, show_default=True,
              help="Simulate model versions with a known offline-to-online transfer per segment and serve their "
                   "ledger as rankwatch_transfer_* (the overview's transfer row).")
@click.option("--version-every", default="5m", show_default=True,
              help="Event time between two model versions (e.g. 300, 5m).")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append the versions' ledger lines to FILE and keep it (default: a temporary file).")
def command(
    duration: float | None,
    speed: float,
    rate: float,
    seed: int,
    bind: str,
    port: int,
    regression_segment: str,
    regression_at: str,
    regression_drop: float,
    windows_out: Path | None,
    experiment_effects: tuple[str, ...] = (),
    experiment_users: int | None = None,
    user_effect_sd: float | None = None,
    broken_split: float | None = None,
    transfer: bool = True,
    version_every: str = "5m",
    ledger: Path | None = None,
) -> None:
    """The whole loop on one machine: simulated traffic, streaming windows, offline baseline, /metrics."""
    if duration is not None and duration <= 0:
        raise ConfigError("--duration must be positive")
    if speed <= 0:
        raise ConfigError("--speed must be positive")
    if rate <= 0:
        raise ConfigError("--rate must be positive")
    if not 0 <= port <= 65535:
        raise ConfigError("--port must be between 0 and 65535")
    if not 0.0 <= regression_drop <= 1.0:
        raise ConfigError("--regression-drop must be between 0 and 1")
    every = _seconds(version_every, "--version-every")
    if every <= 0:
        raise ConfigError("--version-every must be positive")
    from rich.console import Console

    from rankwatch.commands.simulate import experiment_traffic
    from rankwatch.demo import DemoOptions, run_demo

    segments = DemoOptions().segments
    if regression_segment and regression_segment not in segments:
        raise ConfigError(f"--regression-segment must be one of {', '.join(segments)} (or '' for none)")
    options = DemoOptions(
        duration_s=duration, speed=speed, seed=seed, bind=bind, port=port, requests_per_second=rate,
        regression_segment=regression_segment or None, regression_at_s=_seconds(regression_at, "--regression-at"),
        regression_drop=regression_drop, windows_out=windows_out,
        experiment=experiment_traffic(experiment_effects, experiment_users, user_effect_sd, broken_split),
        transfer=transfer, transfer_every_s=every, ledger=ledger,
    )  # fmt: skip
    console = Console()
    summary = run_demo(options, console=console, install_signals=_install_signals)
    n5 = sum(1 for w, _ in summary.windows if w == "5m")
    n1h = sum(1 for w, _ in summary.windows if w == "1h")
    how = "interrupted" if summary.interrupted else "done"
    console.print(
        f"rankwatch demo {how}: {summary.events} events, {n5} 5m and {n1h} 1h windows published",
        highlight=False,
    )
