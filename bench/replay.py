"""Benchmark of ``rankwatch replay`` end to end, against references measured in the same run.

Run: ``python bench/replay.py [--requests N] [--repeat R] [--rate RPS] [--mapped]``. Writes N clean 20-item requests
(list-form impressions and their graded clicks, from :mod:`pipeline.traffic.generator`, replicated with
fresh ids) as two JSONL files, then times, as medians over ``--repeat`` runs, wall time and CPU time (of this
process, and of its reaped children apart: the replay's log reader and window worker are child processes):

- ``json.loads``: the standard library's decode of every line of both files (read from disk);
- ``process_batch``: the streaming core's batch path alone, on the same events already in memory, in merged
  order, in batches of 4,096;
- ``replay``: the ``rankwatch replay --format json`` command on the two files (reading, merging, the core,
  the final result document), in this process;
- ``replay, worker on`` or ``replay, worker off``: the same with the window worker in the other mode than the
  default (``RANKWATCH_WINDOW_WORKER=process`` where the default leaves it off, on one CPU, else
  ``=inline``): what the worker gains or costs here, in the same run;
- with ``--mapped``, ``replay --config``: the same events written in a team's nested list shape
  (``stream_core.TEAM_FIELDS``, JSON) and replayed with the config that maps them, printed as a ratio to
  the native replay.

With ``--processes ROUNDS`` it also times whole processes from the outside, as the issue's checks do: per round
``python`` reading both files with ``json.loads``, ``python -m rankwatch replay`` twice, ``json.loads`` again (ABBA
order), and prints the ratio of each round and their median. With ``--python-too`` each round also times the replay
with ``RANKWATCH_NATIVE=off`` (the streaming core's C helpers off: what an install without a compiler runs), in
ABBA order with the default one, and prints their paired ratio.

It prints requests/s of each and the ratios the product goals are stated in, replay / json.loads and
replay / process_batch, by wall time (what a user sees on an idle machine with two cores or more), and the CPU
time of all the replay's processes beside ``json.loads``' (the work it takes, whichever core does it: this
process's CPU time alone no longer measures the replay, part of which runs in the children).
Machines differ: quote the ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_core import build_events  # noqa: E402

from rankwatch.cli import main as cli_main  # noqa: E402
from rankwatch.commands.window_worker import usable_cpus, worker_by_default  # noqa: E402
from rankwatch.pipeline.clock import ManualClock  # noqa: E402
from rankwatch.pipeline.events.logs import EventLogMerge  # noqa: E402
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(fn) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """(wall, this process's CPU, reaped children's CPU) seconds of ``fn()``."""
    wall, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu, _children_cpu() - children


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second of event time")
    ap.add_argument("--mapped", action="store_true",
                    help="also replay the same events in a team's nested list shape with --config (stream_core's "
                         "TEAM_FIELDS), printed as a ratio to the native replay of the same run")
    ap.add_argument("--python-too", action="store_true",
                    help="with --processes, also time whole replays with RANKWATCH_NATIVE=off (no C helpers)")
    ap.add_argument("--processes", type=int, default=0, metavar="ROUNDS",
                    help="also time whole processes from the outside, as a user runs them: per round `python` "
                         "reading both files with json.loads and `python -m rankwatch replay`, in ABBA order")
    args = ap.parse_args()

    events = build_events(args.requests, rate=args.rate)
    with tempfile.TemporaryDirectory() as tmp:
        imp, clk = Path(tmp) / "impressions.jsonl", Path(tmp) / "clicks.jsonl"
        with imp.open("wb") as fi, clk.open("wb") as fc:
            for e in events:
                (fi if e.stream == "impressions" else fc).write(e.value + b"\n")
        size_mb = (imp.stat().st_size + clk.stat().st_size) / 1e6
        merge = EventLogMerge([(imp, "impressions"), (clk, "clicks")])
        batches = [(k, v) for k, v, _ in merge.batches()]
        merge.close()
        merged = [(k, v) for ks, vs in batches for k, v in zip(ks, vs, strict=True)]

        mapped_args: list[str] = []
        if args.mapped:
            mapped_args = _team_files(events, Path(tmp))

        def loads() -> None:
            for path in (imp, clk):
                for line in path.read_bytes().splitlines():
                    json.loads(line)

        def core() -> None:
            proc = StreamProcessor(StreamConfig(windows=("5m", "1h")), clock=ManualClock())
            for i in range(0, len(merged), 4096):
                chunk = merged[i:i + 4096]
                proc.process_batch([k for k, _ in chunk], [v for _, v in chunk])
            proc.flush()

        def replay(files: list[str]) -> None:
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                code = cli_main(["replay", *files, "--format", "json"])
            if code:
                raise SystemExit(f"replay failed: {err.getvalue()}")
            json.loads(out.getvalue())

        worker_on = worker_by_default()
        other = "replay, worker off" if worker_on else "replay, worker on"

        def replay_other_mode() -> None:
            os.environ["RANKWATCH_WINDOW_WORKER"] = "inline" if worker_on else "process"
            try:
                replay(["--impressions", str(imp), "--clicks", str(clk)])
            finally:
                del os.environ["RANKWATCH_WINDOW_WORKER"]

        fns = {"json.loads": loads, "process_batch": core,
               "replay": lambda: replay(["--impressions", str(imp), "--clicks", str(clk)]),
               other: replay_other_mode}
        if mapped_args:
            fns["replay --config"] = lambda: replay(mapped_args)
        times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in fns}
        for _ in range(args.repeat):
            for name, fn in fns.items():
                times[name].append(_timed(fn))
        rounds = _whole_processes(imp, clk, args.processes, args.python_too)
    med = {k: [statistics.median(t[i] for t in v) for i in range(3)] for k, v in times.items()}
    print(f"{args.requests} requests, {len(events)} events, {size_mb:.0f} MB JSONL; medians of {args.repeat}")
    print(f"  {'':22s} {'wall s':>7s} {'req/s':>9s} {'CPU s':>7s} {'child CPU s':>12s}")
    for k, (wall, cpu, child) in med.items():
        print(f"  {k:22s} {wall:7.2f} {args.requests / wall:9,.0f} {cpu:7.2f} {child:12.2f}")
    wall = {k: v[0] for k, v in med.items()}
    on, off = ("replay", other) if worker_on else (other, "replay")
    print(f"by wall: replay / json.loads = {wall['json.loads'] / wall['replay']:.2f}x, "
          f"replay / process_batch = {wall['process_batch'] / wall['replay']:.2f}x "
          f"(window worker {'on' if worker_on else 'off'} by default: {usable_cpus()} CPUs); "
          f"the worker's gain here: {wall[off] / wall[on]:.2f}x")
    print(f"CPU s of all the replay's processes: {med['replay'][1] + med['replay'][2]:.2f}, "
          f"{other}: {med[other][1] + med[other][2]:.2f} (json.loads: {med['json.loads'][1]:.2f})")
    if "replay --config" in med:
        print(f"replay --config (nested list shape) / replay (native), wall: "
              f"{med['replay'][0] / med['replay --config'][0]:.2f}x")
    if rounds:
        ratios = [(r[0] + r[-1]) / (r[1] + r[2]) for r in rounds]
        order = "json.loads, replay, replay, json.loads" if len(rounds[0]) == 4 else (
            "json.loads, replay, replay without C, replay without C, replay, json.loads")
        print(f"whole processes, {len(rounds)} rounds in ABBA order ({order}; wall s): "
              + ", ".join(" ".join(f"{t:.2f}" for t in r) for r in rounds))
        print(f"  replay / json.loads from the outside, per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f}x)")
        if len(rounds[0]) == 6:
            python = [(r[2] + r[3]) / (r[1] + r[4]) for r in rounds]
            slower = [(r[0] + r[5]) / (r[2] + r[3]) for r in rounds]
            print(f"  RANKWATCH_NATIVE=off / default, paired per round: {', '.join(f'{x:.2f}' for x in python)} "
                  f"(median {statistics.median(python):.2f}); its replay / json.loads: median "
                  f"{statistics.median(slower):.2f}x")


_LOADS = "import json, sys\nfor p in sys.argv[1:]:\n    with open(p, 'rb') as f:\n        for line in f:\n            json.loads(line)\n"


def _whole_processes(imp: Path, clk: Path, rounds: int, python_too: bool = False) -> list[tuple[float, ...]]:
    """Wall seconds of whole processes, ``rounds`` times in ABBA order: ``python`` reading both files with
    ``json.loads`` line by line, ``python -m rankwatch replay --format json`` twice (with ``python_too``, twice
    with ``RANKWATCH_NATIVE=off`` between them), ``json.loads`` again. The order cancels the few per cent the second
    of two runs gains (warmer caches and clocks)."""
    import subprocess
    import threading

    loads = [sys.executable, "-c", _LOADS, str(imp), str(clk)]
    replay = [sys.executable, "-m", "rankwatch", "replay", "--impressions", str(imp), "--clicks", str(clk),
              "--format", "json"]

    without_c = {**os.environ, "RANKWATCH_NATIVE": "off"}

    def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
        # Waited for without a timeout: subprocess's wait with one polls, at up to 50 ms apart, which rounded every
        # time up by as much. The bound is a timer that kills a process still running after 600 s.
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        watchdog = threading.Timer(600, proc.kill)
        watchdog.start()
        try:
            code = proc.wait()
        finally:
            watchdog.cancel()
        elapsed = time.perf_counter() - t
        if code != 0:
            raise subprocess.CalledProcessError(code, cmd)
        return elapsed

    if python_too:
        return [(wall(loads), wall(replay), wall(replay, without_c), wall(replay, without_c), wall(replay), wall(loads))
                for _ in range(rounds)]
    return [(wall(loads), wall(replay), wall(replay), wall(loads)) for _ in range(rounds)]


def _team_files(events: list[Any], tmp: Path) -> list[str]:
    """The events in stream_core's nested list shape (JSON), two files and the config mapping them: the
    ``rankwatch replay`` arguments that read them."""
    from stream_core import TEAM_FIELDS, team_inputs

    _, values = team_inputs(events, "json")
    imp, clk, config = tmp / "team-impressions.jsonl", tmp / "team-clicks.jsonl", tmp / "team.toml"
    with imp.open("wb") as fi, clk.open("wb") as fc:
        for e, v in zip(events, values, strict=True):
            (fi if e.stream == "impressions" else fc).write(v + b"\n")
    config.write_text("".join(f"[events.{stream}.fields]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in fields.items())
                              + "\n" for stream, fields in TEAM_FIELDS.items()))
    return ["--impressions", str(imp), "--clicks", str(clk), "--config", str(config)]


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


if __name__ == "__main__":
    main()
