"""``rankwatch simulate``: realistic impression and click traffic to Kafka (kafka-python producer).

Traffic comes from :mod:`pipeline.traffic.generator` (position-biased graded clicks, per-segment quality, an
optional regression, duplicates, malformed events, out-of-order delivery), keyed by ``request_id`` on both
topics. By default it is paced in real time from now; ``--fast`` sends it as fast as the broker takes it,
with event times ending now (a backfill). ``--ground-truth`` writes the joined rows every valid request
must produce (``rankwatch offline`` input plus ``request_ts``), ``--events-out DIR`` the raw events
(``rankwatch replay`` input), so the expected windows can be computed independently.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rankwatch.errors import RankwatchError

if TYPE_CHECKING:
    from rankwatch.pipeline.traffic.generator import ExperimentTraffic


def _duration_s(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    from rankwatch.pipeline.stream.durations import parse_duration_ms

    text = value.strip()
    try:
        if text.replace(".", "", 1).isdigit():
            return float(text)
        if text.rstrip("mshd") in ("0", ""):  # a zero duration ("0s") is fine here
            return 0.0 if text.rstrip("mshd") == "0" else parse_duration_ms(text) / 1000
        return parse_duration_ms(text) / 1000
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _rate(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if value < 0 or value > 1:
        raise click.BadParameter(f"must be between 0 and 1, got {value}")
    return value


@click.command("simulate")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="TOML config of rankwatch run: its [kafka] (with [kafka.security]) and [topics] tables are used, "
                   "and the events are written in its [events.*] schema (JSON, or Avro with schema_file).")
@click.option("--bootstrap-servers", default=None, help="Comma-separated host:port [default: the config's, else 127.0.0.1:9092].")
@click.option("--impressions-topic", default=None, help="[default: the config's, else impressions]")
@click.option("--clicks-topic", default=None, help="[default: the config's, else clicks]")
@click.option("--rate", type=click.FloatRange(min=0.001), default=20.0, show_default=True, help="Requests per second.")
@click.option("--duration", default="10m", show_default=True, callback=_duration_s,
              help="Traffic length: seconds or a duration (30s, 10m, 1h).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fast", is_flag=True, help="Send as fast as possible; event times end now (unless --start).")
@click.option("--start", "start_text", default=None, help="Event time of the first request (RFC 3339 with a zone).")
@click.option("--items-per-request", type=click.IntRange(min=1, max=200), default=20, show_default=True)
@click.option("--regression-segment", default=None, help="Segment whose ranking quality drops.")
@click.option("--regression-from", "--regression-start", "regression_from", default="0s", callback=_duration_s,
              help="Offset from the start at which the regression begins (e.g. 20m).")
@click.option("--regression-drop", type=click.FloatRange(min=0, max=1), default=0.4, show_default=True,
              help="How much of the segment's model quality is lost.")
@click.option("--malformed-rate", type=float, default=0.0, callback=_rate, help="Share of events followed by a bad one.")
@click.option("--duplicate-rate", type=float, default=0.0, callback=_rate, help="Share of events delivered twice.")
@click.option("--out-of-order", "out_of_order", default="0s", callback=_duration_s,
              help="Delivery delayed by up to this much (shuffles events).")
@click.option("--attribution-window", default="30m", callback=_duration_s, show_default=True,
              help="Feedback is generated inside this window after its request.")
@click.option("--ground-truth", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the joined rows (JSONL: offline columns plus request_ts).")
@click.option("--events-out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the raw events to DIR/impressions.jsonl and DIR/clicks.jsonl.")
@click.option("--create-topics", is_flag=True, help="Create both topics when missing.")
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True,
              help="Partitions of topics created with --create-topics.")
@click.option("--close-windows", "close_after", default=None, callback=_duration_s,
              help="After the traffic, send one marker impression per partition this much later in event "
                   "time (e.g. 2h) so every window of the traffic closes without waiting for idle timeouts.")
@click.option("--experiment-effect", "experiment_effects", multiple=True, metavar="ARM:SEGMENT:DELTA",
              help="A/B experiment: change of model quality for ARM in SEGMENT ('*' for all); repeatable. "
                   "Arms are the variants (control, treatment), assigned per user.")
@click.option("--experiment-users", type=click.IntRange(min=1), default=None,
              help="Users in the experiment (default 2000 when an experiment option is given).")
@click.option("--user-effect-sd", type=click.FloatRange(min=0), default=None,
              help="Per-user random effect on model quality (sd), so a user's requests correlate.")
@click.option("--broken-split", type=click.FloatRange(min=0, max=0.99), default=None,
              help="Share of the treatment arm's requests lost before logging (a sample-ratio mismatch).")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also append the ledger lines of --model-versions model versions with a known per-segment "
                   "offline-to-online transfer (rankwatch transfer / [transfer] ledgers input).")
@click.option("--model-versions", type=click.IntRange(min=1), default=40, show_default=True,
              help="Model versions written to --ledger, recorded evenly over the traffic's event time.")
def command(
    config_path: Path | None, bootstrap_servers: str | None, impressions_topic: str | None, clicks_topic: str | None, rate: float, duration: float, seed: int,
    fast: bool, start_text: str | None, items_per_request: int, regression_segment: str | None,
    regression_from: float, regression_drop: float, malformed_rate: float, duplicate_rate: float,
    out_of_order: float, attribution_window: float, ground_truth: Path | None, events_out: Path | None,
    create_topics: bool, partitions: int, close_after: float | None, experiment_effects: tuple[str, ...] = (),
    experiment_users: int | None = None, user_effect_sd: float | None = None, broken_split: float | None = None,
    ledger: Path | None = None, model_versions: int = 40,
) -> None:
    """Produce simulated ranking traffic to Kafka."""
    import time

    from kafka import KafkaProducer

    from rankwatch.consumers.producer import ProduceError, produce_events, window_closers
    from rankwatch.consumers.topics import ensure_topic, partition_counts
    from rankwatch.pipeline.clock import datetime_to_ms
    from rankwatch.pipeline.traffic.generator import (
        Regression,
        TrafficConfig,
        generate_events,
        generate_with_truth,
    )

    now = datetime.now(UTC)
    if start_text is not None:
        try:
            start = datetime.fromisoformat(start_text.replace("Z", "+00:00"))
        except ValueError:
            raise click.BadParameter(f"not an RFC 3339 time: {start_text!r}", param_hint="--start") from None
        if start.tzinfo is None:
            raise click.BadParameter("needs a zone (e.g. Z or +02:00)", param_hint="--start")
    else:
        start = now if not fast else datetime.fromtimestamp(now.timestamp() - duration, tz=UTC)
    cfg = TrafficConfig(
        seed=seed, start=start, requests_per_second=rate, duration_s=duration, items_per_request=items_per_request,
        regression=Regression(regression_segment, regression_from, regression_drop) if regression_segment else None,
        duplicate_rate=duplicate_rate, malformed_rate=malformed_rate, out_of_order_ms=int(out_of_order * 1000),
        attribution_window_ms=int(attribution_window * 1000),
        experiment=experiment_traffic(experiment_effects, experiment_users, user_effect_sd, broken_split),
    )
    from rankwatch.consumers.connect import check_connection, fatal
    from rankwatch.consumers.settings import KafkaSettings

    if config_path is not None:
        from rankwatch.config import load_config

        run_config = load_config(config_path)
        kafka = run_config.kafka  # the same client options (and secrets) as rankwatch run
    else:
        run_config, kafka = None, KafkaSettings(session_timeout_s=5.0)
    client = kafka.client_kwargs()
    if bootstrap_servers is not None:
        client["bootstrap_servers"] = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    bootstrap_servers = ",".join(client["bootstrap_servers"])
    topics = {"impressions": impressions_topic or kafka.impressions_topic, "clicks": clicks_topic or kafka.clicks_topic}
    try:
        check_connection(client, 10.0)  # a wrong password or an untrusted CA: one line naming it
        if create_topics:
            for topic in topics.values():
                ensure_topic(client, topic, partitions=partitions)
        counts = partition_counts(client, topics.values(), timeout_s=5.0)
        producer = KafkaProducer(**client, acks="all", linger_ms=20, batch_size=256 * 1024)
    except RankwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - unreachable broker and the like: one line
        named = fatal(e, client)
        if isinstance(named, RankwatchError):
            raise named from None
        raise RankwatchError(f"cannot reach Kafka at {bootstrap_servers}: {e}") from None
    for topic, n in counts.items():
        if n == 0:
            raise RankwatchError(f"topic {topic!r} does not exist (use --create-topics)")
    if len(set(counts.values())) != 1:
        raise RankwatchError(f"topics are not co-partitioned: {counts}")

    if ground_truth is not None:
        events, truth = generate_with_truth(cfg)
        out = truth.copy()
        out["request_ts"] = out["request_ts"].map(lambda t: t.isoformat(timespec="milliseconds").replace("+00:00", "Z"))
        ground_truth.parent.mkdir(parents=True, exist_ok=True)
        out.to_json(ground_truth, orient="records", lines=True)
        stream = iter(events)
    else:
        stream = generate_events(cfg)
    files = {}
    if events_out is not None:
        events_out.mkdir(parents=True, exist_ok=True)
        files = {s: (events_out / f"{s}.jsonl").open("wb") for s in ("impressions", "clicks")}

    def keep(event: object) -> None:
        f = files[event.stream]  # type: ignore[attr-defined]
        f.write(event.value + b"\n")  # type: ignore[attr-defined]

    on_event = keep if files else None
    if run_config is not None and not run_config.events.identity:  # the traffic in the config's own schema
        from rankwatch.commands.team_traffic import in_team_schema, team_encoders

        stream, on_event = in_team_schema(stream, team_encoders(run_config, topics), on_native=on_event), None
    started = time.monotonic()
    try:
        report = produce_events(producer, stream, topics=topics, pace_from_ms=None if fast else datetime_to_ms(start),
                                on_event=on_event)
        if close_after is not None and report.last_ts_ms is not None:
            closers = window_closers(next(iter(counts.values())), report.last_ts_ms + int(close_after * 1000),
                                     record_ts_ms=report.last_ts_ms + 1)
            produce_events(producer, closers, topics=topics)
    except ProduceError as e:
        raise RankwatchError(str(e)) from None
    except KeyboardInterrupt:
        producer.flush()
        raise
    finally:
        for f in files.values():
            f.close()
        producer.close()
    elapsed = time.monotonic() - started
    if ledger is not None:  # issue 21: the versions' comparisons, recorded in the traffic's event time
        from rankwatch.demo_transfer import write_versions

        try:
            lines = write_versions(ledger, seed=seed, start=start, duration_s=duration, count=model_versions)
        except OSError as e:
            raise RankwatchError(f"--ledger {ledger}: {e.strerror or e}") from None
        click.echo(f"appended {lines} ledger lines ({model_versions} model versions) to {ledger}", err=True)
    click.echo(
        f"sent {report.sent['impressions']} impressions and {report.sent['clicks']} clicks "
        f"in {elapsed:.1f} s to {bootstrap_servers}", err=True,
    )


def experiment_traffic(
    effects: tuple[str, ...], users: int | None, user_effect_sd: float | None, broken_split: float | None,
    arms: tuple[str, ...] = ("control", "treatment"),
) -> ExperimentTraffic | None:
    """The generator's :class:`ExperimentTraffic` from the command-line options (None when none is given)."""
    from rankwatch.pipeline.traffic.generator import ExperimentTraffic

    if not effects and users is None and user_effect_sd is None and broken_split is None:
        return None
    parsed = []
    for text in effects:
        parts = text.split(":")
        try:
            arm, segment, delta = parts[0], parts[1], float(parts[2])
            if len(parts) != 3 or not arm or not segment:
                raise ValueError
        except (ValueError, IndexError):
            raise click.BadParameter(f"expected ARM:SEGMENT:DELTA, got {text!r}", param_hint="--experiment-effect") from None
        parsed.append((arm, segment, delta))
    try:
        return ExperimentTraffic(arms=arms, effects=tuple(parsed), users=users or 2_000,
                                 user_effect_sd=user_effect_sd or 0.0, broken_split=broken_split or 0.0)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--experiment-effect") from None
