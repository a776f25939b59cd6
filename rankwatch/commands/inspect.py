"""``rankwatch inspect``: the first N events of a file or topic as the section 1 events they map to, or why
each is rejected (SPEC section 6, docs/mapping.md).

Layout: the events come from a log file (JSONL, optionally gzip; the stream is ``--stream``) or from a
Kafka topic read by a throw-away consumer without a group (from the earliest offset, every wait bounded by
``--timeout``); each goes through the config's :class:`~pipeline.events.translate.Translator` and then the
core's own decoder, so a rejection shows the reason the service would count.

Why both steps: a mapping can produce a section 1 event the core still refuses (a position of 0, an
unknown action); ``inspect`` shows that too, before the service counts it in production.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import click

from rankwatch.errors import RankwatchError


@click.command(name="inspect")
@click.option("--config", "config_file", required=True, type=click.Path(dir_okay=False),
              help="Config file whose [events.*] tables (and [kafka] settings for --topic) are used.")
@click.option("--file", "file", type=click.Path(dir_okay=False),
              help="A log file (JSONL, .jsonl.gz, or an .avro container file for an Avro stream).")
@click.option("--topic", help="A Kafka topic (read from its start without joining a group).")
@click.option("--stream", type=click.Choice(["impressions", "clicks"]), default=None,
              help="Which events these are (default: clicks when the topic is [topics] clicks, else impressions).")
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True)
@click.option("--timeout", "timeout_s", default=10.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Seconds to wait for a topic's events.")
def command(config_file: str, file: str | None, topic: str | None, stream: str | None, limit: int, fmt: str,
            timeout_s: float) -> None:
    """Show how the first events of a file or topic read in the config's schema."""
    from rankwatch.commands.event_files import file_translator
    from rankwatch.config import load_config
    from rankwatch.pipeline.events.formats import RegistryUnavailable

    if (file is None) == (topic is None):
        raise RankwatchError("inspect needs exactly one of --file PATH or --topic NAME")
    cfg = load_config(config_file)
    if stream is None:
        stream = "clicks" if topic is not None and topic == cfg.kafka.clicks_topic else "impressions"
    max_bytes = cfg.stream.max_event_bytes
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise RankwatchError(f"no such file: {path}")
        translator, opener = file_translator(cfg, max_bytes, [(path, stream)])
        source = _file_values(path, limit) if opener is None else _container_values(opener, path, stream, limit)
    else:
        translator = _topic_translator(cfg, max_bytes, timeout_s)
        source = _topic_values(cfg, topic, limit, timeout_s)
    try:
        rows = [inspect_one(translator, stream, raw, where, cfg.stream) for where, raw in source]
    except RegistryUnavailable as e:  # an outage here is an answer the user needs: one line
        raise RankwatchError(f"inspect: {e}") from None
    finally:
        source.close()  # the topic's consumer is closed now, not when the generator is collected
    if fmt == "json":
        for row in rows:
            click.echo(json.dumps(row))
    else:
        _table(rows)
    if not rows:
        click.echo(f"inspect: no events in {file or topic}", err=True)


def inspect_one(translator: Any, stream: str, raw: bytes, where: str, stream_config: Any) -> dict[str, Any]:
    """``{"source", "raw", "events": [...]}`` or ``{"source", "raw", "rejected": reason, "detail"}``."""
    from rankwatch.pipeline.events.validation import (
        Rejection,
        feedback_or_rejection,
        impression_or_rejection,
    )

    out: dict[str, Any] = {"source": where, "raw": _as_read(translator, stream, raw)}
    native = [raw] if translator is None else translator.translate(stream, raw)
    if type(native) is Rejection:
        return {**out, "rejected": str(native.reason), "detail": native.detail}
    events = []
    for value in native:
        check = (impression_or_rejection(value, stream_config.max_event_bytes, stream_config.max_items_per_request)
                 if stream == "impressions" else
                 feedback_or_rejection(value, stream_config.action_grades, stream_config.max_event_bytes))
        if type(check) is Rejection:
            return {**out, "rejected": str(check.reason), "detail": check.detail,
                    "mapped": value.decode("utf-8", "replace")}
        events.append(json.loads(value))
    return {**out, "events": events}


def _as_read(translator: Any, stream: str, raw: bytes) -> str:
    """The message as text: JSON as it is; Avro / Protobuf as the record it decodes to (JSON, bytes as
    hex), or the first bytes in hex when it does not decode."""
    from rankwatch.pipeline.events.validation import Rejection

    if translator is None or translator.mapping.stream(stream).format == "json":
        return raw.decode("utf-8", "replace")[:2000]
    tree = translator.decoders[stream](raw)
    if type(tree) is Rejection:
        return f"0x{raw[:64].hex()}{'...' if len(raw) > 64 else ''} ({len(raw)} bytes)"
    return json.dumps(tree, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))[:2000]


def _file_values(path: Path, limit: int) -> Generator[tuple[str, bytes], None, None]:
    if not path.is_file():
        raise RankwatchError(f"no such file: {path}")
    with path.open("rb") as raw:
        magic = raw.read(2)
        raw.seek(0)
        f: Any = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
        n = 0
        try:
            for number, line in enumerate(f, start=1):
                line = line.strip()
                if line:
                    yield f"{path.name}:{number}", line
                    n += 1
                    if n >= limit:
                        return
        except (OSError, EOFError) as e:
            raise RankwatchError(f"{path}: cannot read: {e}") from None


def _container_values(opener: Any, path: Path, stream: str, limit: int) -> Generator[tuple[str, bytes], None, None]:
    log = opener(path, stream, 0, 1 << 20)
    try:
        records, numbers = log.read_chunk()
        for number, raw in zip(numbers[:limit].tolist(), records[:limit], strict=True):
            yield f"{path.name}#{number}", raw
    finally:
        log.close()


def _topic_translator(cfg: Any, max_event_bytes: int, timeout_s: float) -> Any:
    """The service's translator; Confluent framings ask the [schema_registry] (each look-up bounded by the
    smaller of its ``timeout`` and ``--timeout``)."""
    from dataclasses import replace

    from rankwatch.consumers.decoding import translator_of
    from rankwatch.consumers.registry import SchemaRegistry

    registry = None
    if any(spec.confluent for spec in cfg.formats.values()):
        settings = cfg.schema_registry
        registry = SchemaRegistry(replace(settings, timeout=min(settings.timeout, timeout_s)))
    return translator_of(cfg.events, cfg.formats, None if registry is None else registry.schema_of, max_event_bytes)


def _topic_values(cfg: Any, topic: str | None, limit: int, timeout_s: float) -> Generator[tuple[str, bytes], None, None]:
    """The first ``limit`` records of ``topic`` (all partitions, from the earliest offset), within ``timeout_s``."""
    from kafka import KafkaConsumer, TopicPartition

    from rankwatch.consumers.connect import check_connection, fatal

    ms = int(timeout_s * 1000)
    client = cfg.kafka.client_kwargs()  # [kafka] and [kafka.security], as rankwatch run connects
    servers = ",".join(cfg.kafka.bootstrap_servers)
    try:
        check_connection(client, timeout_s)  # a wrong password or an untrusted CA: one line naming it
        consumer = KafkaConsumer(**client, group_id=None, enable_auto_commit=False,
                                 request_timeout_ms=max(ms, 1000) + 500,
                                 consumer_timeout_ms=ms)
    except RankwatchError:
        raise
    except Exception as e:  # noqa: BLE001 - unreachable, timed out, refused: one line
        named = fatal(e, client)
        if isinstance(named, RankwatchError):
            raise named from None
        raise RankwatchError(f"inspect: cannot reach Kafka at {servers}: {' '.join(str(e).split()) or type(e).__name__}"
                             ) from None
    try:
        deadline = time.monotonic() + timeout_s
        parts = None
        while parts is None and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic)  # metadata; None until known
            if parts is None:
                consumer.poll(timeout_ms=100)
        if not parts:
            raise RankwatchError(f"inspect: topic {topic!r} not found within {timeout_s:g} s")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        n = 0
        while n < limit and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)), max_records=limit - n)
            for tp in sorted(batch, key=lambda t: t.partition):
                for rec in batch[tp]:
                    if n < limit:
                        yield f"{tp.topic}/{tp.partition}@{rec.offset}", rec.value or b""
                        n += 1
    finally:
        consumer.close(autocommit=False, timeout_ms=1000)


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, show_lines=True)
    for c in ("source", "event (as read)", "section 1 event / rejection"):
        table.add_column(c, overflow="fold")
    for r in rows:
        result = ("\n".join(json.dumps(e, separators=(",", ":")) for e in r["events"]) if "events" in r
                  else f"rejected: {r['rejected']} ({r['detail']})")
        table.add_row(r["source"], r["raw"][:400], result)
    Console(width=160).print(table)
