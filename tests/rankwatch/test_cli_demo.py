"""``rankwatch demo``: smoke test over HTTP, clean exit on SIGTERM / Ctrl-C, one-line errors."""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rankwatch.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rankwatch.cli", "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _scrape(port: int) -> dict[str, list[dict[str, str]]] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append({**sample.labels, "__value__": repr(sample.value)})
    return out


def _worst_segment(series: dict[str, list[dict[str, str]]]) -> str:
    drift = series["rankwatch_ranking_quality_drift"]
    ndcg = [
        (float(s["__value__"]), s["segment"])
        for s in drift
        if s["metric"] == "ndcg@10" and s["window"] == "5m"
    ]
    return min(ndcg)[1]


def _wait_for_server(proc: subprocess.Popen[str], port: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if _scrape(port) is not None:
            return
        time.sleep(0.2)
    raise AssertionError("the demo never served /metrics")


def test_demo_serves_online_offline_and_drift_then_exits_0(tmp_path: Path) -> None:
    port = _free_port()
    windows_out = tmp_path / "windows.jsonl"
    ledger = tmp_path / "ledger.jsonl"
    # The regression starts 5 event minutes in, so it is in every window after the first even on a busy machine.
    proc = _start(
        "--duration", "20", "--port", str(port), "--windows-out", str(windows_out), "--regression-at", "5m",
        "--ledger", str(ledger),
    )
    try:
        _wait_for_server(proc, port)
        seen: dict[str, list[dict[str, str]]] = {}
        worst: list[str] = []
        while proc.poll() is None:
            series = _scrape(port)
            if series and series.get("rankwatch_ranking_quality_drift"):
                seen = series
                worst.append(_worst_segment(series))
            time.sleep(0.5)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    quality = seen.get("rankwatch_ranking_quality", [])
    sources = {(s["source"], s["window"]) for s in quality}
    assert ("online", "5m") in sources and ("offline", "baseline") in sources
    drift = seen["rankwatch_ranking_quality_drift"]
    # Every demo slice (3 segments x 2 surfaces x 2 variants) and the overall slice has a drift value.
    slices = {(s["segment"], s["surface"], s["variant"]) for s in drift if s["window"] == "5m"}
    assert len(slices) >= 13 and ("all", "all", "all") in slices
    assert any(s["source"] == "online" for s in seen["rankwatch_ranking_requests"])
    assert seen.get("rankwatch_rejected_events_total"), "the demo's few malformed events are counted by reason"
    # The injected regression (new_user) shows as the worst drift.
    assert worst[-1] == "new_user", worst
    lines = [json.loads(line) for line in windows_out.read_text().splitlines()]
    assert lines and {"window", "start", "end", "overall", "slices"} <= set(lines[0])
    assert "windows published" in out
    # Model versions (on by default): 8 in the history, more as event time passes, served as transfer gauges.
    assert len(ledger.read_text().splitlines()) > 8 * 4
    slopes = {(s["segment"], s["estimator"]) for s in seen["rankwatch_transfer_slope"]}
    assert ("new_user", "corrected") in slopes and ("all", "ols") in slopes
    assert seen["rankwatch_transfer_offline_diff"] and "transfer ndcg@10 corrected slope" in out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_exits_cleanly_on_signals(sig: signal.Signals) -> None:
    port = _free_port()
    proc = _start("--port", str(port))
    try:
        _wait_for_server(proc, port)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "interrupted" in out
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "0"], "--speed must be positive"),
        (["--regression-at", "soon"], "--regression-at: not a duration"),
        (["--regression-drop", "2"], "--regression-drop must be between 0 and 1"),
        (["--duration", "-1"], "--duration must be positive"),
        (["--regression-segment", "vip"], "--regression-segment must be one of new_user"),
        (["--version-every", "0"], "--version-every must be positive"),
    ],
)
def test_demo_bad_options_are_one_line_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_demo_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "rankwatch.cli", "demo", "--duration", "5", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("rankwatch: error: demo: cannot listen on 127.0.0.1:")
    assert proc.stderr.count("\n") == 1


def test_demo_shows_the_experiment_and_a_broken_split() -> None:
    # The demo's pace is wall time, so how much traffic it has seen after N seconds depends on the
    # machine's load: read its experiment lines as they come until the verdict is in, up to a deadline.
    proc = _start("--duration", "600", "--port", "0", "--speed", "400", "--regression-segment", "",
                  "--experiment-effect", "treatment:new_user:-0.3", "--broken-split", "0.15")
    assert proc.stdout is not None
    seen: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [seen.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + 240
    last = ""
    try:
        while time.monotonic() < deadline:
            try:
                line = seen.get(timeout=1.0)
            except queue.Empty:
                assert proc.poll() is None, proc.communicate()
                continue
            if line.startswith("experiment ndcg@10 lift"):
                last = line.strip()
                if "MISMATCH" in last and "worse in new_user" in last:
                    break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "MISMATCH" in last and "worse in new_user" in last, f"within 240 s the last experiment line was {last!r}"
    assert "returning" not in last and "power_user" not in last
