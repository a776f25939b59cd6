"""What mapped events cost on top of the native batch path and their decoder: translation and bookkeeping.

Run: ``python bench/mapped_overhead.py [--requests N] [--repeat R]``. Per repetition, back to back on the same
events (:func:`stream_core.build_events`): the native batch path, the mapped batch path of the nested list
shape (``stream_core.team_inputs``, JSON and Confluent-framed Avro) and the format's decoder alone; prints
medians per request (CPU time of one core) and ``mapped - native - decode``, the part the translator and
:func:`pipeline.stream.mapped.process_mapped_batch` add. Pairing within a repetition keeps the difference
readable on a shared machine, where the ratios of ``stream_core.py`` move by several hundredths between runs.
Also prints the Avro ceiling: native / (native + decode), the ratio with no translation at all, and the
translation proper (decoded trees to section 1 bytes) of the generated record functions against the general
translator (``Translator(..., fast=False)``) in the same run.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stream_core as sc  # noqa: E402

from rankwatch.pipeline.events.translate import Translator  # noqa: E402


def tree_times(translator: Translator, streams: list[str], values: list[bytes], repeat: int) -> tuple[float, float]:
    """Seconds (min of ``repeat``) to turn the decoded trees into section 1 bytes: generated, general."""
    general = Translator(translator.mapping, fast=False,
                         decoders={k: d for k, d in translator.decoders.items() if d is not None})
    out = []
    for t in (translator, general):
        fns = t._tree_fns
        best = float("inf")
        for _ in range(repeat):
            spent = 0.0
            for i in range(0, len(values), 1_000):  # a poll's worth of trees at a time, as the core holds them
                chunk = list(zip(streams[i:i + 1_000], values[i:i + 1_000], strict=True))
                trees = [translator.decoders[s](v) for s, v in chunk]  # type: ignore[misc]
                t0 = time.process_time()
                for (stream, raw), tree in zip(chunk, trees, strict=True):
                    fns[stream](tree, raw)
                spent += time.process_time() - t0
            best = min(best, spent)
        out.append(best)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    events = sc.build_events(args.requests)
    gc.collect()
    gc.freeze()
    n = sum(e.stream == "impressions" for e in events)
    team = {fmt: sc.team_inputs(events, fmt) for fmt in ("json", "avro")}
    streams = [e.stream for e in events]
    times: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for fmt, (translator, values) in team.items():
            t0 = time.process_time()
            sc.run_core_batch(events)
            native = time.process_time() - t0
            t0 = time.process_time()
            sc.run_core_batch(events, translator=translator, values=values)
            mapped = time.process_time() - t0
            decoders = translator.decoders
            t0 = time.process_time()
            for stream, value in zip(streams, values, strict=True):
                decoders[stream](value)
            decode = time.process_time() - t0
            for key, t in (("native", native), (fmt, mapped), (fmt + " decode", decode),
                           (fmt + " overhead", mapped - native - decode)):
                times.setdefault(key, []).append(t / n * 1e6)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n} requests of 20 items, medians of {args.repeat}, microseconds of CPU per request")
    for fmt in team:
        print(f"{fmt:5s}: native {med['native']:6.1f}  decode {med[fmt + ' decode']:6.1f}  mapped {med[fmt]:6.1f}  "
              f"mapped - native - decode {med[fmt + ' overhead']:6.1f}  ratio {med['native'] / med[fmt]:.2f}x")
    print(f"Avro ceiling (no translation): {med['native'] / (med['native'] + med['avro decode']):.2f}x")
    for fmt, (translator, values) in team.items():
        fast, general = tree_times(translator, streams, values, args.repeat)
        print(f"{fmt:5s}: trees to section 1 bytes, generated {fast / n * 1e6:5.1f}, general {general / n * 1e6:5.1f} "
              f"microseconds per request (min of {args.repeat}): {general / fast:.2f}x cheaper")


if __name__ == "__main__":
    main()
