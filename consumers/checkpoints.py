"""Checkpoints of a partition pair's streaming state in a compacted Kafka topic.

A checkpoint is the processor's ``snapshot()`` together with the next offsets of both input partitions.
It is written in chunks (a snapshot can be far larger than a Kafka record) to partition ``p`` of the
checkpoint topic for pair ``p``; every chunk's key is ``<pair>/<checkpoint id>/<chunk index>``, so a new
checkpoint never overwrites an older one. Which checkpoint is *the* checkpoint of a pair is decided by the
consumer group's committed offset: its metadata holds a :class:`CheckpointRef` (id, offset of the first
chunk, chunk count). Committing is fenced by the group generation, so a zombie's checkpoint can be written
but never becomes current. Superseded and orphaned checkpoints are deleted with tombstones (compaction).
docs/kafka.md has the whole argument.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaTimeoutError

CHUNK_BYTES = 512 * 1024
METADATA_PREFIX = "rankwatch-ckpt:"


class CheckpointError(RuntimeError):
    """A checkpoint the committed offsets point to cannot be read back."""


class CheckpointAborted(RuntimeError):
    """A write given up on request (``abort()`` turned true: the service is stopping); nothing committed."""


@dataclass(frozen=True)
class CheckpointRef:
    """Where one checkpoint lives: its id, the offset of chunk 0 in the pair's partition, the chunk count."""

    checkpoint_id: str
    offset: int
    chunks: int

    def to_metadata(self) -> str:
        body = json.dumps({"id": self.checkpoint_id, "at": self.offset, "n": self.chunks}, separators=(",", ":"))
        return METADATA_PREFIX + body

    @classmethod
    def from_metadata(cls, text: str | None) -> CheckpointRef | None:
        """The reference in a commit's metadata; None when the commit was not made by a checkpoint."""
        if not text or not text.startswith(METADATA_PREFIX):
            return None
        try:
            d = json.loads(text[len(METADATA_PREFIX):])
            return cls(str(d["id"]), int(d["at"]), int(d["n"]))
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back: the snapshot and the next offsets of the impressions and clicks partitions."""

    ref: CheckpointRef
    snapshot: bytes
    impressions_offset: int
    clicks_offset: int
    previous: CheckpointRef | None


@dataclass(frozen=True)
class SentCheckpoint:
    """A checkpoint handed to the producer (:meth:`CheckpointStore.send`), not yet acknowledged."""

    pair: int
    checkpoint_id: str
    futures: list[Any]


class _Chunk(msgspec.Struct, array_like=True):
    checkpoint_id: str
    index: int
    count: int
    impressions_offset: int
    clicks_offset: int
    previous: tuple[str, int, int] | None
    data: bytes


_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(_Chunk)


def _key(pair: int, checkpoint_id: str, index: int) -> bytes:
    return f"{pair}/{checkpoint_id}/{index}".encode()


class CheckpointStore:
    """Writes and reads chunked checkpoints of partition pairs in ``topic``."""

    def __init__(self, producer: Any, topic: str, client_kwargs: dict[str, Any], *, read_timeout_s: float = 60.0) -> None:
        self.producer = producer
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        self._client_kwargs = client_kwargs
        self._reader: KafkaConsumer | None = None

    # -- writing ---------------------------------------------------------------------------------------
    def write(
        self, pair: int, snapshot: bytes, *, impressions_offset: int, clicks_offset: int,
        previous: CheckpointRef | None, timeout_s: float = 60.0, abort: Callable[[], bool] = lambda: False,
    ) -> CheckpointRef:
        """Write a checkpoint and wait until every chunk is acknowledged (durable); returns its reference.

        Waits in 0.5 s slices, so a stop request (``abort()``) ends the wait within about that long
        (:class:`CheckpointAborted`); ``KafkaTimeoutError`` after ``timeout_s``.
        """
        sent = self.send(pair, snapshot, impressions_offset=impressions_offset, clicks_offset=clicks_offset,
                         previous=previous)
        return self.acknowledged(sent, timeout_s=timeout_s, abort=abort)

    def send(self, pair: int, snapshot: bytes, *, impressions_offset: int, clicks_offset: int,
             previous: CheckpointRef | None) -> SentCheckpoint:
        """The first half of :meth:`write`: hand every chunk to the producer, without waiting. Several pairs'
        checkpoints sent this way are acknowledged by one flush (one wait instead of one per pair)."""
        cid = uuid.uuid4().hex
        pieces = [snapshot[i:i + CHUNK_BYTES] for i in range(0, len(snapshot), CHUNK_BYTES)] or [b""]
        prev = None if previous is None else (previous.checkpoint_id, previous.offset, previous.chunks)
        futures = []
        for i, piece in enumerate(pieces):
            value = _ENC.encode(_Chunk(cid, i, len(pieces), impressions_offset, clicks_offset, prev, piece))
            futures.append(self.producer.send(self.topic, key=_key(pair, cid, i), value=value, partition=pair))
        return SentCheckpoint(pair, cid, futures)

    def acknowledged(self, sent: SentCheckpoint, *, timeout_s: float = 60.0,
                     abort: Callable[[], bool] = lambda: False) -> CheckpointRef:
        """The second half of :meth:`write`: wait until every chunk of ``sent`` is acknowledged."""
        deadline = time.monotonic() + timeout_s
        while not all(f.is_done for f in sent.futures):
            try:
                self.producer.flush(timeout=min(0.5, max(0.01, deadline - time.monotonic())))
                break
            except KafkaTimeoutError:
                if abort():
                    raise CheckpointAborted(f"checkpoint of pair {sent.pair} given up: stopping") from None
                if time.monotonic() >= deadline:
                    raise
        first = sent.futures[0].get(timeout=timeout_s)
        for f in sent.futures[1:]:
            f.get(timeout=timeout_s)  # raises if any chunk was refused
        return CheckpointRef(sent.checkpoint_id, int(first.offset), len(sent.futures))

    def delete(self, pair: int, ref: CheckpointRef) -> None:
        """Tombstone every chunk of ``ref`` (asynchronous; compaction removes them later)."""
        for i in range(ref.chunks):
            self.producer.send(self.topic, key=_key(pair, ref.checkpoint_id, i), value=None, partition=pair)

    # -- reading ---------------------------------------------------------------------------------------
    def _consumer(self) -> KafkaConsumer:
        if self._reader is None:
            self._reader = KafkaConsumer(
                **self._client_kwargs, enable_auto_commit=False, group_id=None,
                max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
            )
        return self._reader

    def read(self, pair: int, ref: CheckpointRef) -> tuple[Checkpoint, list[CheckpointRef]]:
        """The checkpoint ``ref`` of ``pair``, and every other checkpoint found after it (orphans to delete)."""
        consumer = self._consumer()
        tp = TopicPartition(self.topic, pair)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        if ref.offset >= end:
            raise CheckpointError(f"checkpoint {ref.checkpoint_id} of pair {pair} is past the end of {self.topic}")
        consumer.seek(tp, ref.offset)
        pieces: dict[int, _Chunk] = {}
        others: dict[str, int] = {}
        deadline = time.monotonic() + self.read_timeout_s
        position = ref.offset
        while position < end:
            if time.monotonic() > deadline:  # retriable: the broker is slow or away, the data may be there
                raise KafkaTimeoutError(f"timed out reading checkpoint {ref.checkpoint_id} of pair {pair}")
            batch = consumer.poll(timeout_ms=500, max_records=500)
            for record in batch.get(tp, []):
                position = record.offset + 1
                if record.value is None:
                    continue
                chunk = _DEC.decode(record.value)
                if not record.key or not record.key.startswith(f"{pair}/".encode()):
                    continue
                if chunk.checkpoint_id == ref.checkpoint_id:
                    pieces[chunk.index] = chunk
                else:
                    others[chunk.checkpoint_id] = chunk.count
        if len(pieces) != ref.chunks:
            raise CheckpointError(
                f"checkpoint {ref.checkpoint_id} of pair {pair}: {len(pieces)} of {ref.chunks} chunks found in {self.topic}"
            )
        first = pieces[0]
        snapshot = b"".join(pieces[i].data for i in range(ref.chunks))
        previous = None if first.previous is None else CheckpointRef(*first.previous)
        orphans = [CheckpointRef(cid, -1, n) for cid, n in others.items()]
        return Checkpoint(ref, snapshot, first.impressions_offset, first.clicks_offset, previous), orphans

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
