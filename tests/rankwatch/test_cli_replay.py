"""``rankwatch replay`` end to end on generated logs: parity with the joined rows, files, errors."""

from __future__ import annotations

import functools
import gzip
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from rankwatch.cli import main
from rankwatch.pipeline.metrics.aggregates import RankingAggregate
from rankwatch.pipeline.metrics.clusters import MAX_BINS
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.metrics.result import result_document
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_with_truth

# AUC SEs of folded states (past 16,384 items, docs/metrics.md 4a): measured up to 1.5 % apart (AUC-PR,
# 19,120 items) between the stream and the rows at once; twice that is the bound.
AUC_SE_FOLDED_REL = 0.03
START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
CFG = TrafficConfig(seed=31, start=START, duration_s=2 * 3600, requests_per_second=0.25, duplicate_rate=0.05,
                    malformed_rate=0.05, out_of_order_ms=30_000, item_form_share=0.2, rfc3339_share=0.3,
                    orphan_rate=0.05, late_rate=0.05)


def oracle(rows: pd.DataFrame, by: tuple[str, ...], options: MetricOptions) -> dict:
    rows = rows.sort_values(["request_id", "position"])

    def agg(frame: pd.DataFrame) -> RankingAggregate:
        sizes = frame.groupby("request_id", sort=False).size().to_numpy()
        users = pd.factorize(frame.groupby("request_id", sort=False)["user_id"].first())[0]  # GAUC by user
        return RankingAggregate.from_lists(frame.label.to_numpy(float), frame.score.to_numpy(float),
                                           np.concatenate(([0], np.cumsum(sizes))), options, gauc_keys=users)

    slices = {}
    for key, frame in rows.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        slices[tuple(zip(by, key, strict=True))] = agg(frame)
    return result_document(agg(rows), slices)


def close(got: dict, want: dict) -> None:
    for g, w in [(got["overall"], want["overall"]), *zip(got["slices"], want["slices"], strict=True)]:
        assert set(g) == set(w)
        for k, v in w.items():
            if isinstance(v, float) and not k.startswith("auc"):
                assert g[k] == pytest.approx(v, abs=1e-9), k
            elif k == "stderr":  # same keys; floats up to summation order
                assert set(g[k]) == set(v)
                for name, se in v.items():
                    # AUC SEs are exact (summation order aside) within the 16,384-bin bound; a state past
                    # it folds, and the fold depends on the merge order (docs/metrics.md 4a).
                    folded = name.startswith("auc") and w["items"] > MAX_BINS
                    rel = AUC_SE_FOLDED_REL if folded else 1e-12
                    assert g[k][name] == (None if se is None else pytest.approx(se, rel=rel)), name
            else:
                assert g[k] == v, k


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    events, truth = generate_with_truth(CFG)
    d = tmp_path_factory.mktemp("logs")
    imp = d / "impressions.jsonl"
    imp.write_bytes(b"".join(e.value + b"\n" for e in events if e.stream == "impressions") + b"\n")
    clicks = [e.value for e in events if e.stream == "clicks"]
    half = len(clicks) // 2  # two click files, one gzip: the merge must interleave them by ts
    with gzip.open(d / "clicks-1.jsonl.gz", "wb") as f:
        f.write(b"".join(c + b"\n" for c in clicks[:half]))
    (d / "clicks-2.jsonl").write_bytes(b"".join(c + b"\n" for c in clicks[half:]))
    return d, truth, events


def test_replay_json_equals_offline_on_joined_rows(logs, capsys):
    d, truth, events = logs
    rc = main(["replay", "--impressions", str(d / "impressions.jsonl"),
               "--clicks", f"{d / 'clicks-1.jsonl.gz'},{d / 'clicks-2.jsonl'}", "--format", "json",
               "--windows-out", str(d / "windows.jsonl"), "--dead-letter", str(d / "dead.jsonl")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    close(doc, oracle(truth, ("segment", "surface"), MetricOptions()))
    assert "accepted" in out.err and "duplicate" in out.err and "orphan" in out.err  # summary on stderr
    windows = [json.loads(x) for x in (d / "windows.jsonl").read_text().splitlines()]
    hours = [w for w in windows if w["window"] == "1h"]
    assert len(hours) >= 2 and sum(w["overall"]["requests"] for w in hours) == truth.request_id.nunique()
    for w in hours:
        start, end = pd.Timestamp(w["start"]), pd.Timestamp(w["end"])
        assert end - start == pd.Timedelta(hours=1) and start.minute == 0
        close(w, oracle(truth[(truth.request_ts >= start) & (truth.request_ts < end)], ("segment", "surface"),
                        MetricOptions()))
    dead = [json.loads(x) for x in (d / "dead.jsonl").read_text().splitlines()]
    n_bad = sum(b"bad-" in e.value or not e.value.startswith(b"{") for e in events)
    assert dead and len(dead) >= n_bad * 0.9
    assert {x["stream"] for x in dead} == {"impressions", "clicks"} and all(x["reason"] for x in dead)


def test_replay_options_and_table(logs, capsys):
    d, truth, _ = logs
    rc = main(["replay", "--impressions", str(d / "impressions.jsonl"), "--clicks", str(d / "clicks-1.jsonl.gz"),
               "--clicks", str(d / "clicks-2.jsonl"), "--by", "variant", "--k", "3", "--window", "30m",
               "--format", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    doc = json.loads(out.out)
    assert set(doc["overall"]) >= {"ndcg@3", "map@3"} and "ndcg@5" not in doc["overall"]
    close(doc, oracle(truth, ("variant",), MetricOptions(ndcg_cutoffs=(3,), map_cutoffs=(3,))))
    rc = main(["replay", "--impressions", str(d / "impressions.jsonl"), "--clicks", str(d / "clicks-2.jsonl")])
    out = capsys.readouterr()
    assert rc == 0 and "overall" in out.out and "replay:" in out.out


def test_unreadable_ts_lines_are_dead_lettered_not_lost(tmp_path, capsys):
    imp = tmp_path / "i.jsonl"
    imp.write_text('{"event_id": "e", "request_id": "r", "ts": "never", "item_id": "a", "position": 1, "score": 1}\n'
                   "garbage\n"
                   '{"event_id": "f", "request_id": "r2", "ts": 1796032800000, "item_id": "a", "position": 1, "score": 1}\n')
    dead = tmp_path / "dead.jsonl"
    assert main(["replay", "--impressions", str(imp), "--dead-letter", str(dead), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["overall"]["requests"] == 1
    reasons = sorted(json.loads(x)["reason"] for x in dead.read_text().splitlines())
    assert reasons == ["bad_timestamp", "invalid_json"]


@pytest.mark.parametrize(("args", "message"), [
    (["--impressions", "/nonexistent.jsonl"], "no such file"),
    (["--clicks", "__FILE__"], "at least one --impressions"),
    (["--impressions", "__FILE__", "--window", "5x"], "duration"),
    (["--impressions", "__FILE__", "--by", "colour"], "colour"),
    (["--impressions", "__FILE__", "--k", "0"], "cut-off"),
])
def test_bad_command_line_is_one_line(tmp_path, capsys, args, message):
    f = tmp_path / "x.jsonl"
    f.write_text("")
    rc = main(["replay", *[str(f) if a == "__FILE__" else a for a in args]])
    err = capsys.readouterr().err
    assert rc != 0 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_corrupt_gzip_is_one_line(tmp_path: Path, capsys):
    f = tmp_path / "x.jsonl.gz"
    f.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
    rc = main(["replay", "--impressions", str(f)])
    err = capsys.readouterr().err
    assert rc != 0 and "cannot read" in err and len(err.strip().splitlines()) == 1


def test_replay_equals_offline_for_the_issue_13_metrics(logs, capsys):
    """P/R/hit rate, GAUC by user, positive rate and click-through by rank: replay == offline on the joined rows."""
    from rankwatch.pipeline.offline.baseline import compute_baseline

    d, truth, _ = logs
    rc = main(["replay", "--impressions", str(d / "impressions.jsonl"), "--clicks", str(d / "clicks-1.jsonl.gz"),
               "--clicks", str(d / "clicks-2.jsonl"), "--format", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    got = json.loads(out.out)
    want = compute_baseline(truth.drop(columns=["request_ts"])).document()
    keys = [*MetricOptions().rank_metric_names[4:], "gauc", "gauc_groups", "gauc_groups_excluded", "positive_rate",
            "positives", "position_ctr", "position_shown"]
    pairs = [(got["overall"], want["overall"]), *zip(got["slices"], want["slices"], strict=True)]
    assert want["overall"]["gauc"] is not None and want["overall"]["gauc_groups"] > 100
    for g, w in pairs:
        for k in keys:
            assert g[k] == (pytest.approx(w[k], abs=1e-12) if isinstance(w[k], float | list) else w[k]), k


def _replay_outputs(d: Path, out: Path, capsys, clicks: tuple[str, ...] = ("clicks-1.jsonl.gz", "clicks-2.jsonl"),
                    ) -> tuple[str, str, str, str]:
    rc = main(["replay", "--impressions", str(d / "impressions.jsonl"), *(a for c in clicks for a in ("--clicks", str(d / c))),
               "--format", "json", "--window", "10m",
               "--windows-out", str(out / "windows.jsonl"), "--dead-letter", str(out / "dead.jsonl")])
    got = capsys.readouterr()
    assert rc == 0, got.err
    return got.out, got.err, (out / "windows.jsonl").read_text(), (out / "dead.jsonl").read_text()


@pytest.mark.parametrize("prefix", ["as the reader decides", "random prefixes"])
def test_rows_made_by_the_reader_give_the_in_process_replay(logs, tmp_path, capsys, monkeypatch, prefix):
    """The log reader's process decodes and packs (a prefix of) each batch, the core the rest: the same result
    document, windows, counts and dead letters as the replay in one process, on logs with duplicates, bad
    lines, item-form and RFC 3339 impressions, orphans and late events."""
    import random

    import rankwatch.commands.log_reader as log_reader
    import rankwatch.commands.replay as replay_module

    d, _, _ = logs
    monkeypatch.setattr(log_reader, "open_merge", functools.partial(log_reader.open_merge, chunk_bytes=1 << 14))
    if prefix == "random prefixes":  # the reader stops at any point of a batch (as when the core waits)
        rng = random.Random(5)
        monkeypatch.setattr(replay_module, "_PREPARE_STEP", 7)
        monkeypatch.setattr(replay_module, "_rows_until", functools.partial(_random_prefix, replay_module._rows_until,
                                                                            rng))
    (tmp_path / "child").mkdir()
    (tmp_path / "inline").mkdir()
    child = _replay_outputs(d, tmp_path / "child", capsys)
    monkeypatch.setenv("RANKWATCH_LOG_READER", "inline")
    inline = _replay_outputs(d, tmp_path / "inline", capsys)
    assert child == inline
    assert json.loads(child[0])["overall"]["requests"] > 100 and child[3].count("\n") > 20  # it had work


@pytest.mark.parametrize("decisions", ["as the reader decides", "random", "always ahead"])
def test_rows_made_as_the_lines_are_read_give_the_in_process_replay(logs, tmp_path, capsys, monkeypatch, decisions):
    """One file a stream: the reader makes a chunk's rows as it reads it (and takes the times from them) while
    it is ahead, and only reads the times once the core waits, the core then making that kind's rows
    (rankwatch/commands/rows_as_read.py). The same outputs as the replay in one process, also where clean rows are
    second impressions of a pending request or the same line twice (the core takes their lines)."""
    import random

    import rankwatch.commands.log_reader as log_reader
    from rankwatch.commands.rows_as_read import RowsAsRead

    d, _, _ = logs
    one = tmp_path / "clicks.jsonl"  # both click files as one: the clicks as generated
    one.write_bytes(gzip.decompress((d / "clicks-1.jsonl.gz").read_bytes()) + (d / "clicks-2.jsonl").read_bytes())
    lines = (d / "impressions.jsonl").read_bytes().splitlines(keepends=True)
    again = []  # a second list of a request a few lines on, under a new event id; every 11th line twice
    for i, line in enumerate(lines):
        again.append(line)
        if i % 11 == 0:
            again.append(line)
        if i % 7 == 3 and i + 3 < len(lines) and b'"items"' in lines[i]:
            again.append(lines[i].replace(b'"event_id":"', b'"event_id":"second-', 1))
    assert sum(b"second-" in line for line in again) > 20
    (tmp_path / "impressions.jsonl").write_bytes(b"".join(again))
    monkeypatch.setattr(log_reader, "open_merge", functools.partial(log_reader.open_merge, chunk_bytes=1 << 13))
    taken = tmp_path / "taken"
    take = RowsAsRead.take

    def recording(self, kinds, caught_up):  # type: ignore[no-untyped-def]
        if decisions == "random":  # the reader is ahead, or not, at random
            rng = random.Random(len(kinds))
            caught_up = lambda: rng.random() < 0.5  # noqa: E731
        elif decisions == "always ahead":  # every chunk's rows made as read: no line sent that is not vouched for
            caught_up = lambda: False  # noqa: E731
        packed = take(self, kinds, caught_up)
        with taken.open("a") as f:
            f.write(f"{None if packed is None else packed.missing}\n")
        return packed

    monkeypatch.setattr(RowsAsRead, "take", recording)
    (tmp_path / "child").mkdir()
    (tmp_path / "inline").mkdir()
    child = _replay_outputs(tmp_path, tmp_path / "child", capsys, clicks=("clicks.jsonl",))
    made = taken.read_text().split()
    if decisions != "always ahead":
        assert {"0", "None"} <= set(made) and len(made) > 20  # batches the reader made, batches the core made
    assert decisions != "random" or {"1", "2"} <= set(made)  # and batches with one kind made by each
    monkeypatch.setenv("RANKWATCH_LOG_READER", "inline")
    inline = _replay_outputs(tmp_path, tmp_path / "inline", capsys, clicks=("clicks.jsonl",))
    assert child == inline
    assert json.loads(child[0])["overall"]["requests"] > 100 and child[3].count("\n") > 20  # it had work


def _random_prefix(rows_until, rng, spec, user_keys, kinds, values, caught_up):  # type: ignore[no-untyped-def]
    stop_after = rng.randrange(len(values) // 7 + 2)  # looks at caught_up before each part of 7 records
    looks = iter(range(10**9))
    return rows_until(spec, user_keys, kinds, values, lambda: next(looks) >= stop_after)


def test_kept_translations_are_handed_on_once_each() -> None:
    """Each line's translation is made once (when its time is read) and handed on with its batch; a line object
    read twice (CPython shares one-byte strings: the same object in two streams) is translated again; nothing
    stays kept."""
    from rankwatch.commands.replay import KeptTranslations
    from rankwatch.pipeline.events.logs import NO_TS
    from rankwatch.pipeline.events.translate import Translator

    class Doubling:
        calls = 0
        event_ts_many = Translator.event_ts_many  # the times (and the translations kept) as a Translator reads them

        def translate(self, stream: str, raw: bytes) -> list[bytes]:
            self.calls += 1
            if raw.startswith(b"{"):
                return [raw, raw]  # two events: the first one's time orders the line
            return [b'{"ts": %d, "s": "%s"}' % (int(raw), stream.encode())]

    translator = Doubling()
    kept = KeptTranslations(translator)
    one = b"7"  # a one-byte bytes object: shared by every line that is "7"
    imp_lines, clk_lines = [one, b"12", b'{"ts": 3}'], [one, b"40"]
    assert kept.ts_of("impressions", imp_lines).tolist() == [7, 12, 3]
    assert kept.ts_of("clicks", clk_lines).tolist() == [7, 40]
    assert translator.calls == 5
    taken = kept.take([True, False, True, False, True], [imp_lines[0], clk_lines[0], imp_lines[1], clk_lines[1],
                                                        imp_lines[2]])
    assert taken.single is None and taken.each == [
        [b'{"ts": 7, "s": "impressions"}'], [b'{"ts": 7, "s": "clicks"}'], [b'{"ts": 12, "s": "impressions"}'],
        [b'{"ts": 40, "s": "clicks"}'], [b'{"ts": 3}', b'{"ts": 3}']]
    assert translator.calls == 5 and not kept._kept  # each kept once, by (line, stream)
    assert kept.take([True], [b"9"]).single == [b'{"ts": 9, "s": "impressions"}'] and translator.calls == 6
    assert kept.ts_of("clicks", [b"not a number"[:0] + b"{}"]).tolist() == [NO_TS]


def test_without_windows_out_the_smaller_windows_are_counted_and_the_result_is_the_same(logs, tmp_path, capsys):
    """Without ``--windows-out`` only the largest windows are summed (the result document reads no other); the
    document and the summary (windows published of every size) are those of the replay that writes them all."""
    d, _, _ = logs
    args = ["replay", "--impressions", str(d / "impressions.jsonl"), "--clicks", str(d / "clicks-2.jsonl"),
            "--format", "json", "--window", "10m,1h"]
    assert main([*args, "--windows-out", str(tmp_path / "windows.jsonl")]) == 0
    written = capsys.readouterr()
    assert main(args) == 0
    counted = capsys.readouterr()
    assert counted.out == written.out and counted.err == written.err
    sizes = [json.loads(line)["window"] for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert sizes.count("10m") > sizes.count("1h") > 0
    assert f"windows published: 10m {sizes.count('10m')}, 1h {sizes.count('1h')}" in counted.err


def test_the_core_needs_a_batchs_lines_only_where_its_rows_do_not_cover_them() -> None:
    """The reader keeps a batch's lines (sends only their number) only when the rows it made are clean rows of
    every line and vouched for (none a second impression of a request the core may hold, none at its pending cap:
    rankwatch/commands/rows_as_read.py): a line left to the per-record path, rows of the first lines only, none, rows
    not vouched for, or a team's schema (its dead letters keep the lines) need them."""
    from rankwatch.commands.replay import _lines_needed
    from rankwatch.pipeline.stream.config import StreamConfig
    from rankwatch.pipeline.stream.prepare import BatchSpec, prepare_rows

    spec = BatchSpec.of(StreamConfig())
    imp = json.dumps({"event_id": "e1", "request_id": "r1", "ts": 1, "items": [
        {"item_id": "a", "position": 1, "score": 0.5}]}).encode()
    clk = json.dumps({"event_id": "e2", "request_id": "r1", "item_id": "a", "ts": 2, "action": "click"}).encode()
    kinds, clean = [True, False], [imp, clk]

    def rows(kinds: list[bool], values: list[bytes]) -> Any:
        return prepare_rows(spec, kinds, values).packed()._replace(vouched=True)  # as the reader hands them on

    assert not _lines_needed((None, rows(kinds, clean)), 2)
    assert _lines_needed((None, rows(kinds, clean)._replace(vouched=False)), 2)  # maybe a repeat
    assert _lines_needed((None, rows(kinds, [imp, b"{not json"])), 2)  # a bad line: per record
    assert _lines_needed((None, rows(kinds, [b"{", clk])), 2)
    assert _lines_needed((None, rows(kinds[:1], clean[:1])), 2)  # rows of the first line only
    assert _lines_needed((None, None), 2)
    assert _lines_needed((object(), rows(kinds, clean)), 2)  # translated: a team's schema


def test_the_script_ends_without_teardown_and_loses_no_output(logs, tmp_path, capsys):
    """``python -m rankwatch replay`` ends without the interpreter's teardown once it succeeded (cli.skip_teardown):
    its stdout, summary, --windows-out and --dead-letter files are those of the replay run in-process, whole."""
    import subprocess
    import sys

    d, _, _ = logs
    args = ["replay", "--impressions", str(d / "impressions.jsonl"),
            "--clicks", f"{d / 'clicks-1.jsonl.gz'},{d / 'clicks-2.jsonl'}", "--format", "json"]
    outputs = {}
    for way in ("script", "in-process"):
        files = ["--windows-out", str(tmp_path / f"w-{way}.jsonl"), "--dead-letter", str(tmp_path / f"d-{way}.jsonl")]
        if way == "script":
            done = subprocess.run([sys.executable, "-m", "rankwatch", *args, *files], capture_output=True, text=True,
                                  timeout=300)
            rc, out, err = done.returncode, done.stdout, done.stderr
        else:
            rc = main([*args, *files])
            captured = capsys.readouterr()
            out, err = captured.out, captured.err
        assert rc == 0, err
        outputs[way] = (out, err, (tmp_path / f"w-{way}.jsonl").read_text(), (tmp_path / f"d-{way}.jsonl").read_text())
    assert outputs["script"] == outputs["in-process"]
    assert outputs["script"][0].endswith("}\n") and outputs["script"][2] and outputs["script"][3]


def test_an_in_process_replay_keeps_nothing_alive(tmp_path, capsys):
    """skip_teardown's holder is for the script only (it ends with os._exit): a replay run by main() in-process
    leaves its processor to be freed as usual."""
    import rankwatch.cli as cli

    examples = Path(__file__).resolve().parents[2] / "examples"
    assert main(["replay", "--impressions", str(examples / "impressions.jsonl"), "--clicks",
                 str(examples / "clicks.jsonl"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["requests"] > 100
    assert cli._SKIP_TEARDOWN and not cli._STANDALONE and not cli._KEPT
