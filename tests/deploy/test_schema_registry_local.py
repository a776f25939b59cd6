"""deploy/schema-registry/local.sh: a real Apicurio Registry 3 whose Confluent-compatible API serves Avro and
Protobuf schemas, confluent-kafka's SchemaRegistryClient and its Avro serdes (Confluent framing).

The ids checked here are the ones rankwatch's decoding will read from the wire (magic 0 + 4-byte schema id);
deploy/schema-registry/local.sh's header lists what Apicurio's ccompat API does differently from Confluent's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.consumers.kafka_helpers import free_port_run

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "schema-registry"
LOCAL_SH = HERE / "local.sh"
START_TIMEOUT = int(os.environ.get("SCHEMA_REGISTRY_START_TIMEOUT", "120"))

AVRO_EVENT = json.dumps({
    "type": "record", "name": "SearchEvent", "namespace": "rankwatch.test",
    "fields": [{"name": "query_id", "type": "string"}, {"name": "clicked_rank", "type": "int"}],
})
PROTO_DOC = 'syntax = "proto3";\npackage rankwatch.test;\n\nmessage Doc {\n  string id = 1;\n  double score = 2;\n}\n'
PROTO_RESULT = (
    'syntax = "proto3";\npackage rankwatch.test;\n\nimport "rankwatch/test/doc.proto";\n\n'
    "message Result {\n  string query_id = 1;\n  repeated Doc docs = 2;\n}\n"
)


def _sh(*args: str, port: int | None = None, timeout: float = 180,
        **extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if port is not None:
        env.update(SCHEMA_REGISTRY_PORT=str(port), SCHEMA_REGISTRY_MANAGEMENT_PORT=str(port + 1))
    env.update(extra)
    return subprocess.run([str(LOCAL_SH), *args], env=env, capture_output=True, text=True, timeout=timeout)


def _http(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json",
                                              "Accept": "application/vnd.schemaregistry.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_usage_and_status_of_a_stopped_registry() -> None:
    bad = _sh("bogus")
    assert bad.returncode == 2 and "usage" in bad.stderr
    port = free_port_run(2)
    status = _sh("status", port=port)
    assert status.returncode == 3 and "stopped" in status.stdout
    assert _sh("stop", port=port).returncode == 0  # stopping a stopped registry is fine


def test_start_without_a_java_21_fails_with_one_clear_line(tmp_path: Path) -> None:
    # SCHEMA_REGISTRY_JAVA_CANDIDATES replaces the scan (JAVA_HOME, /usr/lib/jvm/*, PATH): offer only a Java 17
    # (a stand-in printing what OpenJDK 17 prints, so the test does not depend on the machine's JDKs) and a
    # path that does not exist. Java is checked before anything else, so no fetch is needed.
    java17 = tmp_path / "jdk-17" / "bin" / "java"
    java17.parent.mkdir(parents=True)
    java17.write_text('#!/bin/sh\necho \'openjdk version "17.0.15" 2025-04-15\' >&2\n')
    java17.chmod(0o755)
    port = free_port_run(2)
    out = _sh("start", port=port, timeout=60,
              SCHEMA_REGISTRY_JAVA_CANDIDATES=f"{java17} {tmp_path / 'missing' / 'java'}")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "needs Java 21 or newer" in lines[0] and f"{java17} (17)" in lines[0]
    assert not (HERE / "run" / str(port) / "registry.pid").exists()
    _sh("clean", port=port)


def test_no_script_step_needs_python() -> None:
    # Readiness is probed over bash's /dev/tcp, so the script works from any shell, like deploy/kafka/local.sh.
    text = LOCAL_SH.read_text(encoding="utf-8")
    code_lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code_lines if "python" in ln or "curl" in ln]


@pytest.fixture(scope="module")
def registry() -> Iterator[str]:
    """The ccompat base URL of a registry started by local.sh on a free port; stopped and removed at the end."""
    fetched = _sh("fetch", timeout=900)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    port = free_port_run(2)
    try:
        started = time.monotonic()
        up = _sh("start", port=port, timeout=START_TIMEOUT + 60)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"running on 127.0.0.1:{port}" in up.stdout
        print(f"schema registry ready after {time.monotonic() - started:.1f}s: {up.stdout.strip()}")
        again = _sh("start", port=port)
        assert again.returncode == 0 and "already running" in again.stdout
        assert _sh("status", port=port).returncode == 0
        yield f"http://127.0.0.1:{port}/apis/ccompat/v7"
        down = _sh("stop", port=port, timeout=90)
        assert down.returncode == 0 and "stopped" in down.stdout
        assert _sh("status", port=port).returncode == 3
    finally:
        _sh("clean", port=port, timeout=90)
    assert not (HERE / "run" / str(port)).exists()


@pytest.mark.schema_registry
def test_avro_and_protobuf_register_and_read_back_by_id(registry: str) -> None:
    status, avro = _http("POST", f"{registry}/subjects/http-events-value/versions", {"schema": AVRO_EVENT})
    assert status == 200 and isinstance(avro["id"], int) and avro["id"] > 0
    status, by_id = _http("GET", f"{registry}/schemas/ids/{avro['id']}")
    assert status == 200 and json.loads(by_id["schema"]) == json.loads(AVRO_EVENT)
    assert by_id.get("schemaType", "AVRO") == "AVRO"  # Avro: schemaType absent, as in Confluent

    # The id is per content (Apicurio's contentId), as in Confluent: the same text under another subject
    # gets the same id, and registering it again in its subject is the existing version.
    status, other = _http("POST", f"{registry}/subjects/http-other-value/versions", {"schema": AVRO_EVENT})
    assert status == 200 and other["id"] == avro["id"]
    status, same = _http("POST", f"{registry}/subjects/http-events-value/versions", {"schema": AVRO_EVENT})
    assert status == 200 and same["id"] == avro["id"]
    # Apicurio quirk (apicurio.ccompat.use-canonical-hash=false): ids come from the exact text. Re-formatted,
    # the schema is the existing version within its subject, but a new id under a new subject (Confluent
    # would reuse the id there too).
    pretty = json.dumps(json.loads(AVRO_EVENT), indent=2)
    status, within = _http("POST", f"{registry}/subjects/http-events-value/versions", {"schema": pretty})
    assert status == 200 and within["id"] == avro["id"]
    status, elsewhere = _http("POST", f"{registry}/subjects/http-pretty-value/versions", {"schema": pretty})
    assert status == 200 and elsewhere["id"] != avro["id"]

    status, proto = _http("POST", f"{registry}/subjects/http-docs-value/versions",
                          {"schema": PROTO_DOC, "schemaType": "PROTOBUF"})
    assert status == 200 and proto["id"] not in (avro["id"], elsewhere["id"])
    status, by_id = _http("GET", f"{registry}/schemas/ids/{proto['id']}")
    assert status == 200 and by_id["schemaType"] == "PROTOBUF" and by_id["schema"] == PROTO_DOC

    # A Protobuf schema importing another: the imported file is registered under its own subject (its import
    # path, percent-encoded in the URL because of the '/') and named in "references".
    dep_subject = "rankwatch/test/doc.proto"
    status, dep = _http("POST", f"{registry}/subjects/{quote(dep_subject, safe='')}/versions",
                        {"schema": PROTO_DOC, "schemaType": "PROTOBUF"})
    assert status == 200 and dep["id"] == proto["id"]
    refs = [{"name": dep_subject, "subject": dep_subject, "version": 1}]
    status, result = _http("POST", f"{registry}/subjects/http-results-value/versions",
                           {"schema": PROTO_RESULT, "schemaType": "PROTOBUF", "references": refs})
    assert status == 200, result
    status, by_id = _http("GET", f"{registry}/schemas/ids/{result['id']}")
    assert status == 200 and by_id["schemaType"] == "PROTOBUF" and by_id["schema"] == PROTO_RESULT
    assert by_id["references"] == refs

    status, subjects = _http("GET", f"{registry}/subjects")
    assert status == 200 and {"http-events-value", "http-docs-value", dep_subject} <= set(subjects)
    status, missing = _http("GET", f"{registry}/schemas/ids/{10**6}")
    assert status == 404 and missing["error_code"] == 40403


@pytest.mark.schema_registry
def test_confluent_kafka_schema_registry_client(registry: str) -> None:
    # confluent_kafka.schema_registry needs the "schemaregistry" extra (authlib, httpx, cachetools, attrs).
    sr = pytest.importorskip("confluent_kafka.schema_registry")
    client = sr.SchemaRegistryClient({"url": registry})
    avro_id = client.register_schema("client-events-value", sr.Schema(AVRO_EVENT, "AVRO"))
    status, by_http = _http("GET", f"{registry}/schemas/ids/{avro_id}")
    assert status == 200 and json.loads(by_http["schema"]) == json.loads(AVRO_EVENT)
    fetched = client.get_schema(avro_id)
    assert fetched.schema_type == "AVRO" and json.loads(fetched.schema_str) == json.loads(AVRO_EVENT)
    registered = client.lookup_schema("client-events-value", sr.Schema(AVRO_EVENT, "AVRO"))
    assert registered.schema_id == avro_id and registered.version == 1
    latest = client.get_latest_version("client-events-value")
    assert latest.schema_id == avro_id and latest.subject == "client-events-value"
    assert "client-events-value" in client.get_subjects()

    proto_id = client.register_schema("client-docs-value", sr.Schema(PROTO_DOC, "PROTOBUF"))
    assert proto_id != avro_id
    fetched = client.get_schema(proto_id)
    assert fetched.schema_type == "PROTOBUF" and fetched.schema_str == PROTO_DOC


@pytest.mark.schema_registry
def test_avro_serializer_round_trip_with_confluent_framing(registry: str) -> None:
    pytest.importorskip("fastavro")
    sr = pytest.importorskip("confluent_kafka.schema_registry")
    avro_serdes = pytest.importorskip("confluent_kafka.schema_registry.avro")
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = sr.SchemaRegistryClient({"url": registry})
    serializer = avro_serdes.AvroSerializer(client, AVRO_EVENT)  # auto-registers under "<topic>-value"
    deserializer = avro_serdes.AvroDeserializer(client)
    context = SerializationContext("serde-events", MessageField.VALUE)
    event = {"query_id": "q-1", "clicked_rank": 3}
    payload = serializer(event, context)
    assert payload is not None and payload[0] == 0  # magic byte
    schema_id = int.from_bytes(payload[1:5], "big")
    # The id on the wire is the one the ccompat API reports for the subject and serves by id.
    status, latest = _http("GET", f"{registry}/subjects/serde-events-value/versions/latest")
    assert status == 200 and latest["id"] == schema_id
    status, by_id = _http("GET", f"{registry}/schemas/ids/{schema_id}")
    assert status == 200 and json.loads(by_id["schema"])["name"] == "SearchEvent"
    assert deserializer(payload, context) == event
    # A second client (a fresh cache, as in another process) decodes it by id alone.
    fresh = avro_serdes.AvroDeserializer(sr.SchemaRegistryClient({"url": registry}))
    assert fresh(payload, context) == event
