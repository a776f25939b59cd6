"""``rankwatch replay --config``: the golden messy traffic written in two foreign shapes (SPEC section 6)
gives exactly the windows, result, counts and reject reasons of plain replay on the section 1 events.

- Shape A, nested list: ``{"meta": {"id", "sent_at" (seconds)}, "req": {"id"}, "user": {"tier": code},
  "page", "results": [{"sku", "rank" (0-based), "s"}]}``; clicks ``{"click": {"id", "req", "sku", "at"
  (RFC 3339)}, "kind": CODE}``. Every event, bad lines included, keeps its meaning.
- Shape B, one event per item, microseconds, no event ids (digest ids): compared with the same events in
  section 1's item form. Duplicates are byte-identical resends in both; a ``"n"`` counter (ignored by the
  mapping) keeps distinct events distinct, as a producer's sequence number would.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))

from golden_traffic import messy_traffic  # noqa: E402

from rankwatch.cli import cli  # noqa: E402

SEG_CODES = {"new": "N", "ret": "R", "pow": "P"}
ACTION_CODES = {"click": "CLICK", "add_to_cart": "CART", "purchase": "BUY"}
CONFIG_A = """
[events.impressions.fields]
event_id = "meta.id"
request_id = "req.id"
ts = { path = "meta.sent_at", unit = "s" }
segment = { path = "user.tier", map = { N = "new", R = "ret", P = "pow" } }
surface = "page"
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
CONFIG_B = """
[events.impressions]
layout = "item"
[events.impressions.fields]
request_id = "rid"
ts = { path = "t_us", unit = "us" }
segment = "seg"
surface = "surf"
item_id = "sku"
position = "pos"
score = "sc"

[events.clicks.fields]
request_id = "rid"
item_id = "sku"
ts = { path = "t_us", unit = "us" }
action = "kind"
"""
INF = "__inf__"


def _ms(ts: Any) -> int | None:
    """Epoch ms of a section 1 ``ts`` (None when it is not one)."""
    if type(ts) is int:
        return ts
    if isinstance(ts, str):
        try:
            when = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return None
        return None if when.tzinfo is None else round(when.timestamp() * 1000)
    return None


def _dump(doc: Any) -> bytes:
    text = json.dumps(doc, separators=(",", ":"))
    return text.replace(f'"{INF}"', "1e999").encode()


def _load(raw: bytes) -> Any:
    try:
        return json.loads(raw, parse_constant=lambda c: INF)
    except (ValueError, RecursionError):
        return None


def _fix_score(v: Any) -> Any:
    return INF if v == float("inf") else v


def shape_a(stream: str, raw: bytes) -> bytes:
    doc = _load(raw)
    if type(doc) is not dict:
        return raw  # not an object: bad the same way in any shape
    rest = {k: v for k, v in doc.items() if k not in ("event_id", "request_id", "ts", "segment", "surface", "items",
                                                      "item_id", "position", "score", "action", "grade")}
    if stream == "clicks":
        click = {k2: doc[k] for k, k2 in (("event_id", "id"), ("request_id", "req"), ("item_id", "sku")) if k in doc}
        if "ts" in doc:
            ms = _ms(doc["ts"])
            click["at"] = (datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
                           if ms is not None and ms >= 0 and type(doc["ts"]) is int else doc["ts"])
        out: dict[str, Any] = {"click": click, **rest}
        if "action" in doc:
            out["kind"] = ACTION_CODES.get(doc["action"], doc["action"]) if isinstance(doc["action"], str) else doc["action"]
        if "grade" in doc:
            out["level"] = doc["grade"]
        return _dump(out)
    meta: dict[str, Any] = {}
    if "event_id" in doc:
        meta["id"] = doc["event_id"]
    if "ts" in doc:
        ms = _ms(doc["ts"])
        meta["sent_at"] = ms / 1000 if ms is not None else str(doc["ts"])
    out = {"meta": meta, **rest}
    if "request_id" in doc:
        out["req"] = {"id": doc["request_id"]}
    if "segment" in doc:
        out["user"] = {"tier": SEG_CODES.get(doc["segment"], doc["segment"])}
    if "surface" in doc:
        out["page"] = doc["surface"]
    items = doc.get("items")
    if items is None and "item_id" in doc:
        items = [{k: doc[k] for k in ("item_id", "position", "score") if k in doc}]
    if items is not None:
        out["results"] = [{"sku": it.get("item_id"), "rank": it["position"] - 1 if type(it.get("position")) is int
                           else it.get("position"), "s": _fix_score(it.get("score"))} for it in items]
    return _dump(out)


def item_form(stream: str, raw: bytes) -> list[bytes]:
    """A section 1 list impression as its item-form events (ids ``<event_id>.<k>``); anything else as is."""
    doc = _load(raw)
    if stream == "clicks" or type(doc) is not dict or not isinstance(doc.get("items"), list) or not doc["items"]:
        return [raw]
    head = {k: v for k, v in doc.items() if k != "items"}
    return [_dump({**head, "event_id": f"{head.get('event_id')}.{k}", **it}) for k, it in enumerate(doc["items"])]


def shape_b(stream: str, raw: bytes) -> bytes:
    doc = _load(raw)
    if type(doc) is not dict:
        return raw
    out: dict[str, Any] = {"n": doc.get("event_id")}
    for k, k2 in (("request_id", "rid"), ("segment", "seg"), ("surface", "surf"), ("item_id", "sku"),
                  ("position", "pos"), ("score", "sc"), ("action", "kind"), ("grade", "grade")):
        if k in doc:
            out[k2] = _fix_score(doc[k])
    if "ts" in doc:
        ms = _ms(doc["ts"])
        out["t_us"] = ms * 1000 if ms is not None else str(doc["ts"])
    return _dump(out)


def _expressible_a(stream: str, raw: bytes) -> bool:
    doc = _load(raw)  # both forms at once (ambiguous_form) has no nested-list counterpart
    return not (type(doc) is dict and "items" in doc and "item_id" in doc)


def _expressible_b(stream: str, raw: bytes) -> bool:
    doc = _load(raw)  # without an event id in the shape, a missing one is no error; the items array neither
    return type(doc) is not dict or ("event_id" in doc and not ("items" in doc and "item_id" in doc)
                                     and not (isinstance(doc.get("items"), list) and len(doc["items"]) > 200)
                                     and doc.get("items") != [])


def _write(path: Path, lines: list[bytes]) -> str:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return str(path)


def _replay(tmp: Path, name: str, imps: list[bytes], clks: list[bytes], config: str | None) -> dict[str, Any]:
    args = ["replay", "--impressions", _write(tmp / f"{name}-imp.jsonl", imps),
            "--clicks", _write(tmp / f"{name}-clk.jsonl", clks), "--format", "json",
            "--window", "1m,5m", "--attribution-window", "1m", "--allowed-disorder", "10s",
            "--windows-out", str(tmp / f"{name}-windows.jsonl"), "--dead-letter", str(tmp / f"{name}-dead.jsonl")]
    if config is not None:
        (tmp / f"{name}.toml").write_text(config)
        args += ["--config", str(tmp / f"{name}.toml")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    dead = [json.loads(line) for line in (tmp / f"{name}-dead.jsonl").read_text().splitlines()]
    return {"result": json.loads(result.stdout), "summary": result.stderr.strip(),
            "windows": (tmp / f"{name}-windows.jsonl").read_text().splitlines(),
            "dead": sorted((d["stream"], d["reason"], d["raw"]) for d in dead),
            "dead_file": (tmp / f"{name}-dead.jsonl").read_text()}


def _split(events: list[tuple[str, bytes, int]]) -> tuple[list[bytes], list[bytes]]:
    return [r for s, r, _ in events if s == "impressions"], [r for s, r, _ in events if s == "clicks"]


@pytest.mark.parametrize("seed", [1, 2])
def test_nested_list_shape_equals_native(tmp_path: Path, seed: int) -> None:
    events = [(s, r, p) for s, r, p in messy_traffic(seed) if _expressible_a(s, r)]
    imps, clks = _split(events)
    native = _replay(tmp_path, "native", imps, clks, None)
    foreign = _replay(tmp_path, "a", [shape_a("impressions", r) for r in imps],
                      [shape_a("clicks", r) for r in clks], CONFIG_A)
    assert foreign["result"] == native["result"]
    assert foreign["windows"] == native["windows"] and len(native["windows"]) > 5
    assert foreign["summary"] == native["summary"]  # outcomes and rejects by reason
    assert [d[:2] for d in foreign["dead"]] == [d[:2] for d in native["dead"]]
    assert native["summary"].count("rejected by reason") == 1 and "late" in native["summary"]
    # dead letters keep the lines as written in the team's shape
    written = {line.decode("utf-8", "replace") for line in (tmp_path / "a-imp.jsonl").read_bytes().splitlines()}
    imp_dead = [d[2] for d in foreign["dead"] if d[0] == "impressions"]
    assert imp_dead and sum(d in written for d in imp_dead) >= len(imp_dead) - 1  # the too-deep line is not UTF-8-text


@pytest.mark.parametrize("seed", [1, 2])
def test_item_events_without_ids_equal_native_item_form(tmp_path: Path, seed: int) -> None:
    events = [(s, r, p) for s, r, p in messy_traffic(seed) if _expressible_b(s, r)]
    imps, clks = _split(events)
    imps = [e for r in imps for e in item_form("impressions", r)]
    native = _replay(tmp_path, "native", imps, clks, None)
    foreign = _replay(tmp_path, "b", [shape_b("impressions", r) for r in imps],
                      [shape_b("clicks", r) for r in clks], CONFIG_B)
    assert foreign["result"] == native["result"]
    assert foreign["windows"] == native["windows"] and len(native["windows"]) > 5
    assert foreign["summary"] == native["summary"]
    assert [d[:2] for d in foreign["dead"]] == [d[:2] for d in native["dead"]]
    assert "duplicate 0" not in native["summary"]


@pytest.mark.parametrize("shape", ["a", "b"])
def test_translations_kept_by_the_reader_give_the_in_process_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     shape: str) -> None:
    """The log reader translates each line once (its event time orders the merge) and hands the translation on
    with the batch, with the rows of the translated events: byte for byte the replay in one process (windows,
    result, counts, dead letters in order), over many small batches of messy traffic (rejections, duplicates,
    late events; shape B has no event ids)."""
    import functools

    import rankwatch.commands.log_reader as log_reader

    monkeypatch.setattr(log_reader, "open_merge", functools.partial(log_reader.open_merge, chunk_bytes=1 << 12))
    if shape == "a":
        events = [(s, r, p) for s, r, p in messy_traffic(3) if _expressible_a(s, r)]
        imps, clks = _split(events)
        imps, clks, config = [shape_a("impressions", r) for r in imps], [shape_a("clicks", r) for r in clks], CONFIG_A
    else:
        events = [(s, r, p) for s, r, p in messy_traffic(3) if _expressible_b(s, r)]
        imps, clks = _split(events)
        imps = [shape_b("impressions", e) for r in imps for e in item_form("impressions", r)]
        clks, config = [shape_b("clicks", r) for r in clks], CONFIG_B
    child = _replay(tmp_path, "child", imps, clks, config)
    monkeypatch.setenv("RANKWATCH_LOG_READER", "inline")
    inline = _replay(tmp_path, "inline", imps, clks, config)
    child["dead_file"] = child["dead_file"].replace(str(tmp_path / "child-"), str(tmp_path / "inline-"))  # sources
    assert child == inline
    assert len(child["windows"]) > 5 and child["dead_file"].count("\n") > 5
