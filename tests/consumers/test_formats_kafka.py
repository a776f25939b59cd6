"""Confluent-framed Avro and Protobuf topics through ``rankwatch run`` against a real broker and a real
Apicurio Registry: the same windows as the offline oracle of the same events; and a registry that goes
away mid-run (a TCP proxy in front of it refuses connections, so the in-memory registry keeps its
schemas) holds the records until it is back: one log line, no dead letter, the windows still exact."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastavro")
pytest.importorskip("confluent_kafka.schema_registry")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from foreign_shapes import AVRO, EVENTS_TOML, descriptor_set, team_records  # noqa: E402
from kafka_helpers import (  # noqa: E402
    past_first_close,
    produce_to,
    start_run,
    stop_run,
    wait_consuming,
    wait_for,
    write_config,
)
from kafka_oracle import expected_windows  # noqa: E402
from test_registry import registry_url  # noqa: E402,F401  (the module's registry fixture)
from test_service_kafka import WINDOWS, _assert_matches, _create, _traffic, _windows_by_identity  # noqa: E402

from rankwatch.consumers.producer import window_closers  # noqa: E402
from rankwatch.consumers.registry import RegistrySettings, SchemaRegistry  # noqa: E402
from rankwatch.pipeline.events.formats.avro import ConfluentAvroEncoder, parse_schema  # noqa: E402
from rankwatch.pipeline.events.formats.protobuf import ConfluentProtobufEncoder, load_message  # noqa: E402
from rankwatch.pipeline.traffic.generator import generate_with_truth  # noqa: E402

pytestmark = [pytest.mark.kafka, pytest.mark.schema_registry]
PROTO = """syntax = "proto3";
package shop.team;
message Impression { Meta meta = 1; Req req = 2; User user = 3; Exp exp = 4; optional string ranker = 5;
  repeated Result results = 6; }
message Meta { string id = 1; double sent_at = 2; }
message Req { string id = 1; optional string page = 2; }
message User { optional string id = 1; optional string tier = 2; }
message Exp { optional string arm = 1; }
message Result { string sku = 1; int32 rank = 2; double s = 3; }
message ClickRef { string id = 1; string req = 2; string sku = 3; string at = 4; }
message Click { ClickRef click = 1; string kind = 2; optional int32 level = 3; }
"""


class Proxy:
    """A TCP proxy to the registry that can refuse connections (stop) and accept them again (start)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []

    def start(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            # close() alone leaves a thread blocked in accept() holding the listening socket: the next
            # client was still let through, and the "outage" lasted one refused request (0.2 s) instead of
            # the test's seconds. shutdown() wakes accept() and makes the port refuse at once.
            try:
                self._server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._server.close()
            self._server = None
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self._conns.clear()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            if server is not self._server:  # accepted while stopping: refused as a stopped registry would
                client.close()
                return
            try:  # a registry slow to accept must not end the proxy (the next client retries)
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)  # idle keep-alive connections stay open, as they do without the proxy
            self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass


def _config(tmp: Path, bootstrap: str, prefix: str, url: str, fmt: str) -> Path:
    config = write_config(tmp / "run.toml", bootstrap=bootstrap, prefix=prefix, checkpoint_interval="500ms")
    text = config.read_text().replace(f'clicks = "{prefix}-clk"', f'clicks = "{prefix}-clk"\ndead_letter = "{prefix}-dead"')
    head = {"avro": 'format = "avro"\nframing = "confluent"\n',
            "protobuf": 'format = "protobuf"\nframing = "confluent"\ndescriptor_set = "team.desc"\n'}[fmt]
    events = EVENTS_TOML.replace("[events.impressions.fields]", "[events.impressions]\n" + head + (
        'message = "shop.team.Impression"\n' if fmt == "protobuf" else "") + "\n[events.impressions.fields]")
    events = events.replace("[events.clicks.fields]", "[events.clicks]\n" + head + (
        'message = "shop.team.Click"\n' if fmt == "protobuf" else "") + "\n[events.clicks.fields]")
    descriptor_set(tmp / "team.desc")
    config.write_text(text + events + f'\n[schema_registry]\nurl = "{url}"\ntimeout = 1\n')
    return config


def _encoders(tmp: Path, url: str, fmt: str, subject: str) -> dict[str, Any]:
    registry = SchemaRegistry(RegistrySettings(url, timeout=10))
    if fmt == "avro":
        return {s: ConfluentAvroEncoder(registry.register(f"{subject}-{s}", json.dumps(AVRO[s])), parse_schema(AVRO[s]))
                for s in AVRO}
    schema_id = registry.register(f"{subject}-proto", PROTO, "PROTOBUF")
    desc = descriptor_set(tmp / "team.desc")
    return {"impressions": ConfluentProtobufEncoder(schema_id, load_message(desc, "shop.team.Impression")),
            "clicks": ConfluentProtobufEncoder(schema_id, load_message(desc, "shop.team.Click"))}


def _team_events(events: list[Any], encoders: dict[str, Any]) -> list[Any]:
    out = []
    for e in events:
        [record] = team_records(e.stream, [e.value])
        out.append(dataclasses.replace(e, value=encoders[e.stream].encode(record)))
    return out


def _closers(events: list[Any], partitions: int) -> list[Any]:
    last = max(e.ts_ms for e in events)
    return window_closers(partitions, last + 2 * 3_600_000, record_ts_ms=last + 1)


def _dead_letters(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=2000)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in parts]
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    finally:
        consumer.close()


@pytest.mark.parametrize("fmt", ["avro", "protobuf"])
def test_confluent_framed_topics_give_the_windows_of_the_same_events(
        kafka_broker: Any, unique: str, tmp_path: Path, registry_url: str, fmt: str) -> None:  # noqa: F811
    events, rows = generate_with_truth(_traffic(5, minutes=3, rate=6))
    _create(kafka_broker.bootstrap, unique, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = _config(tmp_path, kafka_broker.bootstrap, unique, registry_url, fmt)
    encoders = _encoders(tmp_path, registry_url, fmt, unique)
    produce_to(kafka_broker.bootstrap, unique, _team_events(events + _closers(events, 2), encoders))
    out, log = tmp_path / "w.jsonl", tmp_path / "run.log"
    proc = start_run(config, out, log)
    try:
        wait_for(lambda: set(want) <= set(_windows_by_identity(out)), timeout=300, what="all windows", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(out), want)
    assert _dead_letters(kafka_broker.bootstrap, f"{unique}-dead") == 0, log.read_text()[-3000:]


def test_a_registry_gone_mid_run_holds_the_records_and_loses_none(
        kafka_broker: Any, unique: str, tmp_path: Path, registry_url: str) -> None:  # noqa: F811
    from urllib.parse import urlsplit

    target = urlsplit(registry_url)
    proxy = Proxy((target.hostname or "127.0.0.1", target.port or 80))
    proxy.start()
    via_proxy = registry_url.replace(f":{target.port}", f":{proxy.port}")
    events, rows = generate_with_truth(_traffic(9, minutes=3, rate=6))
    _create(kafka_broker.bootstrap, unique, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = _config(tmp_path, kafka_broker.bootstrap, unique, via_proxy, "avro")
    first = _encoders(tmp_path, registry_url, "avro", unique)
    # The second half is written with schema ids the service has not seen: a second version of each schema
    # (one more optional field), registered under other subjects.
    second_schemas = {s: {**AVRO[s], "fields": [*AVRO[s]["fields"],
                                                {"name": "extra", "type": ["null", "string"], "default": None}]}
                      for s in AVRO}
    registry = SchemaRegistry(RegistrySettings(registry_url, timeout=10))
    second = {s: ConfluentAvroEncoder(registry.register(f"{unique}-v2-{s}-{uuid.uuid4().hex[:6]}",
                                                        json.dumps(second_schemas[s])), parse_schema(second_schemas[s]))
              for s in AVRO}
    half = past_first_close(events)  # the first part closes windows, whatever second the traffic starts at
    out, log = tmp_path / "w.jsonl", tmp_path / "run.log"
    proc = start_run(config, out, log)
    try:
        wait_consuming(log, 0, procs=(proc,))
        produce_to(kafka_broker.bootstrap, unique, _team_events(events[:half], first))
        wait_for(lambda: out.exists() and out.read_text().strip(), timeout=240, what="first windows", procs=(proc,),
                 log=log)
        proxy.stop()
        produce_to(kafka_broker.bootstrap, unique, _team_events(events[half:] + _closers(events, 2), second))
        wait_for(lambda: "unreachable (schema id" in log.read_text(), timeout=180, what="the outage logged",
                 procs=(proc,), log=log)
        time.sleep(2)  # the outage's length (a stimulus, not a wait for a condition): several refused retries
        proxy.start()
        wait_for(lambda: set(want) <= set(_windows_by_identity(out)), timeout=300, what="all windows", procs=(proc,),
                 log=log)
    finally:
        proxy.stop()
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert text.count("unreachable (schema id") == 1 and "reachable again after" in text, text[-3000:]
    # The premise: the records waited out the whole outage (the proxy refused for the 2 s stimulus).
    held = float(re.search(r"reachable again after ([0-9.]+) s", text).group(1))  # type: ignore[union-attr]
    assert held >= 1.5, text[-3000:]
    assert "Traceback" not in text
    _assert_matches(_windows_by_identity(out), want)
    assert _dead_letters(kafka_broker.bootstrap, f"{unique}-dead") == 0
