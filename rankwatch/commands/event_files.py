"""Event files in the config's schema, for ``rankwatch replay --config`` and ``rankwatch inspect --file``.

Layout: :func:`file_translator` builds the translator of a config's ``[events.*]`` tables for files, and
the reader for each file: ``.jsonl`` / ``.jsonl.gz`` lines (:class:`pipeline.events.logs.LogFile`), or
``.avro`` object container files (:class:`pipeline.events.container_log.AvroLogFile`, the schema inside,
no registry asked). An Avro stream reads its ``.avro`` files with the files' own schemas whatever its
``framing`` says (that is about Kafka values); a Protobuf stream with ``framing = "confluent"`` asks the
``[schema_registry]`` as the service does.

Why here: replay and inspect must read a file exactly as the service reads the topic, decoders and
rejection reasons included, and a stream given an ``.avro`` file it cannot read is a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rankwatch.errors import ConfigError


def file_translator(cfg: Any, max_event_bytes: int, files: Sequence[tuple[Path, str]] = ()
                    ) -> tuple[Any, Callable[..., Any] | None]:
    """``(translator, opener)`` for ``files`` (``(path, stream)``) under ``cfg`` (a RunConfig).

    ``translator`` is None for a config that maps nothing; ``opener`` is None when no file is ``.avro``."""
    from rankwatch.consumers.decoding import build_decoder, rejecting
    from rankwatch.pipeline.events.container_log import AvroLogFile, ContainerSchemas, is_container
    from rankwatch.pipeline.events.logs import LogFile
    from rankwatch.pipeline.events.translate import translator_for

    containers = ContainerSchemas()
    decoders: dict[str, Any] = {}
    registry: Any = None
    for stream, spec in cfg.formats.items():
        if spec.format == "avro":
            from rankwatch.pipeline.events.formats.avro import ConfluentAvroDecoder

            decoders[stream] = rejecting(ConfluentAvroDecoder(containers.schema_of).decode, max_event_bytes)
        else:
            if spec.confluent and registry is None:
                from rankwatch.consumers.registry import SchemaRegistry

                registry = SchemaRegistry(cfg.schema_registry)
            decoders[stream] = build_decoder(spec, None if registry is None else registry.schema_of,
                                             max_event_bytes)
    for path, stream in files:
        spec = cfg.formats.get(stream)
        if spec is None or spec.format == "avro":
            if (spec is not None) != is_container(path):
                fmt = "avro" if spec is not None else "json"
                raise ConfigError(f"{path}: events.{stream}.format is {fmt!r}; "
                                  + ("Avro streams are replayed from .avro container files" if spec is not None
                                     else ".avro files need format = \"avro\""))
    translator = translator_for(cfg.events, max_event_bytes=max_event_bytes, decoders=decoders)
    if not any(is_container(p) for p, _ in files):
        return translator, None

    def opener(path: Path, stream: str, index: int, chunk_bytes: int) -> Any:
        if is_container(path):
            return AvroLogFile(path, stream, index, containers)
        return LogFile(path, stream, index, chunk_bytes)

    return translator, opener


def events_translator(config_file: str | None, max_event_bytes: int,
                      files: list[tuple[Path, str]] | None = None) -> tuple[Any, Any]:
    """``(translator, opener)`` of ``--config FILE``'s ``[events.*]`` tables and formats for ``files``
    (:func:`file_translator`); ``(None, None)`` without the option. ``translator`` is None for a
    config that maps nothing (section 1 lines read unchanged); ``opener`` reads ``.avro`` container files."""
    if config_file is None:
        return None, None
    from rankwatch.config import load_config

    return file_translator(load_config(config_file), max_event_bytes, files or [])  # type: ignore[no-any-return]
