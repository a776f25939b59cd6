"""consumers.registry against a stub of the ccompat API on a local port: errors sorted, bounded, cached.

The stub answers like Confluent / Apicurio do (``GET /schemas/ids/{id}`` with ``schemaType``; 404 with
``error_code`` 40403); the real Apicurio is exercised in test_registry.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rankwatch.consumers.registry import RegistryRefused, RegistrySettings, SchemaRegistry
from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import RegistryUnavailable, UnknownSchema
from rankwatch.pipeline.events.formats.avro import ConfluentAvroDecoder, ConfluentAvroEncoder, parse_schema

SCHEMA = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})


class Stub(BaseHTTPRequestHandler):
    schemas: dict[int, tuple[str, str]] = {1: (SCHEMA, "AVRO"), 2: ('syntax = "proto3"; message M {}', "PROTOBUF")}
    status_for: dict[int, int] = {}  # id -> forced status
    auth: str | None = None
    requests: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self.requests.append(self.path)
        if self.auth is not None and self.headers.get("Authorization") != self.auth:
            return self._send(401, {"error_code": 401, "message": "Unauthorized"})
        if self.path.startswith("/subjects"):
            return self._send(200, [])  # type: ignore[arg-type]
        schema_id = int(self.path.split("/")[3].split("?")[0])
        if schema_id in self.status_for:
            return self._send(self.status_for[schema_id], {"error_code": 50001, "message": "boom\nsecond line"})
        if schema_id not in self.schemas:
            return self._send(404, {"error_code": 40403, "message": f"Schema {schema_id} not found"})
        text, kind = self.schemas[schema_id]
        body = {"schema": text} if kind == "AVRO" else {"schema": text, "schemaType": kind}
        self._send(200, body)


@pytest.fixture
def stub() -> Iterator[str]:
    Stub.requests, Stub.status_for, Stub.auth = [], {}, None
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_schemas_are_fetched_once_and_typed(stub: str) -> None:
    registry = SchemaRegistry(RegistrySettings(stub, timeout=2))
    decoder = ConfluentAvroDecoder(registry.schema_of("AVRO"))
    raw = ConfluentAvroEncoder(1, parse_schema(SCHEMA)).encode({"a": 2**40})
    assert [decoder.decode(raw) for _ in range(3)] == [{"a": 2**40}] * 3
    assert registry.schema(2).schema_type == "PROTOBUF"
    assert Stub.requests.count("/schemas/ids/1") == 1


def test_unknown_ids_and_wrong_types_are_unknown_schema_and_misses_are_remembered(stub: str) -> None:
    now = [0.0]
    registry = SchemaRegistry(RegistrySettings(stub, timeout=2), clock=lambda: now[0], miss_ttl=30)
    for _ in range(3):
        with pytest.raises(UnknownSchema):
            registry.schema(9)
    assert Stub.requests.count("/schemas/ids/9") == 1
    Stub.schemas = {**Stub.schemas, 9: (SCHEMA, "AVRO")}
    now[0] = 31.0
    assert registry.schema(9).text == SCHEMA  # registered meanwhile: found after the miss expired
    with pytest.raises(UnknownSchema) as err:
        registry.schema_of("AVRO")(2)
    assert "PROTOBUF" in err.value.detail
    with pytest.raises(UnknownSchema):
        registry.schema(2**31)  # never asked: not an id
    assert not any("2147483648" in r for r in Stub.requests)


def test_5xx_is_an_outage_not_bad_input(stub: str) -> None:
    Stub.status_for = {1: 503}
    registry = SchemaRegistry(RegistrySettings(stub, timeout=2))
    with pytest.raises(RegistryUnavailable) as err:
        registry.schema(1)
    assert "503" in str(err.value) and stub in str(err.value) and "\n" not in str(err.value)
    Stub.status_for = {}
    assert registry.schema(1).schema_type == "AVRO"  # nothing remembered from the outage


def test_refused_connection_is_an_outage() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    decoder = ConfluentAvroDecoder(SchemaRegistry(RegistrySettings(url, timeout=1)).schema_of("AVRO"))
    with pytest.raises(RegistryUnavailable) as err:
        decoder.decode(b"\x00\x00\x00\x00\x01\x02")
    assert url in str(err.value)


def test_a_registry_that_never_answers_is_an_outage_after_the_timeout() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections, never answers
    try:
        registry = SchemaRegistry(RegistrySettings(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=0.5))
        with pytest.raises(RegistryUnavailable) as err:
            registry.schema(1)
        assert "Timeout" in str(err.value)
    finally:
        listener.close()


def test_basic_auth_from_the_password_file_and_refusal_names_the_keys(stub: str, tmp_path: Path) -> None:
    import base64

    Stub.auth = "Basic " + base64.b64encode(b"rankwatch:s3cret-pw").decode()
    secret = tmp_path / "registry.password"
    secret.write_text("s3cret-pw\n")
    good = RegistrySettings(stub, "rankwatch", secret, 2)
    SchemaRegistry(good).check()
    assert SchemaRegistry(good).schema(1).schema_type == "AVRO"
    secret.write_text("wrong\n")
    registry = SchemaRegistry(good)
    with pytest.raises(RegistryRefused) as err:
        registry.schema(1)
    assert "basic_auth_password_file" in str(err.value) and "wrong" not in str(err.value)
    assert "wrong" not in repr(registry)
    with pytest.raises(RegistryRefused):
        registry.check()


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({}, "schema_registry.url"),
        ({"url": "ftp://x"}, "not an http(s) URL"),
        ({"url": "http://u:pw@h:1"}, "basic_auth_user"),
        ({"url": "http://h:1", "basic_auth_user": "u"}, "basic_auth_password_file"),
        ({"url": "http://h:1", "timeout": 0}, "timeout"),
        ({"url": "http://h:1", "timout": 3}, "timout"),
    ],
)
def test_bad_settings_are_one_line_config_errors(table: dict, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        RegistrySettings.from_table(table)
    assert says in str(err.value) and "\n" not in str(err.value) and "pw" not in str(err.value)


def test_an_unreadable_password_file_is_a_config_error(tmp_path: Path) -> None:
    settings = RegistrySettings.from_table(
        {"url": "http://h:1", "basic_auth_user": "u", "basic_auth_password_file": str(tmp_path / "none")}
    )
    with pytest.raises(ConfigError) as err:
        SchemaRegistry(settings)
    assert "basic_auth_password_file" in str(err.value) and "none" in str(err.value)
