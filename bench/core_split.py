"""Where the streaming core's CPU goes on a replay's events: the batch path's stages timed apart.

Run: ``python bench/core_split.py [--requests N] [--rate RPS] [--repeat R] [--part P]``. The events of
``bench/replay.py`` (N clean 20-item requests at RPS requests per second of event time, merged by
timestamp) go through ``StreamProcessor`` with the replay's windows, timed by stage (``time.process_time``,
medians over R runs):

- ``prepare``: :func:`pipeline.stream.prepare.prepare_rows` of every part of P records (the stateless rows:
  decode, checks, packing; the replay's log reader makes most of them in its own process);
- ``apply``: :func:`pipeline.stream.batch._apply` of those rows (dedupe, watermark, join), without the time
  spent in the watermark's advances;
- ``advance``: those advances (finalizing the due buckets, the kernel, the window merges);
- ``flush``: the end of input (everything still pending finalized, every window closed).

Each stage is printed with its share of the CPU of ``json.loads`` of the same lines in the same run (the
reference the replay's goal is stated in), and the split run's stats are checked first against
``process_batch`` on the same events (a split that skipped work would fail, not look fast).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_core import build_events  # noqa: E402

from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.stream import batch  # noqa: E402
from rankwatch.pipeline.stream.prepare import prepare_rows  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402


def _processor() -> StreamProcessor:
    """A processor with the replay's default windows (``bench/replay.py``'s ``process_batch`` reference)."""
    return StreamProcessor(StreamConfig(windows=("5m", "1h")), clock=ManualClock())


def split(kinds: list[bool], values: list[bytes], part: int) -> tuple[dict[str, float], Any]:
    """CPU seconds of each stage for one pass over the events, and the processor's stats at the end."""
    proc = _processor()
    spec, user_keys = proc.batch_spec, proc._pending.user_keys
    gc.collect()
    t = time.process_time()
    parts = [(s, prepare_rows(spec, kinds[s:s + part], values[s:s + part], user_keys))
             for s in range(0, len(kinds), part)]
    prepare = time.process_time() - t
    advance = 0.0
    maybe_advance = proc._maybe_advance

    def timed_advance(wm: Any) -> Any:
        nonlocal advance
        t0 = time.process_time()
        out = maybe_advance(wm)
        advance += time.process_time() - t0
        return out

    proc._maybe_advance = timed_advance  # type: ignore[method-assign]
    t = time.process_time()
    for start, rows in parts:
        batch._apply(proc, kinds, values, rows, start, None, None, batch._TOPICS, None)
    apply = time.process_time() - t - advance
    t = time.process_time()
    proc.flush()
    return {"prepare": prepare, "apply": apply, "advance": advance, "flush": time.process_time() - t}, proc.stats()


def whole(kinds: list[bool], values: list[bytes]) -> Any:
    """The stats of ``process_batch`` over the same events (what :func:`split` must reach)."""
    proc = _processor()
    for i in range(0, len(kinds), 4096):
        proc.process_batch(kinds[i:i + 4096], values[i:i + 4096])
    proc.flush()
    return proc.stats()


def loads(values: list[bytes]) -> float:
    """CPU seconds of ``json.loads`` of every line."""
    t = time.process_time()
    for v in values:
        json.loads(v)
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second of event time")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--part", type=int, default=512, help="records prepared, then applied, at a time")
    args = ap.parse_args()
    events = sorted(build_events(args.requests, rate=args.rate), key=lambda e: e.ts_ms)
    kinds = [e.stream == "impressions" for e in events]
    values = [e.value for e in events]
    runs, refs = [], []
    expected = whole(kinds, values)
    for _ in range(args.repeat):
        stages, stats = split(kinds, values, args.part)
        if stats != expected:
            raise SystemExit(f"the split run differs from process_batch: {stats} != {expected}")
        runs.append(stages)
        refs.append(loads(values))
    ref = statistics.median(refs)
    print(f"{args.requests} requests, {len(events)} events, {args.rate:g} requests/s of event time; "
          f"CPU medians of {args.repeat}")
    print(f"  {'json.loads':10s} {ref:6.3f} s  {ref / len(events) * 1e6:5.2f} us/event  (reference)")
    for stage in runs[0]:
        sec = statistics.median(r[stage] for r in runs)
        print(f"  {stage:10s} {sec:6.3f} s  {sec / len(events) * 1e6:5.2f} us/event  {sec / ref:5.2f}x json.loads")
    total = sum(statistics.median(r[stage] for r in runs) for stage in runs[0])
    print(f"  {'all':10s} {total:6.3f} s  {total / len(events) * 1e6:5.2f} us/event  {total / ref:5.2f}x json.loads")


if __name__ == "__main__":
    main()
