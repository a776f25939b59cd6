"""A team's shape for the format tests: the nested list config (SPEC section 6), its Avro schemas and a
Protobuf descriptor set (built in code, no protoc), and section 1 events written in it.

Importable by name (tests/pipeline is put on sys.path by the tests that use it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVENTS_TOML = """
[events.impressions.fields]
event_id = "meta.id"
request_id = "req.id"
ts = { path = "meta.sent_at", unit = "s" }
user_id = "user.id"
segment = { path = "user.tier", map = { N = "new_user", R = "returning", P = "power_user" } }
surface = "req.page"
variant = "exp.arm"
model = "ranker"
items = "results"
item_id = "sku"
position = { path = "rank", base = 0 }
score = "s"

[events.clicks.fields]
event_id = "click.id"
request_id = "click.req"
item_id = "click.sku"
ts = { path = "click.at", unit = "rfc3339" }
action = { path = "kind", map = { CLICK = "click", CART = "add_to_cart", BUY = "purchase" } }
grade = "level"
"""


def _opt(name: str, kind: Any) -> dict[str, Any]:
    return {"name": name, "type": ["null", kind], "default": None}


IMPRESSION_AVRO = {
    "type": "record", "name": "Impression", "namespace": "shop", "fields": [
        {"name": "meta", "type": {"type": "record", "name": "Meta", "fields": [
            {"name": "id", "type": "string"}, {"name": "sent_at", "type": "double"}]}},
        {"name": "req", "type": {"type": "record", "name": "Req", "fields": [
            {"name": "id", "type": "string"}, _opt("page", "string")]}},
        _opt("user", {"type": "record", "name": "User", "fields": [_opt("id", "string"), _opt("tier", "string")]}),
        _opt("exp", {"type": "record", "name": "Exp", "fields": [_opt("arm", "string")]}),
        _opt("ranker", "string"),
        {"name": "results", "type": {"type": "array", "items": {"type": "record", "name": "Result", "fields": [
            {"name": "sku", "type": "string"}, {"name": "rank", "type": "int"}, {"name": "s", "type": "double"}]}}},
    ],
}
CLICK_AVRO = {
    "type": "record", "name": "Click", "namespace": "shop", "fields": [
        {"name": "click", "type": {"type": "record", "name": "ClickRef", "fields": [
            {"name": "id", "type": "string"}, {"name": "req", "type": "string"}, {"name": "sku", "type": "string"},
            {"name": "at", "type": "string"}]}},
        {"name": "kind", "type": "string"},
        _opt("level", "int"),
    ],
}
AVRO = {"impressions": IMPRESSION_AVRO, "clicks": CLICK_AVRO}


def write_avsc(folder: Path) -> dict[str, Path]:
    out = {}
    for stream, schema in AVRO.items():
        out[stream] = folder / f"{stream}.avsc"
        out[stream].write_text(json.dumps(schema))
    return out


def team_records(stream: str, values: list[bytes]) -> list[dict[str, Any]]:
    """The section 1 events ``values`` written in the nested shape (one record each)."""
    import tomllib

    from rankwatch.pipeline.events.mapping import EventMapping
    from rankwatch.pipeline.events.reverse import reverser

    reverse = reverser(EventMapping.from_tables(tomllib.loads(EVENTS_TOML)["events"]), stream)
    return [r for v in values for r in reverse(json.loads(v))]


def descriptor_set(path: Path) -> Path:
    """shop/team.proto (proto3) with Impression and Click messages of the nested shape, as
    ``protoc --include_imports --descriptor_set_out`` writes it."""
    from google.protobuf import descriptor_pb2

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="shop/team.proto", package="shop.team", syntax="proto3")

    def msg(name: str, fields: list[tuple[str, int, str | None]], into: Any = fdp.message_type) -> Any:
        m = into.add(name=name)
        for number, (fname, ftype, type_name) in enumerate(fields, start=1):
            f = m.field.add(name=fname, number=number, label=F.LABEL_OPTIONAL, type=ftype)
            if type_name:
                f.type_name = type_name
            if fname == "results":
                f.label = F.LABEL_REPEATED
            elif ftype != F.TYPE_MESSAGE and (name, fname) in OPTIONAL:  # proto3 `optional`: has presence
                f.proto3_optional = True
                f.oneof_index = len(m.oneof_decl)
                m.oneof_decl.add(name=f"_{fname}")
        return m

    OPTIONAL = {("Impression", "ranker"), ("Req", "page"), ("User", "id"), ("User", "tier"), ("Exp", "arm"),
                ("Click", "level")}
    S, D, I32, MSG = F.TYPE_STRING, F.TYPE_DOUBLE, F.TYPE_INT32, F.TYPE_MESSAGE
    msg("Impression", [("meta", MSG, ".shop.team.Meta"), ("req", MSG, ".shop.team.Req"), ("user", MSG, ".shop.team.User"),
                       ("exp", MSG, ".shop.team.Exp"), ("ranker", S, None), ("results", MSG, ".shop.team.Result")])
    msg("Meta", [("id", S, None), ("sent_at", D, None)])
    msg("Req", [("id", S, None), ("page", S, None)])
    msg("User", [("id", S, None), ("tier", S, None)])
    msg("Exp", [("arm", S, None)])
    msg("Result", [("sku", S, None), ("rank", I32, None), ("s", D, None)])
    msg("ClickRef", [("id", S, None), ("req", S, None), ("sku", S, None), ("at", S, None)])
    msg("Click", [("click", MSG, ".shop.team.ClickRef"), ("kind", S, None), ("level", I32, None)])
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.append(fdp)
    path.write_bytes(fds.SerializeToString())
    return path
