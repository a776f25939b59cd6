"""Avro object container files (``.avro``, the schema inside) as event logs for replay and inspect.

Layout: :class:`ContainerSchemas` gives each distinct writer schema of the files a local id;
:class:`AvroLogFile` reads one file in chunks like :class:`pipeline.events.logs.LogFile` reads JSONL, and
hands over each record as its datum bytes behind a 5-byte Confluent-style header naming the local id. The
stream's decoder is then :class:`~pipeline.events.formats.avro.ConfluentAvroDecoder` over
:meth:`ContainerSchemas.schema_of`: no registry is asked.

Why bytes and not records: the merge, the translator, digest ids and dead letters all work on bytes. The
datum is exactly what the file holds for the record, so a byte-identical record (a resend) gives the same
digest id and anything else does not, and a record the mapping rejects is dead-lettered as its datum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fastavro
import numpy as np

from rankwatch.pipeline.errors import RankwatchError
from rankwatch.pipeline.events.formats import UnknownSchema
from rankwatch.pipeline.events.formats.avro import parse_schema
from rankwatch.pipeline.events.formats.framing import frame_confluent

STREAM_ORDER = {"impressions": 0, "clicks": 1}
CHUNK_RECORDS = 20_000


class ContainerSchemas:
    """Local schema ids of the files' writer schemas (one id per distinct schema text)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._texts: list[str] = []

    def id_of(self, text: str) -> int:
        if text not in self._ids:
            self._ids[text] = len(self._texts)
            self._texts.append(text)
        return self._ids[text]

    def schema_of(self, schema_id: int) -> str:
        if not 0 <= schema_id < len(self._texts):
            raise UnknownSchema(schema_id, f"no .avro file has local schema id {schema_id}")
        return self._texts[schema_id]


class AvroLogFile:
    """One ``.avro`` file read in chunks of records (the interface of :class:`pipeline.events.logs.LogFile`)."""

    def __init__(self, path: Path, stream: str, index: int, schemas: ContainerSchemas,
                 chunk_records: int = CHUNK_RECORDS) -> None:
        self.path, self.stream, self.index = path, stream, index
        self.order = STREAM_ORDER[stream]
        self.size = path.stat().st_size
        self.chunk_records = chunk_records
        self._raw = path.open("rb")
        try:
            self._blocks: Any = fastavro.block_reader(self._raw)
            text = self._blocks.metadata["avro.schema"]
            text = text.decode("utf-8") if isinstance(text, bytes) else text
            self._schema = parse_schema(text)
        except Exception as e:  # noqa: BLE001 - fastavro raises many types for a file that is not Avro
            self._raw.close()
            raise RankwatchError(f"{path}: not an Avro container file ({type(e).__name__}: {e})") from None
        self._header = frame_confluent(schemas.id_of(text), b"")
        self._block: Any = None
        self._left = 0  # records left in the current block
        self._next_number = 1
        self.done = False

    def read_chunk(self) -> tuple[list[bytes], np.ndarray]:
        """The next records as framed datum bytes, and their 1-based record numbers; empty at the end."""
        out: list[bytes] = []
        header, schema, reader = self._header, self._schema, fastavro.schemaless_reader
        while len(out) < self.chunk_records and not self.done:
            if self._left == 0:
                try:
                    block = next(self._blocks)
                except StopIteration:
                    self.done = True
                    break
                except Exception as e:  # noqa: BLE001
                    raise RankwatchError(f"{self.path}: damaged Avro block ({type(e).__name__}: {e})") from None
                self._block, self._left = block.bytes_, block.num_records
                continue
            data = self._block
            buf = data.getbuffer()
            try:
                while self._left and len(out) < self.chunk_records:
                    start = data.tell()
                    reader(data, schema, None)
                    out.append(header + bytes(buf[start:data.tell()]))
                    self._left -= 1
            except Exception as e:  # noqa: BLE001
                raise RankwatchError(f"{self.path}: damaged Avro record ({type(e).__name__}: {e})") from None
            finally:
                del buf
        first = self._next_number
        self._next_number += len(out)
        return out, np.arange(first, first + len(out), dtype=np.int64)

    def position(self) -> int:
        return self._raw.tell() if not self._raw.closed else self.size

    def close(self) -> None:
        self._raw.close()


def is_container(path: Path) -> bool:
    """An ``.avro`` file (by name; its header is checked when it is opened)."""
    return path.suffix == ".avro"


def read_records(path: Path, limit: int) -> list[bytes]:
    """The first ``limit`` records of one file as framed datum bytes (``inspect --file``); the schema ids are
    those of a fresh :class:`ContainerSchemas` (id 0)."""
    log = AvroLogFile(path, "impressions", 0, ContainerSchemas(), chunk_records=limit)
    try:
        return log.read_chunk()[0][:limit]
    finally:
        log.close()


__all__ = ["AvroLogFile", "ContainerSchemas", "is_container", "read_records"]
