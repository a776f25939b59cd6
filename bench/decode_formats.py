"""Benchmark of the foreign-format decoders: Avro and Protobuf bytes to record trees, against msgspec JSON.

Run: ``python bench/decode_formats.py [--events N] [--repeat R]``. Times are CPU time of this process
(``time.process_time``), medians over ``--repeat`` runs, and every row is measured in the same run on the
same impressions, so the ratios hold on any machine: the reference rows are msgspec decoding the section 1
JSON of the events into dicts (what the field mapping reads for JSON) and into the native typed structs
(what the native path decodes to, before validation).

Events: list-form impressions of 20 items from :mod:`pipeline.traffic.generator`, written as JSON, as Avro
datums (raw and Confluent-framed, schema from an in-memory ``schema_of``) and as Protobuf messages (raw and
Confluent-framed with message indexes), with the same field names. Decoding only: no mapping, no join.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402

from rankwatch.pipeline.events.formats.avro import (  # noqa: E402
    ConfluentAvroDecoder,
    ConfluentAvroEncoder,
    RawAvroDecoder,
    RawAvroEncoder,
    parse_schema,
)
from rankwatch.pipeline.events.formats.protobuf import (  # noqa: E402
    ConfluentProtobufDecoder,
    ConfluentProtobufEncoder,
    RawProtobufDecoder,
    RawProtobufEncoder,
)
from rankwatch.pipeline.events.validation import _IMPRESSION_DECODER  # noqa: E402
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_events  # noqa: E402

LABELS = ("user_id", "segment", "surface", "variant", "model")
AVRO_SCHEMA = {
    "type": "record", "name": "Impression", "namespace": "bench",
    "fields": [
        {"name": "event_id", "type": "string"}, {"name": "request_id", "type": "string"},
        {"name": "ts", "type": "long"},
        *({"name": n, "type": ["null", "string"], "default": None} for n in LABELS),
        {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
            {"name": "item_id", "type": "string"}, {"name": "position", "type": "int"},
            {"name": "score", "type": "double"}]}}},
    ],
}


def _proto_descriptor() -> object:
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/events.proto", package="bench", syntax="proto3")
    imp = fdp.message_type.add(name="Impression")
    item = imp.nested_type.add(name="Item")
    for number, (name, ftype) in enumerate(
        (("item_id", F.TYPE_STRING), ("position", F.TYPE_INT32), ("score", F.TYPE_DOUBLE)), 1
    ):
        item.field.add(name=name, number=number, type=ftype, label=F.LABEL_OPTIONAL)
    imp.field.add(name="event_id", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    imp.field.add(name="request_id", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    imp.field.add(name="ts", number=3, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    for i, name in enumerate(LABELS):
        imp.oneof_decl.add(name=f"_{name}")
        imp.field.add(name=name, number=4 + i, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL,
                      proto3_optional=True, oneof_index=i)
    imp.field.add(name="items", number=20, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                  type_name=".bench.Impression.Item")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return pool.FindMessageTypeByName("bench.Impression")


def build_impressions(n: int) -> list[dict]:
    """``n`` list-form impressions (ts as epoch ms), replicated with fresh ids from a generated base."""
    cfg = TrafficConfig(seed=7, start=datetime(2026, 11, 30, tzinfo=UTC), requests_per_second=2_000,
                        duration_s=min(n, 5_000) / 2_000)
    base = []
    for e in generate_events(cfg):
        if e.stream != "impressions":
            continue
        try:
            doc = json.loads(e.value)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("items"), list) and isinstance(doc.get("event_id"), str):
            doc["ts"] = e.ts_ms
            base.append({k: doc[k] for k in ("event_id", "request_id", "ts", *LABELS, "items") if k in doc})
    out = []
    for c in range(-(-n // len(base))):
        for doc in base:
            out.append(dict(doc, event_id=f"{c}-{doc['event_id']}", request_id=f"{c}-{doc['request_id']}"))
    return out[:n]


def _rate(decode: Callable[[bytes], object], payloads: list[bytes], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        for raw in payloads:
            decode(raw)
        times.append(time.process_time() - start)
    return len(payloads) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    docs = build_impressions(args.events)
    avro = parse_schema(AVRO_SCHEMA)
    proto = _proto_descriptor()
    json_bytes = [msgspec.json.encode(d) for d in docs]
    avro_raw = [RawAvroEncoder(avro).encode(d) for d in docs]
    avro_cf = [ConfluentAvroEncoder(1, avro).encode(d) for d in docs]
    pb_raw = [RawProtobufEncoder(proto).encode(d) for d in docs]  # type: ignore[arg-type]
    pb_cf = [ConfluentProtobufEncoder(1, proto).encode(d) for d in docs]  # type: ignore[arg-type]
    assert RawAvroDecoder(avro).decode(avro_raw[0]) == docs[0]
    schema_text = json.dumps(AVRO_SCHEMA)
    rows = [
        ("json -> dict (msgspec, reference)", msgspec.json.Decoder().decode, json_bytes),
        ("json -> native structs (msgspec)", _IMPRESSION_DECODER.decode, json_bytes),
        ("avro raw datum", RawAvroDecoder(avro).decode, avro_raw),
        ("avro confluent", ConfluentAvroDecoder(lambda i: schema_text).decode, avro_cf),
        ("protobuf raw", RawProtobufDecoder(proto).decode, pb_raw),  # type: ignore[arg-type]
        ("protobuf confluent", ConfluentProtobufDecoder(proto, lambda i: "").decode, pb_cf),  # type: ignore[arg-type]
    ]
    sizes = {"json": json_bytes, "avro": avro_raw, "protobuf": pb_raw}
    print(f"{len(docs)} list-form impressions of {len(docs[0]['items'])} items; "
          + ", ".join(f"{k} {sum(map(len, v)) / len(v):.0f} B/event" for k, v in sizes.items()))
    reference = None
    print(f"{'decoder':36s} {'events/s':>10s} {'x json->dict':>13s}")
    for name, decode, payloads in rows:
        rate = _rate(decode, payloads, args.repeat)
        reference = reference or rate
        print(f"{name:36s} {rate:10,.0f} {rate / reference:13.2f}")


if __name__ == "__main__":
    main()
