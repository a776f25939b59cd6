"""A team's events to section 1 events: :class:`Translator`, built by :meth:`EventMapping.translator`.

Layout: :func:`translator_for` (None for the identity mapping); one decoded record (a dict tree: JSON here,
Avro / Protobuf from their decoders) plus its raw bytes in, section 1 events as JSON bytes out
(:meth:`Translator.translate`), or a :class:`~pipeline.events.validation.Rejection`;
:meth:`Translator.translate_many` does a run of one stream, :meth:`Translator.translate_kinds` a poll of
both. Per stream the record function is the generated one of :mod:`pipeline.events.translate_compiled`
(``fast=True``, the default) in front of :func:`_tree_translator`, the general translator built from the
path getters of :mod:`pipeline.events.paths` (``fast=False`` uses it alone).

Why bytes: the unchanged native core validates them (types, ranges, positions, grades), so a mapped event
is held to every rule of section 1 and is counted and dead-lettered the same way; the translator itself
rejects only what the core cannot see: undecodable bytes, a missing required path, a path through a scalar,
a timestamp in the wrong unit's type. Why two record functions: the general one is the definition (one
closure per field, every rejection and its message); the generated one reads the usual record in one frame,
about twice as cheap, and hands anything else to the general one whole, so the results are the same by
construction (and tested on random trees). Digest ids: with ``event_id`` not mapped and absent, the id is the
BLAKE2b-128 hex digest of the message's bytes, so a byte-identical resend is a duplicate and nothing else is
(in the item layout each message is one item event, so the id is per item).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.logs import NO_TS
from rankwatch.pipeline.events.mapping import REQUIRED, EventMapping, StreamMapping, digest_id
from rankwatch.pipeline.events.paths import SHIFTED_KEY, SINGLE_KEY
from rankwatch.pipeline.events.translate_compiled import compiled_translator
from rankwatch.pipeline.events.validation import Rejection, RejectReason

Decoder = Callable[[bytes], Any]  # raw bytes -> a record tree, or a Rejection
_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode


class _Item(msgspec.Struct, gc=False):
    """One translated item: built positionally and encoded as ``{"item_id", "position", "score"}`` (the
    bytes of the dict it replaces, in a third of the time)."""

    item_id: Any
    position: Any
    score: Any


def json_decoder(max_event_bytes: int) -> Decoder:
    """JSON bytes to a tree, or a Rejection with section 1's reasons (so mapped JSON and native JSON name
    bad bytes alike: ``too_large``, ``invalid_utf8``, ``invalid_json``, ``too_deep``, ``not_an_object``)."""

    def decode(raw: bytes) -> Any:
        if len(raw) > max_event_bytes:
            return Rejection(RejectReason.too_large, f"{len(raw)} bytes > {max_event_bytes}")
        try:
            tree = _json_decode(raw)
        except msgspec.DecodeError as e:
            msg = str(e)
            if not raw.isascii():
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as u:
                    return Rejection(RejectReason.invalid_utf8, f"invalid UTF-8 at byte {u.start}")
            if "Number out of range" in msg:  # a float beyond double range, such as 1e999 (as section 1 names it)
                return Rejection(RejectReason.non_finite_score, msg)
            return Rejection(RejectReason.invalid_utf8 if "UTF-8" in msg else RejectReason.invalid_json, msg)
        except RecursionError:
            return Rejection(RejectReason.too_deep, "JSON nested too deeply")
        if type(tree) is not dict:
            return Rejection(RejectReason.not_an_object, f"Expected `object`, got `{type(tree).__name__}`")
        return tree

    return decode


def translator_for(mapping: EventMapping, *, max_event_bytes: int = 1_000_000,
                   decoders: Mapping[str, Decoder] | None = None, fast: bool = True) -> Translator | None:
    """The translator of ``mapping``, or None when it maps nothing (section 1 events read unchanged)."""
    if mapping.identity:
        return None
    return Translator(mapping, max_event_bytes=max_event_bytes, decoders=decoders, fast=fast)


class Translator:
    """Section 1 events from a team's events (see module docstring); built once, used for every event.

    Parameters
    ----------
    mapping
        The compiled :class:`EventMapping`.
    max_event_bytes
        Larger messages are ``too_large`` before decoding.
    decoders
        Per stream, a decoder for ``format = "avro"`` / ``"protobuf"`` (``bytes -> tree | Rejection``);
        JSON needs none. A stream whose format has no decoder is a :class:`ConfigError`.
    fast
        True: each stream's generated function (:mod:`pipeline.events.translate_compiled`); False: the
        general translator only (the reference the generated one is tested against).
    """

    def __init__(self, mapping: EventMapping, *, max_event_bytes: int = 1_000_000,
                 decoders: Mapping[str, Decoder] | None = None, fast: bool = True) -> None:
        self.mapping = mapping
        self.max_event_bytes = max_event_bytes
        self.decoders: dict[str, Decoder | None] = {}
        self._tree_fns: dict[str, Callable[[Any, bytes], Any]] = {}
        for name in ("impressions", "clicks"):
            sm = mapping.stream(name)
            dec = (decoders or {}).get(name)
            if sm.identity:
                self.decoders[name] = None  # section 1 bytes pass unchanged
            elif dec is None and sm.format != "json":
                raise ConfigError(f"{mapping.where}: events.{name}.format: {sm.format} needs its decoder "
                                  f"(install rankwatch[{sm.format}])")
            else:
                self.decoders[name] = dec or json_decoder(max_event_bytes)
            general = _tree_translator(sm)
            self._tree_fns[name] = compiled_translator(sm, general, _Item) if fast else general
        # Per stream, bytes -> [section 1 bytes] | Rejection: the decoder and the record function in one call.
        self._one: dict[str, Callable[[bytes], Any]] = {
            name: _decode_then(self.decoders[name], self._tree_fns[name]) for name in ("impressions", "clicks")}

    # -- one event -------------------------------------------------------------------------------------
    def translate(self, stream: str, raw: bytes) -> list[bytes] | Rejection:
        """Section 1 events (JSON bytes) for one message of ``stream``, or why it cannot be read."""
        return self._one[stream](raw)  # type: ignore[no-any-return]

    translate_line = translate  # the name replay's line reader calls (one line of a log)

    def translate_impression(self, raw: bytes) -> list[bytes] | Rejection:
        return self.translate("impressions", raw)

    def translate_feedback(self, raw: bytes) -> list[bytes] | Rejection:
        return self.translate("clicks", raw)

    def translate_tree(self, stream: str, tree: Any, raw: bytes) -> list[bytes] | Rejection:
        """Section 1 events for an already decoded record (``raw``: its message bytes, for digest ids)."""
        if type(tree) is not dict:
            return Rejection(RejectReason.not_an_object, f"expected a record, got {type(tree).__name__}")
        return self._tree_fns[stream](tree, raw)  # type: ignore[no-any-return]

    # -- a run of one stream ---------------------------------------------------------------------------
    def translate_many(self, stream: str, raws: Sequence[bytes]
                       ) -> tuple[list[bytes], list[int], list[tuple[int, Rejection]]]:
        """``(native_values, source_index, rejections)``: ``source_index[j]`` is the index in ``raws`` of
        ``native_values[j]``; ``rejections`` are ``(index, Rejection)`` in order."""
        values: list[bytes] = []
        index: list[int] = []
        rejected: list[tuple[int, Rejection]] = []
        translate = self._one[stream]
        for i, raw in enumerate(raws):
            out = translate(raw)
            if type(out) is Rejection:
                rejected.append((i, out))
            elif len(out) == 1:  # type: ignore[arg-type]
                values.append(out[0])  # type: ignore[index]
                index.append(i)
            else:
                values += out  # type: ignore[arg-type]
                index += [i] * len(out)  # type: ignore[arg-type]
        return values, index, rejected

    def translate_kinds(self, kinds: Sequence[bool], raws: Sequence[bytes]) -> list[list[bytes] | Rejection]:
        """:meth:`translate` of each message, ``kinds[i]`` True for an impression, False for a click."""
        imp, clk = self._one["impressions"], self._one["clicks"]
        return [imp(raw) if kind else clk(raw) for kind, raw in zip(kinds, raws, strict=True)]

    def event_ts_ms(self, stream: str, raw: bytes) -> int | None:
        """The event time (epoch ms) a message maps to, None when it cannot be read (for ordering only)."""
        return _translation_ts_ms(self.translate(stream, raw))

    def event_ts_many(self, stream: str, raws: list[bytes],
                      keep: Callable[[bytes, list[bytes] | Rejection], None] | None = None) -> np.ndarray:
        """:meth:`event_ts_ms` of each message, as epoch ms with ``NO_TS`` where it cannot be read
        (the ``ts_of`` of :class:`pipeline.events.logs.EventLogMerge`); ``keep(raw, translation)``, when given,
        is handed each message's translation (``rankwatch replay`` keeps them for the core)."""
        out = np.empty(len(raws), dtype=np.int64)
        translate = self.translate
        for i, raw in enumerate(raws):
            translation = translate(stream, raw)
            if keep is not None:
                keep(raw, translation)
            ms = _translation_ts_ms(translation)
            out[i] = NO_TS if ms is None else ms
        return out


def _translation_ts_ms(out: list[bytes] | Rejection) -> int | None:
    """The event time (epoch ms) of a message's translation: its first event's, None for a rejection or none."""
    from rankwatch.pipeline.events.validation import sniff_ts_ms

    if type(out) is Rejection or not out:
        return None
    return sniff_ts_ms(out[0])  # type: ignore[index]


def _decode_then(decode: Decoder | None, tree_fn: Callable[[Any, bytes], Any]) -> Callable[[bytes], Any]:
    """One stream's ``bytes -> [section 1 bytes] | Rejection`` (the message itself when nothing is mapped)."""
    if decode is None:
        return lambda raw: [raw]

    def translate_one(raw: bytes) -> Any:
        tree = decode(raw)
        if type(tree) is Rejection:
            return tree
        return tree_fn(tree, raw)

    return translate_one


def _missing(name: str, path: str) -> Rejection:
    where = f"`{name}`" if name == path else f"`{name}` (path {path})"
    return Rejection(RejectReason.missing_field, f"missing required field {where}")


def _tree_translator(sm: StreamMapping) -> Callable[[Any, bytes], Any]:
    """The per-record function of one stream: tree + raw -> [section 1 bytes] | Rejection."""
    plan = tuple((f.name, f.get, f.name in REQUIRED, _missing(f.name, f.path)) for f in sm.fields
                 if f.name not in ("event_id", "items"))
    eid_field = next(f for f in sm.fields if f.name == "event_id")
    get_eid, eid_mapped, eid_missing = eid_field.get, eid_field.mapped, _missing("event_id", eid_field.path)
    items_field = next((f for f in sm.fields if f.name == "items"), None)
    item_plan = tuple((f.name, f.get, _missing(f.name, f.path)) for f in sm.item_fields)
    encode = _encode

    def event_fields(tree: Any, raw: bytes) -> Any:
        eid = get_eid(tree)
        if eid is None:
            if eid_mapped:
                return eid_missing
            eid = digest_id(raw)
        elif type(eid) is Rejection:
            return eid
        out: dict[str, Any] = {"event_id": eid}
        for name, get, required, missing in plan:
            v = get(tree)
            if v is None:
                if required:
                    return missing
            elif type(v) is Rejection:
                return v
            else:
                out[name] = v
        return out

    if items_field is None:  # item layout (impressions) or feedback: every path from the root
        def flat(tree: Any, raw: bytes) -> Any:
            out = event_fields(tree, raw)
            if type(out) is Rejection:
                return out
            for name, get, missing in item_plan:
                v = get(tree)
                if v is None:
                    return missing
                if type(v) is Rejection:
                    return v
                out[name] = v
            try:
                return [encode(out)]
            except (TypeError, ValueError) as e:
                return Rejection(RejectReason.bad_type, f"a value has no JSON form: {e}")

        return flat

    get_items, items_missing = items_field.get, _missing("items", items_field.path)
    items_path = items_field.path
    (_, g_id, m_id), (_, g_pos, m_pos), (_, g_score, m_score) = item_plan
    # The usual element: single keys (a 0-based position shifted) read inline with dict.get, no calls per
    # field; an element that is not an object, or any other rule, takes the getters.
    k_id, k_score = SINGLE_KEY.get(g_id), SINGLE_KEY.get(g_score)
    k_pos, shift = (SINGLE_KEY[g_pos], 0) if g_pos in SINGLE_KEY else SHIFTED_KEY.get(g_pos, (None, 0))
    inline = k_id is not None and k_pos is not None and k_score is not None

    def nested(tree: Any, raw: bytes) -> Any:
        out = event_fields(tree, raw)
        if type(out) is Rejection:
            return out
        elements = get_items(tree)
        if elements is None:
            return items_missing
        if type(elements) is not list:
            if type(elements) is Rejection:
                return elements
            return Rejection(RejectReason.bad_type, f"path {items_path}: expected an array, got "
                                                    f"{type(elements).__name__}")
        items: list[_Item] = []
        add = items.append
        for el in elements:
            if inline and type(el) is dict:
                iid, pos, score = el.get(k_id), el.get(k_pos), el.get(k_score)
                if iid is not None and pos is not None and score is not None:
                    if shift and type(pos) is int:
                        pos += shift
                    add(_Item(iid, pos, score))
                    continue
            iid, pos, score = g_id(el), g_pos(el), g_score(el)
            if iid is None or pos is None or score is None:
                return m_id if iid is None else m_pos if pos is None else m_score
            if type(iid) is Rejection or type(pos) is Rejection or type(score) is Rejection:
                return next(v for v in (iid, pos, score) if type(v) is Rejection)
            add(_Item(iid, pos, score))
        out["items"] = items
        try:
            return [encode(out)]
        except (TypeError, ValueError) as e:
            return Rejection(RejectReason.bad_type, f"a value has no JSON form: {e}")

    return nested
