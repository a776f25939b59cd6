"""The state of a :class:`pipeline.stream.processor.StreamProcessor` as plain data, and back.

Layout: :func:`state_of` (the processor's parts, each by its own ``to_state``, as one dict of lists, ints and
strings) and :func:`load_state` (the same into a processor freshly made with the snapshot's config).
:mod:`pipeline.stream.snapshot` wraps the dict in its versioned format.

Why apart: the processor module holds the event path; what its state looks like on disk is a concept of its own,
and the two change for different reasons. ``proc`` is typed ``Any``: importing the processor here, even for type
checking only, would make the two modules import each other (tests/rankwatch/test_packaging.py).
"""

from __future__ import annotations

from typing import Any

from rankwatch.pipeline.slicing import LabelCapper
from rankwatch.pipeline.stream.join import PendingRequests
from rankwatch.pipeline.stream.memory import EarlyFeedback, ExpiringIds


def state_of(proc: Any) -> dict[str, Any]:
    """The processor's whole state (its windows held here, not offloaded)."""
    return {
        "pending": proc._pending.to_state(),
        "early": proc._early.to_state(),
        "seen": proc._seen.to_state(),
        "finalized": proc._finalized.to_state(),
        "watermark": proc._watermark.to_state(),
        "wm_step": proc._wm_step,
        "windows": proc._windows.to_state(),
        "staging": proc._staging.to_state(),
        "published": proc._windows.published,
        "capper": proc._capper.to_state(),
        "combos": [[list(k) for k in key] for key in proc._combo_keys],
        "combo_cache": [[list(raw), c] for raw, c in proc._combo_cache.items()],
        "imp": proc._imp,
        "clk": proc._clk,
        "rejects": [[s, r, n] for (s, r), n in proc._rejects.items()],
        "counters": [proc._evicted, proc._finalized_count, proc._detached],
        "experiments": proc._experiments.to_state(),
    }


def load_state(proc: Any, state: dict[str, Any]) -> None:
    """:func:`state_of`'s dict into ``proc``, a processor made with the config the state was taken under."""
    cfg = proc.config
    proc._pending = PendingRequests.from_state(
        state["pending"], attribution_window_ms=cfg.attribution_window_ms, step_ms=cfg.finalize_step_ms,
        max_items_per_request=cfg.max_items_per_request,
    )
    proc._early = EarlyFeedback.from_state(
        state["early"], attribution_window_ms=cfg.attribution_window_ms, step_ms=cfg.finalize_step_ms,
        capacity=cfg.max_pending_feedback,
    )
    proc._seen = ExpiringIds.from_state(state["seen"], capacity=proc._seen.capacity, retention_ms=proc._seen.retention_ms)
    proc._finalized = ExpiringIds.from_state(
        state["finalized"], capacity=proc._finalized.capacity, retention_ms=proc._finalized.retention_ms
    )
    proc._watermark.load_state(state["watermark"])
    proc._wm_step = state["wm_step"]
    proc._windows.load_state(state["windows"], state["published"])
    proc._staging.load_state(state["staging"])
    proc._capper = LabelCapper.from_state(state["capper"])
    proc._combo_keys = [tuple((str(a), str(b)) for a, b in key) for key in state["combos"]]
    proc._combo_ids = {tuple(v for _, v in key): i for i, key in enumerate(proc._combo_keys)}
    proc._combo_cache = {tuple(raw): int(c) for raw, c in state["combo_cache"]}
    proc._imp.update(state["imp"])
    proc._clk.update(state["clk"])
    proc._rejects = {(s, r): int(n) for s, r, n in state["rejects"]}
    proc._evicted, proc._finalized_count, proc._detached = (int(x) for x in state["counters"])
    proc._experiments.restore(state.get("experiments", {}))
