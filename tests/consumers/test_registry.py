"""Decoders + registry client against a real Apicurio Registry 3 (Confluent-compatible API, in memory).

The registry is started by deploy/schema-registry/local.sh on free ports for the module (and a second,
private one for the test that stops it); ``RANKWATCH_TEST_SCHEMA_REGISTRY=http://host:port/apis/ccompat/v7``
uses a running registry instead (the stop test is then skipped). Bytes come from confluent-kafka's own
AvroSerializer / ProtobufSerializer, so the framing is the one producers really write.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka.schema_registry.avro")
pytest.importorskip("confluent_kafka.schema_registry.protobuf")

from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

from rankwatch.consumers.registry import RegistrySettings, SchemaRegistry, confluent_avro_encoder  # noqa: E402
from rankwatch.pipeline.events.formats import UNKNOWN_SCHEMA, DecodeError, RegistryUnavailable  # noqa: E402
from rankwatch.pipeline.events.formats.avro import ConfluentAvroDecoder  # noqa: E402
from rankwatch.pipeline.events.formats.framing import frame_confluent  # noqa: E402
from rankwatch.pipeline.events.formats.protobuf import ConfluentProtobufDecoder  # noqa: E402

pytestmark = pytest.mark.schema_registry

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SH = ROOT / "deploy" / "schema-registry" / "local.sh"

AVRO = {
    "type": "record", "name": "Impression", "namespace": "shop",
    "fields": [
        {"name": "req", "type": {"type": "record", "name": "Req", "fields": [
            {"name": "id", "type": "long"}, {"name": "page", "type": ["null", "string"], "default": None}]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "results", "type": {"type": "array", "items": {"type": "record", "name": "Result", "fields": [
            {"name": "sku", "type": "string"}, {"name": "rank", "type": "int"}, {"name": "s", "type": "double"}]}}},
    ],
}
AVRO_RECORD = {"req": {"id": 2**40, "page": None}, "at": 1_764_460_800_123,
               "results": [{"sku": "i-1", "rank": 0, "s": 0.91}, {"sku": "i-7", "rank": 1, "s": 0.5}]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """One local.sh registry on its own ports."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.env = {**os.environ, "SCHEMA_REGISTRY_PORT": str(self.port),
                    "SCHEMA_REGISTRY_MANAGEMENT_PORT": str(_free_port())}
        self.url = f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def sh(self, command: str, timeout: float = 180) -> None:
        done = subprocess.run([str(LOCAL_SH), command], env=self.env, capture_output=True, timeout=timeout)
        if done.returncode:
            pytest.fail(f"local.sh {command} failed: {done.stderr.decode(errors='replace')[-2000:]}")


def _start() -> Registry:
    if not LOCAL_SH.exists():
        pytest.skip("deploy/schema-registry/local.sh is not in this checkout")
    registry = Registry()
    registry.sh("fetch", timeout=900)
    registry.sh("start")
    return registry


@pytest.fixture(scope="module")
def registry_url() -> Iterator[str]:
    external = os.environ.get("RANKWATCH_TEST_SCHEMA_REGISTRY")
    if external:
        yield external
        return
    registry = _start()
    try:
        yield registry.url
    finally:
        registry.sh("clean")


def _ctx(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def test_avro_from_confluents_serializer_decodes_through_the_registry(registry_url: str) -> None:
    topic = "imp-" + uuid.uuid4().hex[:8]
    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    raw = AvroSerializer(client, json.dumps(AVRO))(AVRO_RECORD, _ctx(topic))
    assert raw is not None and raw[0] == 0
    registry = SchemaRegistry(RegistrySettings(registry_url, timeout=5))
    decoder = ConfluentAvroDecoder(registry.schema_of("AVRO"))
    assert decoder.decode(raw) == AVRO_RECORD  # timestamp-millis as the long on the wire


def test_our_avro_encoder_is_read_by_confluents_deserializer(registry_url: str) -> None:
    registry = SchemaRegistry(RegistrySettings(registry_url, timeout=5))
    encoder = confluent_avro_encoder(registry, "enc-" + uuid.uuid4().hex[:8] + "-value", json.dumps(AVRO))
    raw = encoder.encode(AVRO_RECORD)
    decoded = AvroDeserializer(SchemaRegistryClient({"url": registry_url, "timeout": 10}))(raw, _ctx("x"))
    assert decoded["req"] == AVRO_RECORD["req"] and decoded["results"] == AVRO_RECORD["results"]
    assert ConfluentAvroDecoder(registry.schema_of("AVRO")).decode(raw) == AVRO_RECORD


def _proto_classes() -> tuple[object, object]:
    """events.proto: message Envelope {string note = 1;} message Impression { message Result {...} ... }"""
    F = descriptor_pb2.FieldDescriptorProto
    name = f"rw_{uuid.uuid4().hex[:8]}/events.proto"  # a fresh file per run: the registry is shared
    fdp = descriptor_pb2.FileDescriptorProto(name=name, package="shop.rw", syntax="proto3")
    env = fdp.message_type.add(name="Envelope")
    env.field.add(name="note", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    imp = fdp.message_type.add(name="Impression")
    res = imp.nested_type.add(name="Result")
    res.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    res.field.add(name="rank", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    imp.field.add(name="request_id", number=1, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    imp.field.add(name="results", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                  type_name=".shop.rw.Impression.Result")
    imp.field.add(name="page", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, proto3_optional=True,
                  oneof_index=0)
    imp.oneof_decl.add(name="_page")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("shop.rw.Impression")), get(
        pool.FindMessageTypeByName("shop.rw.Impression.Result"))


def test_protobuf_from_confluents_serializer_decodes_with_message_indexes(registry_url: str) -> None:
    impression, result = _proto_classes()
    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    serializer = ProtobufSerializer(impression, client, {"use.deprecated.format": False})
    msg = impression(request_id=2**53 + 1, results=[result(sku="i-1", rank=0)])  # type: ignore[operator]
    raw = serializer(msg, _ctx("pb-" + uuid.uuid4().hex[:8]))
    assert raw is not None and raw[5:7] == b"\x02\x02"  # message indexes [1]: the second top-level message
    registry = SchemaRegistry(RegistrySettings(registry_url, timeout=5))
    decoder = ConfluentProtobufDecoder(impression.DESCRIPTOR, registry.schema_of("PROTOBUF"))  # type: ignore[attr-defined]
    assert decoder.decode(raw) == {"request_id": 2**53 + 1, "results": [{"sku": "i-1", "rank": 0}]}
    with pytest.raises(DecodeError) as err:  # an Avro decoder on a Protobuf id: the type is checked
        ConfluentAvroDecoder(registry.schema_of("AVRO")).decode(raw)
    assert err.value.reason == UNKNOWN_SCHEMA


def test_an_id_the_registry_does_not_have_is_unknown_schema(registry_url: str) -> None:
    registry = SchemaRegistry(RegistrySettings(registry_url, timeout=5))
    raw = frame_confluent(2**31 - 2, b"\x02")
    for decoder in (ConfluentAvroDecoder(registry.schema_of("AVRO")),):
        with pytest.raises(DecodeError) as err:
            decoder.decode(raw)
        assert err.value.reason == UNKNOWN_SCHEMA and str(2**31 - 2) in err.value.detail


def test_a_stopped_registry_is_an_outage_and_cached_schemas_still_decode() -> None:
    if os.environ.get("RANKWATCH_TEST_SCHEMA_REGISTRY"):
        pytest.skip("uses a running registry it cannot stop")
    own = _start()
    try:
        client = SchemaRegistryClient({"url": own.url, "timeout": 10})
        first = AvroSerializer(client, json.dumps(AVRO))(AVRO_RECORD, _ctx("a"))
        other = dict(AVRO, name="Other")
        second = AvroSerializer(client, json.dumps(other))(AVRO_RECORD, _ctx("b"))
        assert first is not None and second is not None and first[1:5] != second[1:5]
        decoder = ConfluentAvroDecoder(SchemaRegistry(RegistrySettings(own.url, timeout=2)).schema_of("AVRO"))
        assert decoder.decode(first) == AVRO_RECORD
        own.sh("stop")
        assert decoder.decode(first) == AVRO_RECORD  # its schema is cached: no request
        with pytest.raises(RegistryUnavailable) as err:  # refused: not bad input, nothing to dead-letter
            decoder.decode(second)
        assert f"127.0.0.1:{own.port}" in str(err.value)
    finally:
        own.sh("clean")
