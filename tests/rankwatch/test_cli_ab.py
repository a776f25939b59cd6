"""``rankwatch ab`` against independent oracles: naive per-request metrics with scipy's Welch test and
chi-square, a naive Benjamini-Hochberg, the user-level linearisation by hand, and the log path against the
generator's ground truth."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from rankwatch.cli import main
from rankwatch.pipeline.traffic.generator import TrafficConfig, evaluation_frame, generate_with_truth
from tests.pipeline import naive_metrics as naive
from tests.pipeline.experiments.test_abstats import _naive_bh


def _random_rows(seed: int, n_requests: int = 900) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_requests):
        n = int(rng.integers(1, 15))
        variant = "treatment" if rng.uniform() < 0.5 else "control"
        seg, surf = rng.choice(["a", "b", "c"]), rng.choice(["x", "y"])
        user = f"u{int(rng.integers(0, 150))}"
        for p in range(1, n + 1):
            rows.append({"request_id": f"r{r}", "item_id": f"i{p}", "position": p,
                         "score": float(np.round(rng.normal(), 1)), "label": int(rng.choice([0, 0, 0, 1, 2])),
                         "segment": seg, "surface": surf, "variant": variant, "user_id": user})
    return pd.DataFrame(rows)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ab", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _per_request(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    out = []
    for rid, g in frame.sort_values(["request_id", "position"]).groupby("request_id", sort=False):
        labels = g["label"].tolist()
        value = naive.ndcg(labels, 10) if metric == "ndcg@10" else naive.reciprocal_rank(labels)
        first = g.iloc[0]
        out.append({"request_id": rid, "value": value, "segment": first["segment"], "surface": first["surface"],
                    "variant": first["variant"], "user_id": first["user_id"]})
    return pd.DataFrame(out).dropna(subset=["value"])


def _find(doc: dict, metric: str, segment: str, surface: str) -> dict:
    return next(c for c in doc["comparisons"]
                if c["metric"] == metric and c["segment"] == segment and c["surface"] == surface)


@pytest.mark.parametrize("seed", [0, 1])
def test_request_level_matches_scipy_welch_bh_and_chisquare(tmp_path: Path, capsys, seed: int) -> None:
    frame = _random_rows(seed)
    path = tmp_path / "rows.csv"
    frame.to_csv(path, index=False)
    doc = _run(capsys, str(path), "--decision", "fixed", "--min-requests", "2", "--min-positives", "2",
               "--min-negatives", "2")
    counts = frame.drop_duplicates("request_id")["variant"].value_counts()
    ref = stats.chisquare([counts["control"], counts["treatment"]])
    assert doc["srm"]["p_value"] == pytest.approx(ref.pvalue, abs=1e-9)
    assert doc["srm"]["observed"] == {"control": counts["control"], "treatment": counts["treatment"]}
    for metric in ("ndcg@10", "mrr"):
        per = _per_request(frame, metric)
        cells = [("all", "all")] + sorted({(s, f) for s, f in zip(per["segment"], per["surface"], strict=True)})
        fixed_p = []
        for seg, surf in cells:
            sel = per if seg == "all" else per[(per["segment"] == seg) & (per["surface"] == surf)]
            t, c = sel[sel["variant"] == "treatment"]["value"], sel[sel["variant"] == "control"]["value"]
            res = stats.ttest_ind(t, c, equal_var=False)
            got = _find(doc, metric, seg, surf)
            assert got["n"] == len(t) and got["n_control"] == len(c)
            assert got["diff"] == pytest.approx(t.mean() - c.mean(), abs=1e-12)
            assert got["p_value_fixed"] == pytest.approx(res.pvalue, abs=1e-9)
            ci = res.confidence_interval(0.95)
            assert got["diff_ci"] == pytest.approx([ci.low, ci.high], abs=1e-9)
            assert got["lift"] == pytest.approx(t.mean() / c.mean() - 1, abs=1e-12)
            assert got["p_value"] == got["p_value_fixed"]
            fixed_p.append(res.pvalue)
        adjusted = _naive_bh(fixed_p[1:])
        for (seg, surf), adj in zip(cells[1:], adjusted, strict=True):
            assert _find(doc, metric, seg, surf)["p_adjusted"] == pytest.approx(adj, abs=1e-9)
        assert _find(doc, metric, "all", "all")["p_adjusted"] == pytest.approx(fixed_p[0], abs=1e-9)


def test_user_unit_matches_the_linearised_welch_by_hand(tmp_path: Path, capsys) -> None:
    frame = _random_rows(3, 1200)
    path = tmp_path / "rows.jsonl"
    frame.to_json(path, orient="records", lines=True)
    doc = _run(capsys, str(path), "--unit", "user", "--by", "segment", "--decision", "fixed", "--min-requests", "2")
    per = _per_request(frame, "ndcg@10")
    for seg in ("all", "a", "b", "c"):
        sel = per if seg == "all" else per[per["segment"] == seg]
        z = {}
        for arm in ("treatment", "control"):
            g = sel[sel["variant"] == arm].groupby("user_id")["value"].agg(["sum", "count"])
            r = g["sum"].sum() / g["count"].sum()
            z[arm] = r + (g["sum"] - r * g["count"]) / g["count"].mean()  # mean r, the linearised spread
        res = stats.ttest_ind(z["treatment"], z["control"], equal_var=False)
        got = next(c for c in doc["comparisons"] if c["metric"] == "ndcg@10" and c["segment"] == seg)
        assert got["n"] == len(z["treatment"]) and got["unit"] == "user"
        assert got["diff"] == pytest.approx(z["treatment"].mean() - z["control"].mean(), abs=1e-12)
        assert got["p_value_fixed"] == pytest.approx(res.pvalue, abs=1e-9)
    users = frame.drop_duplicates(["variant", "user_id"])["variant"].value_counts()
    assert doc["srm"]["observed"] == {"control": users["control"], "treatment": users["treatment"]}


def _planted(frame: pd.DataFrame, segment: str, share: float, seed: int) -> pd.DataFrame:
    """Treatment requests of ``segment``: with probability ``share`` served in reverse order."""
    rng = np.random.default_rng(seed)
    out = frame.copy()
    hit = out[(out["variant"] == "treatment") & (out["segment"] == segment)]["request_id"].unique()
    hit = set(hit[rng.uniform(size=hit.size) < share])
    rows = out["request_id"].isin(hit)
    n = out.groupby("request_id")["position"].transform("max")
    out.loc[rows, "position"] = n[rows] + 1 - out.loc[rows, "position"]
    return out


def test_held_out_rows_with_and_without_a_planted_effect(tmp_path: Path, capsys) -> None:
    base = evaluation_frame(TrafficConfig(seed=42), 24_000)
    clean, planted = tmp_path / "aa.parquet", tmp_path / "ab.parquet"
    base.to_parquet(clean)
    _planted(base, "new_user", 0.5, 1).to_parquet(planted)
    aa = _run(capsys, str(clean))
    assert {c["verdict"] for c in aa["comparisons"]} == {"inconclusive"}
    assert not aa["srm"]["mismatch"]
    ab = _run(capsys, str(planted))
    rank_metrics = ("mrr", "ndcg@5", "ndcg@10", "map@10")
    for c in ab["comparisons"]:
        if c["metric"] in rank_metrics and c["segment"] in ("new_user", "all"):
            assert c["verdict"] == "worse", c
            assert c["lift_ci_sequential"][1] < 0
        elif c["metric"] in rank_metrics:
            assert c["verdict"] == "inconclusive", c


def test_broken_split_is_flagged(tmp_path: Path, capsys) -> None:
    frame = evaluation_frame(TrafficConfig(seed=5), 6_000)
    ids = frame.drop_duplicates("request_id")
    drop = set(ids[ids["variant"] == "treatment"]["request_id"].iloc[::8])
    path = tmp_path / "rows.csv"
    frame[~frame["request_id"].isin(drop)].to_csv(path, index=False)
    doc = _run(capsys, str(path))
    assert doc["srm"]["mismatch"] and doc["srm"]["p_value"] < 0.001


def test_logs_equal_the_ground_truth_rows(tmp_path: Path, capsys) -> None:
    cfg = TrafficConfig(seed=9, duration_s=300, requests_per_second=12, duplicate_rate=0.05, malformed_rate=0.02,
                        out_of_order_ms=3000, item_form_share=0.1, orphan_rate=0.02, late_rate=0.02)
    events, truth = generate_with_truth(cfg)
    for stream in ("impressions", "clicks"):
        (tmp_path / f"{stream}.jsonl").write_bytes(b"".join(e.value + b"\n" for e in events if e.stream == stream))
    truth_path = tmp_path / "truth.parquet"
    truth.to_parquet(truth_path)
    opts = ("--min-requests", "50", "--min-positives", "20", "--min-negatives", "20")
    from_logs = _run(capsys, "--impressions", str(tmp_path / "impressions.jsonl"),
                     "--clicks", str(tmp_path / "clicks.jsonl"), *opts)
    from_rows = _run(capsys, str(truth_path), *opts)
    assert len(from_logs["comparisons"]) == len(from_rows["comparisons"]) > 0
    for a, b in zip(from_logs["comparisons"], from_rows["comparisons"], strict=True):
        for key, value in b.items():
            if isinstance(value, float):
                assert a[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
            elif isinstance(value, list):
                assert a[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
            else:
                assert a[key] == value, key
    assert from_logs["srm"] == from_rows["srm"]


@pytest.mark.parametrize(("args", "message"), [
    ((), "give evaluation rows"),
    (("--unit", "user"), "needs a user_id"),
    (("--unit", "team"), "Invalid value for '--unit'"),
    (("--alpha", "2"), "alpha: must be between 0 and 1"),
    (("--split", "control=1"), "split: needs a share for each arm"),
    (("--label", "segment"), "label: must be one of"),
    (("--experiment", "x"), "--experiment needs --config"),
    (("--start", "noon"), "start: not an RFC 3339 time"),
])  # fmt: skip
def test_bad_input_is_one_line(tmp_path: Path, capsys, args: tuple[str, ...], message: str) -> None:
    path = tmp_path / "rows.csv"
    # rows without user_id: the generator gives every request a user, these rows must lack it
    evaluation_frame(TrafficConfig(seed=1), 50).drop(columns=["request_ts", "user_id"]).to_csv(path, index=False)
    inputs = () if args == () else (str(path),)
    assert main(["ab", *inputs, *args]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_config_experiment_start_and_arms(tmp_path: Path, capsys) -> None:
    frame = evaluation_frame(replace(TrafficConfig(seed=2), variants=("a", "b", "c")), 3_000)
    path = tmp_path / "rows.csv"
    frame.to_csv(path, index=False)
    middle = frame["request_ts"].iloc[len(frame) // 2]
    config = tmp_path / "rw.toml"
    config.write_text(f'[[experiments]]\nname = "abc"\ncontrol = "a"\ntreatments = ["b"]\n'
                      f'start = "{middle.isoformat()}"\nmin_requests = 10\n', encoding="utf-8")
    doc = _run(capsys, str(path), "--config", str(config))
    firsts = frame.drop_duplicates("request_id")
    after = firsts[firsts["request_ts"] >= middle]
    assert doc["experiment"]["name"] == "abc"
    assert doc["experiment"]["requests"] == {arm: int((after["variant"] == arm).sum()) for arm in ("a", "b")}
    assert doc["experiment"]["other_arm_requests"] == int((firsts["variant"] == "c").sum())
    assert doc["experiment"]["before_start_requests"] == int(((firsts["request_ts"] < middle)
                                                              & (firsts["variant"] != "c")).sum())
    assert {c["treatment"] for c in doc["comparisons"]} == {"b"}
    assert not math.isnan(doc["srm"]["p_value"])


def test_prometheus_source_equals_the_accumulated_report(capsys) -> None:
    """A fake Prometheus serving two instances' rankwatch_experiment_* samples through /api/v1/query."""
    from rankwatch.exporters.experiments import ExperimentCollector
    from rankwatch.pipeline.experiments.online import ExperimentAccumulator
    from rankwatch.pipeline.experiments.report import experiment_report
    from rankwatch.pipeline.experiments.spec import ExperimentSpec
    from tests.exporters.test_experiments import _published

    spec = ExperimentSpec(name="exp", min_requests=100)
    by = ("segment", "surface", "variant")
    options = __import__("rankwatch.pipeline.metrics.options", fromlist=["MetricOptions"]).MetricOptions()
    whole = ExperimentAccumulator(spec, options, slice_by=by, window="5m")
    instances = [ExperimentCollector([ExperimentAccumulator(spec, options, slice_by=by, window="5m")]) for _ in "ab"]
    for i, pw in enumerate(_published(8)):
        whole.add(pw)
        instances[i % 2].publish_window(pw)
    doc = _ab_against_fake_prometheus(capsys, _scraped(instances))
    expected = experiment_report(whole.data())
    assert doc["srm"]["observed"] == expected["srm"]["observed"]
    want = {(c["metric"], c["segment"], c["surface"]): c for c in expected["comparisons"]}
    got = [c for c in doc["comparisons"] if not c["metric"].startswith("auc")]
    assert len(got) == sum(1 for c in expected["comparisons"] if not c["metric"].startswith("auc")) > 0
    for c in got:
        ref = want[(c["metric"], c["segment"], c["surface"])]
        for key in ("n", "n_control", "mean", "diff", "lift", "p_value", "p_adjusted", "verdict", "lift_ci_sequential"):
            assert c[key] == (pytest.approx(ref[key], rel=1e-9, abs=1e-12) if isinstance(ref[key], float | list)
                              else ref[key]), key
    assert all(c["verdict"] == "insufficient data" for c in doc["comparisons"] if c["metric"].startswith("auc"))


def test_prometheus_unreachable_is_one_line(capsys) -> None:
    assert main(["ab", "--prometheus", "http://127.0.0.1:9"]) != 0
    err = capsys.readouterr().err.strip()
    assert "cannot query Prometheus" in err and "\n" not in err


def _ab_against_fake_prometheus(capsys, samples: list[tuple[str, dict, float]]) -> dict:
    """``rankwatch ab --prometheus`` against a fake Prometheus serving ``samples`` through /api/v1/query."""
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
            family = q.split("{")[0]
            result = [{"metric": {"__name__": n, **lab}, "value": [0, repr(v)]} for n, lab, v in samples if n == family]
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        return _run(capsys, "--prometheus", f"http://127.0.0.1:{server.server_port}", "--min-requests", "100")
    finally:
        server.shutdown()
        server.server_close()


def _scraped(collectors: list) -> list[tuple[str, dict, float]]:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[tuple[str, dict, float]] = []
    for inst, collector in zip("abcdef", collectors, strict=False):
        registry = CollectorRegistry()
        registry.register(collector)
        for fam in text_string_to_metric_families(generate_latest(registry).decode()):
            samples += [(s.name, {**s.labels, "instance": inst, "job": "rankwatch"}, s.value) for s in fam.samples]
    return samples


def test_prometheus_source_of_a_user_unit_experiment_equals_the_processors_report(capsys) -> None:
    """Two instances (partition pairs keyed by user) export per-user sums; ``ab --prometheus`` reads them
    as unit = "user" and gives the report of one processor that saw everything."""
    import zlib

    from rankwatch.exporters.experiments import ExperimentCollector
    from rankwatch.pipeline.clock import ManualClock
    from rankwatch.pipeline.experiments.report import experiment_report
    from rankwatch.pipeline.experiments.spec import ExperimentSpec
    from rankwatch.pipeline.slicing import SliceSpec
    from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
    from rankwatch.pipeline.traffic.generator import ExperimentTraffic, TrafficConfig, generate_with_truth

    spec = ExperimentSpec(name="byuser", unit="user", min_requests=100)
    config = StreamConfig(windows=("5m",), slice_spec=SliceSpec(by=("segment", "surface", "variant")), experiments=(spec,))
    exp = ExperimentTraffic(effects=(("treatment", "new_user", -0.3),), users=200, user_effect_sd=0.1)
    events, truth = generate_with_truth(TrafficConfig(seed=9, duration_s=600, requests_per_second=8, experiment=exp))
    user_of = dict(zip(truth["request_id"], truth["user_id"], strict=True))
    whole = StreamProcessor(config, clock=ManualClock())
    pairs = [StreamProcessor(config, clock=ManualClock()) for _ in range(2)]
    for e in events:
        for proc in (whole, pairs[zlib.crc32(str(user_of.get(e.key.decode(), "")).encode()) % 2]):
            (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    collectors = []
    for proc in (whole, *pairs):
        proc.flush()
    for proc in pairs:
        c = ExperimentCollector(specs=[spec])
        c.set_parts({0: proc.stats().experiments})
        collectors.append(c)
    doc = _ab_against_fake_prometheus(capsys, _scraped(collectors))
    expected = experiment_report(whole.experiment_data("byuser"))
    assert doc["experiment"]["unit"] == "user" and doc["srm"]["observed"] == expected["srm"]["observed"]
    want = {(c["metric"], c["segment"], c["surface"]): c for c in expected["comparisons"]}
    got = [c for c in doc["comparisons"] if not c["metric"].startswith("auc")]
    assert len(got) == sum(1 for c in expected["comparisons"] if not c["metric"].startswith("auc")) > 0
    for c in got:
        ref = want[(c["metric"], c["segment"], c["surface"])]
        for key in ("unit", "n", "n_control", "mean", "diff", "lift", "p_value", "p_adjusted", "verdict",
                    "lift_ci_sequential"):
            assert c[key] == (pytest.approx(ref[key], rel=1e-9, abs=1e-12) if isinstance(ref[key], float | list)
                              else ref[key]), key
