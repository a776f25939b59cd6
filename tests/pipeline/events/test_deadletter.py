"""Dead-letter sinks keep the raw bytes and the reason; JSONL round-trips text and binary."""

from __future__ import annotations

import base64
import json

from rankwatch.pipeline.events.deadletter import DeadLetter, JsonlDeadLetterSink, ListDeadLetterSink
from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import RejectReason


def test_list_sink_keeps_letters():
    sink = ListDeadLetterSink()
    letter = DeadLetter("clicks", b"{", RejectReason.invalid_json, "truncated", SourceRef("clicks", 3, 99))
    sink.send(letter)
    assert sink.letters == [letter]


def test_jsonl_sink_text_and_binary(tmp_path):
    path = tmp_path / "dead.jsonl"
    binary = b"\xff\xfe\x00garbage"
    with JsonlDeadLetterSink(path) as sink:
        sink.send(DeadLetter("impressions", '{"ü": 1'.encode(), RejectReason.invalid_json, "d1", None))
        sink.send(DeadLetter("clicks", binary, RejectReason.invalid_utf8, "d2", SourceRef("clicks", 1, 7)))
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert lines[0] == {"stream": "impressions", "reason": "invalid_json", "detail": "d1", "raw": '{"ü": 1',
                        "raw_encoding": "utf-8"}
    assert lines[1]["raw_encoding"] == "base64" and base64.b64decode(lines[1]["raw"]) == binary
    assert lines[1]["source"] == {"topic": "clicks", "partition": 1, "offset": 7}
    assert sink.count == 2
    with JsonlDeadLetterSink(path) as sink:  # appends
        sink.send(DeadLetter("clicks", b"x", RejectReason.bad_type, "d3"))
    assert len(path.read_text().splitlines()) == 3
