"""``rankwatch run --config FILE``: the service (Kafka in, windows and /metrics out).

Wiring only: :class:`consumers.service.ConsumerService` consumes and publishes; every published window
goes to :func:`window_sink` (``--windows-out`` writer, deduplicated by identity, and the exporter state);
the service's health goes to the exporter every 0.25 s. SIGTERM and SIGINT stop the loop, which
finishes its batch, checkpoints, commits and closes; the exit status is then 0. The exit is bounded, also
when Kafka is unreachable: the service gives up its final checkpoint in an outage and closes its clients
within ``shutdown_timeout``; a backstop ends the process (status 0) 10 s after that.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from rankwatch.commands.exporter_feed import ExporterFeed
from rankwatch.errors import RankwatchError


def web_config(ex: Any) -> Any:
    """The exporter's :class:`exporters.http.WebConfig`: ``[exporter] web_config_file`` (exporter-toolkit
    format), else the older ``tls_*``/``basic_auth_*`` keys mapped onto it."""
    from rankwatch.exporters.http import BasicAuth, TLSConfig, WebConfig, load_web_config

    if ex.web_config_file is not None:
        return load_web_config(str(ex.web_config_file))
    tls = TLSConfig(str(ex.tls_certfile), str(ex.tls_keyfile)) if ex.tls_certfile and ex.tls_keyfile else None
    auth = BasicAuth.from_file(ex.basic_auth_user, str(ex.basic_auth_password_file)) if ex.basic_auth_password_file else None
    return WebConfig(tls=tls, auth=auth)


def window_sink(*targets: Callable[[Any], object]) -> Callable[[Any], None]:
    """The ``on_window`` hook: hand each published window to every target (writer, exporter, ...)."""

    def sink(window: Any) -> None:
        for target in targets:
            target(window)

    return sink


def experiment_collector(cfg: Any) -> Any:
    """The ``rankwatch_experiment_*`` collector of the configured request-unit experiments (None: none).

    Their state lives in the partition pairs' processors (``StreamConfig.experiments``). The windows must be sliced by each experiment's arm label (``[slices] by``), else a ConfigError.
    Experiments with ``unit = "user"`` keep per-user sums in the pairs' state (pipeline/experiments/users.py).
    """
    from rankwatch.errors import ConfigError
    from rankwatch.exporters.experiments import ExperimentCollector

    if not cfg.experiments:
        return None
    by = cfg.stream.slice_spec.by
    specs = []
    for spec in cfg.experiments:
        if spec.label not in by:
            raise ConfigError(f"experiment {spec.name!r}: its arm label {spec.label!r} must be in [slices] by "
                              f"(now {', '.join(by) or 'nothing'})")  # fmt: skip
        if spec.unit == "user":
            logging.getLogger("rankwatch").info(
                "experiment %r: unit = 'user'; exact over instances when both topics are keyed by user_id "
                "(docs/experiments.md)", spec.name)
        specs.append(spec)
    return ExperimentCollector(specs=specs) if specs else None


def start_registry(cfg: Any) -> Any:
    """The schema registry client when a topic is Confluent-framed (None otherwise), with the decoders
    built once here so a broken schema file or descriptor set fails before Kafka. Credentials refused
    (401/403) are a one-line error now; a registry that does not answer is an outage the service rides
    out (consumers/decoding.py), so it only logs here."""
    from rankwatch.consumers.decoding import build_decoders
    from rankwatch.consumers.registry import SchemaRegistry
    from rankwatch.pipeline.events.formats import RegistryUnavailable

    registry = None
    if any(spec.confluent for spec in cfg.formats.values()):
        registry = SchemaRegistry(cfg.schema_registry)
        try:
            registry.check()
        except RegistryUnavailable as e:
            logging.getLogger("rankwatch").warning("%s; records wait until it answers", e)
    build_decoders(cfg.formats, None if registry is None else registry.schema_of, cfg.stream.max_event_bytes)
    return registry


@click.command("run")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="TOML configuration (see docs/kafka.md and examples/rankwatch.toml).")
@click.option("--windows-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append one JSON line per published window (overrides [output] windows_out).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def command(config_path: Path, windows_out: Path | None, log_level: str) -> None:
    """Consume impressions and clicks from Kafka, publish windows, serve /metrics."""
    # Signals first, before the second of imports below: a SIGTERM during start-up must also end in a clean
    # exit, not a default death (exit status -15; a supervisor stopping a process it just started saw one).
    stop_requested: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop_requested.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stop_requested.append(signum))
    from datetime import UTC, datetime

    from rankwatch.config import load_config
    from rankwatch.consumers.service import ConsumerService, ServiceHealth
    from rankwatch.consumers.windows_out import WindowsOutWriter

    logging.basicConfig(level=getattr(logging, log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kafka-python logs every failed reconnect and request; an outage is reported once by the service
    # (consumers/outage.py), so only its errors above that are shown, unless debugging.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if log_level != "debug" else logging.DEBUG)
    from rankwatch.consumers.connect import hide_sasl_in_logs

    hide_sasl_in_logs()  # kafka-python's debug lines print SASL requests (a PLAIN one carries the password)
    # Checkpointing in the rebalance listener takes longer than kafka-python's 0.1 s "blocking" threshold
    # on purpose (the state must be saved before the pairs are given up); that warning is noise here.
    logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
    cfg = load_config(config_path)
    from rankwatch.crc import log_crc32c

    log_crc32c(logging.getLogger("rankwatch"))  # after the config: a bad config stays a one-line error
    out_path = windows_out or cfg.windows_out

    class _WallClock:
        def now(self) -> datetime:
            return datetime.now(UTC)

    writer = WindowsOutWriter(out_path) if out_path else None
    targets: list[Callable[[Any], object]] = []
    if writer is not None:
        targets.append(writer.write)
    state = server = watcher = scheduler = experiments = feed = None
    if cfg.exporter.enabled:
        from rankwatch.exporters.baselines import BaselineExpectation, BaselineWatcher
        from rankwatch.exporters.collector import build_registry
        from rankwatch.exporters.http import MetricsServer
        from rankwatch.exporters.scheduling import ExporterScheduler
        from rankwatch.exporters.state import MetricsState

        state = MetricsState.for_stream(cfg.stream)
        experiments = experiment_collector(cfg)
        feed = ExporterFeed(state, experiments=experiments)  # exporter updates off the consuming thread
        targets.append(feed.add)
        if cfg.baselines or cfg.baseline_directory is not None:
            expect = BaselineExpectation(cfg.stream.metric_options, cfg.stream.slice_spec.by)
            try:  # missing, corrupt or other options at start: an error (later, the last good one keeps serving)
                watcher = BaselineWatcher(list(cfg.baselines), state, directory=cfg.baseline_directory,
                                          expect=expect)
                watcher.load_initial(strict=True)
            except ValueError as e:
                raise RankwatchError(f"baselines: {e}") from None
            # Reloads run as an APScheduler job, off the consuming thread: a slow disk never delays a poll.
            scheduler = ExporterScheduler(baselines=watcher, reload_interval_s=cfg.baseline_reload_ms / 1000)
        if cfg.transfer_ledgers:  # issue 21: statistics at load time, on the scheduler's thread
            from rankwatch.exporters.transfer import TransferWatcher

            ledgers = TransferWatcher(list(cfg.transfer_ledgers), state, seed=cfg.transfer_seed,
                                      resamples=cfg.transfer_resamples)  # fmt: skip
            ledgers.load_initial()
            scheduler = ExporterScheduler(
                baselines=watcher, reload_interval_s=cfg.baseline_reload_ms / 1000,
                transfer=ledgers.reload, transfer_interval_s=cfg.transfer_reload_ms / 1000,
            )  # fmt: skip

    def on_health(health: ServiceHealth) -> None:
        if feed is not None:
            feed.health(health)

    schema_registry = start_registry(cfg)
    service = ConsumerService(cfg.kafka, cfg.stream, on_window=window_sink(*targets), clock=_WallClock(),
                              on_health=on_health, events=cfg.events, formats=cfg.formats,
                              registry=schema_registry)
    if state is not None:  # before Kafka: a taken port fails fast, and /healthz answers during start-up
        try:
            ex = cfg.exporter
            web = web_config(ex)
            tls, auth = web.tls, web.auth
            registry = build_registry(state)
            if experiments is not None:
                registry.register(experiments)
            server = MetricsServer(registry, bind=ex.host, port=ex.port, tls=tls, auth=auth,
                                   ready=service.ready).start()
        except (OSError, ValueError) as e:
            raise RankwatchError(f"exporter cannot listen on {cfg.exporter.host}:{cfg.exporter.port}: "
                                 f"{' '.join(str(e).split())}") from None
        logging.getLogger("rankwatch").info("serving metrics on %s/metrics", server.url)

    def backstop() -> None:
        # Reached only if closing hangs past the service's own bound (shutdown_timeout): the state is safe
        # in the last committed checkpoint, so this is still a clean exit.
        logging.getLogger("rankwatch").warning("shutdown took longer than %.0f s: exiting now",
                                               cfg.kafka.shutdown_timeout_s + 10)
        logging.shutdown()
        os._exit(0)

    def on_signal(signum: int, _frame: object) -> None:
        if not service.stopping:
            timer = threading.Timer(cfg.kafka.shutdown_timeout_s + 10.0, backstop)
            timer.daemon = True
            timer.start()
        service.stop()

    # From here a signal stops the service, also while start() waits for Kafka (every wait there is bounded
    # and abandoned on stop, consumers/connect.py).
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if stop_requested:
        on_signal(stop_requested[0], None)
    try:
        service.start()
    except RankwatchError:  # bad topics, authentication, TLS, authorization: already one line
        if server is not None:
            server.stop()
        raise
    except Exception as e:  # noqa: BLE001 - anything else from Kafka: one line
        if server is not None:
            server.stop()
        raise RankwatchError(f"cannot start consuming from {','.join(cfg.kafka.bootstrap_servers)}: {e}") from None
    if scheduler is not None:
        scheduler.start()
    # Everything built so far (modules, clients, config) lives as long as the process: keep it out of the
    # garbage collector's full collections, which otherwise re-traverse it while the core runs.
    gc.freeze()
    try:
        service.run()
    finally:
        if feed is not None:
            feed.close()
        if scheduler is not None:
            scheduler.stop()
        if writer is not None:
            writer.close()
        if server is not None:
            server.stop()
