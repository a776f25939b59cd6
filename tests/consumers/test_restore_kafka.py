"""A checkpoint restore longer than the session timeout does not expel the member.

The restore runs on the loop thread while kafka-python's I/O thread keeps heartbeating
(consumers/rebalance.py). Here the restore is made to take 9 s of CPU (a busy loop in front of the real
``StreamProcessor.restore``, as a restore of about a million pending requests would) against a 6 s session
timeout. Before, the restore ran in the rebalance callback on the I/O thread: heartbeats stopped, the
member was expelled and the group rebalanced again. The oracle: the restarted instance is assigned its
pairs once, restores them once, and the windows equal the truth.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import (
    ROOT,
    STARTED,
    consuming_count,
    past_first_close,
    start_run,
    stop_run,
    wait_consuming,
    wait_for,
    write_config,
)
from kafka_oracle import expected_windows
from test_service_kafka import WINDOWS, _assert_matches, _create, _produce, _traffic, _windows_by_identity

from rankwatch.pipeline.traffic.generator import generate_with_truth

pytestmark = pytest.mark.kafka

SLOW_RESTORE = """
import sys, time
from rankwatch.consumers import core_process
def slowed(real):
    def slow(self, *args, **kwargs):
        end = time.monotonic() + {delay}
        while time.monotonic() < end:  # CPU on the consuming thread, as a large restore: the GIL is
            pass  # released only at switch intervals
        print("restore done", flush=True)
        return real(self, *args, **kwargs)
    return slow
# Where the rebalancer restores from, whether the core runs in its own process or not.
for cores in (core_process.CoreProcess, core_process.InProcessCores):
    cores.restore = slowed(cores.restore)
from rankwatch.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _start_slow(config: Path, out: Path, log: Path, delay: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SLOW_RESTORE.format(delay=delay), "run", "--config", str(config),
                             "--windows-out", str(out)], cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


def test_restore_longer_than_the_session_timeout_keeps_the_member(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    events, rows = generate_with_truth(_traffic(41, minutes=4, rate=10))
    half = past_first_close(events)
    _create(kafka_broker.bootstrap, unique, 2)
    want = expected_windows(rows, windows=WINDOWS, partitions=2)
    config = write_config(tmp_path / "run.toml", bootstrap=kafka_broker.bootstrap, prefix=unique,
                          checkpoint_interval="500ms")  # session_timeout 6s
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    _produce(kafka_broker.bootstrap, unique, events[:half], close=False, partitions=2)
    a = start_run(config, outs[0], log_a)
    wait_consuming(log_a, 0, procs=(a,))
    wait_for(lambda: outs[0].exists() and outs[0].stat().st_size > 0, timeout=180, what="A's first window", procs=(a,),
             log=log_a)
    assert stop_run(a) == 0, log_a.read_text()[-3000:]  # final checkpoint committed: B must restore it
    b = _start_slow(config, outs[1], log_b, delay=9.0)
    try:
        wait_consuming(log_b, 0, procs=(b,), timeout=90)
        _produce(kafka_broker.bootstrap, unique, events[half:], close=True, partitions=2)
        wait_for(lambda: set(want) <= set(_windows_by_identity(*outs)), timeout=120, what="all windows", procs=(b,))
    finally:
        assert stop_run(b) == 0, log_b.read_text()[-3000:]
    text = log_b.read_text(errors="replace")
    # Two pairs restored, each once; the member was assigned once (an expulsion would assign it again).
    assert text.count("restore done") == 2, text[-3000:]
    assert consuming_count(log_b) == 1, text[-3000:]
    _assert_matches(_windows_by_identity(*outs), want)


def test_changed_windows_start_the_pairs_fresh_with_one_warning(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    """A group restarted with other window sizes (here 5m -> 10m) used to exit on the checkpoint restore.
    Now each pair starts fresh from its checkpoint's offsets (docs/config-changes.md): one WARNING line names
    the change, the new sizes are published, and the windows wholly after the restart equal the truth."""
    from datetime import datetime

    b = kafka_broker.bootstrap
    events, rows = generate_with_truth(_traffic(17, minutes=6, rate=10))
    half = len(events) // 2
    _create(b, unique, 2)
    log, outs = tmp_path / "run.log", [tmp_path / "before.jsonl", tmp_path / "after.jsonl"]
    before_cfg = write_config(tmp_path / "before.toml", bootstrap=b, prefix=unique, windows=("1m", "5m"),
                              checkpoint_interval="300ms")
    proc = start_run(before_cfg, outs[0], log)
    try:
        wait_consuming(log, 0, procs=(proc,))
        _produce(b, unique, events[:half], close=False, partitions=2)
        wait_for(lambda: any(k[0] == "1m" for k in _windows_by_identity(outs[0])), timeout=120,
                 what="1m windows of the first half (consumption under way)", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]  # SIGTERM: the last checkpoint is committed
    after_cfg = write_config(tmp_path / "after.toml", bootstrap=b, prefix=unique, windows=("1m", "10m"),
                             checkpoint_interval="300ms")
    seen = consuming_count(log)
    proc = start_run(after_cfg, outs[1], log)
    cut_ms = max(e.ts_ms for e in events[:half])
    # 1m windows starting past every first-half event plus the attribution window and the disorder
    # hold requests whose impressions and clicks all come after the restart: exact.
    want = {k: v for k, v in expected_windows(rows, windows=("1m", "10m"), partitions=2).items()
            if k[0] == "1m" and datetime.fromisoformat(k[1].replace("Z", "+00:00")).timestamp() * 1000
            >= cut_ms + 60_000 + 10_000}
    assert len(want) >= 2
    try:
        wait_consuming(log, seen, procs=(proc,))
        _produce(b, unique, events[half:], close=True, partitions=2)
        wait_for(lambda: set(want) <= set(_windows_by_identity(outs[1]))
                 and any(k[0] == "10m" for k in _windows_by_identity(outs[1])), timeout=120,
                 what="the 1m windows after the restart and a 10m window", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    _assert_matches(_windows_by_identity(outs[1]), want)
    text = log.read_text(errors="replace")
    warned = [line for line in text.splitlines() if "configuration changed since the checkpoint" in line]
    assert len(warned) == 1 and " WARNING " in warned[0], warned
    assert "windows=['1m', '5m'], now ['1m', '10m']" in warned[0], warned[0]
    assert "Traceback" not in text and "core process: restore failed" not in text, text[-3000:]
