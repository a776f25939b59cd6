"""Fleet-exact experiments on a real broker and a real Prometheus: one ``rankwatch run`` instance and two
instances sharing the partitions give the same recorded lift and intervals (to 1e-9), and both equal
``rankwatch ab`` on the ground truth; a ``unit = "user"`` experiment's rules agree across the setups too."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kafka import KafkaProducer
from kafka_helpers import ROOT, start_run, stop_run, wait_for, write_config

from rankwatch.consumers.producer import produce_events, window_closers
from rankwatch.consumers.topics import ensure_topic
from rankwatch.pipeline.experiments.data import experiment_cells
from rankwatch.pipeline.experiments.report import experiment_report
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.offline.readers import validate_evaluation_frame
from rankwatch.pipeline.traffic.generator import ExperimentTraffic, TrafficConfig, generate_with_truth

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
pytestmark = [pytest.mark.kafka, pytest.mark.prometheus,
              pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus is not installed")]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "rankwatch-experiments.yml"
CHECKED = ("rankwatch:experiment_lift:ratio", "rankwatch:experiment_lift_fixed:lower",
           "rankwatch:experiment_lift_fixed:upper", "rankwatch:experiment_lift_sequential:lower",
           "rankwatch:experiment_lift_sequential:upper", "rankwatch:experiment_diff:value")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return list(json.loads(resp.read())["data"]["result"])
    except OSError:
        return []


def _config(tmp: Path, name: str, bootstrap: str, prefix: str, port: int) -> Path:
    extra = f"""[slices]
by = ["segment", "surface", "variant"]
[[experiments]]
name = "{name}"
min_requests = 50
[[experiments]]
name = "{name}_user"
unit = "user"
min_requests = 50
"""
    path = write_config(tmp / f"{name}-{port}.toml", bootstrap=bootstrap, prefix=prefix, extra=extra,
                        checkpoint_interval="500ms")
    text = path.read_text().replace("[exporter]\nenabled = false", f"[exporter]\nenabled = true\nport = {port}")
    text = text.replace(f'group_id = "{prefix}-group"', f'group_id = "{prefix}-{name}"')
    path.write_text(text)
    return path


def test_one_and_two_instances_record_the_same_lift(kafka_broker: Any, unique: str, tmp_path: Path) -> None:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    cfg = TrafficConfig(seed=44, start=start, requests_per_second=10, duration_s=240, items_per_request=10,
                        attribution_window_ms=60_000, duplicate_rate=0.02, out_of_order_ms=2000,
                        experiment=ExperimentTraffic(effects=(("treatment", "new_user", -0.3),), users=300))
    events, truth = generate_with_truth(cfg)
    b = kafka_broker.bootstrap
    for t in ("imp", "clk"):
        ensure_topic({"bootstrap_servers": [b]}, f"{unique}-{t}", partitions=4)
    producer = KafkaProducer(bootstrap_servers=b, acks="all", linger_ms=20)
    topics = {"impressions": f"{unique}-imp", "clicks": f"{unique}-clk"}
    try:
        produce_events(producer, events, topics=topics)
        last = max(e.ts_ms for e in events)
        produce_events(producer, window_closers(4, last + 2 * 3_600_000, record_ts_ms=last + 1), topics=topics)
    finally:
        producer.close()
    n_requests = truth["request_id"].nunique()

    ports = {"one": [_port()], "two": [_port(), _port()]}
    procs = []
    for name, plist in ports.items():
        for port in plist:
            config = _config(tmp_path, name, b, unique, port)
            procs.append(start_run(config, tmp_path / f"{name}-{port}.jsonl", tmp_path / f"{name}-{port}.log"))
    prom_port = _port()
    targets = [f"127.0.0.1:{p}" for plist in ports.values() for p in plist]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "rankwatch", "static_configs": [{"targets": targets}]}],
    }))
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        got: dict[str, float] = {}

        def complete() -> bool:
            got.clear()
            got.update({r["metric"]["experiment"]: float(r["value"][1]) for r in _query(
                base, 'sum by (experiment) (rankwatch:experiment_arm_requests:sum)')})
            return all(got.get(e) == n_requests for e in ("one", "two", "one_user", "two_user"))

        try:
            wait_for(complete, timeout=420, what="every request in both setups' experiment sums", procs=tuple(procs))
        except AssertionError as e:  # say how far each setup got, and what the services logged
            logs = "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-25:])
                             for f in sorted(tmp_path.glob("*.log")))
            raise AssertionError(f"{e}: {n_requests} requests, the sums got {got}\n{logs}") from None
        report = experiment_report(experiment_cells(validate_evaluation_frame(truth),
                                                    ExperimentSpec(name="x", min_requests=50)))

        def collect() -> dict[str, dict[tuple[str, ...], float]]:
            values: dict[str, dict[tuple[str, ...], float]] = {}
            for rule in CHECKED:
                for r in _query(base, rule):
                    m = r["metric"]
                    key = (rule, m["arm"], m["metric"], m["segment"], m["surface"])
                    values.setdefault(m["experiment"], {})[key] = float(r["value"][1])
            return values

        # Every checked rule of every experiment, evaluated on the final sums: polled until all of them agree
        # (each rule evaluates on its own schedule after the sums completed), not read once after a sleep.
        last: list[AssertionError] = []

        def settled() -> bool:
            try:
                _check_rules(collect(), report)
            except (AssertionError, KeyError) as e:
                last[:] = [AssertionError(f"{type(e).__name__}: {e}")]
                return False
            return True

        try:
            wait_for(settled, timeout=180, what="the checked experiment rules on the final sums of both setups",
                     procs=tuple(procs))
        except AssertionError as e:
            raise AssertionError(f"{e}; last check: {last[0] if last else 'none'}") from None
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        for p in procs:
            assert stop_run(p) == 0


def _check_rules(values: dict[str, dict[tuple[str, ...], float]], report: dict[str, Any]) -> None:
    """Both setups give the same experiment rules, and they are ``rankwatch ab``'s numbers on the truth."""
    one, two = values["one"], values["two"]
    assert one.keys() == two.keys() and len(one) >= len(CHECKED) * 7
    for key, value in one.items():
        assert two[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    # unit = "user": the pairs' per-user sums add up the same whichever instance owns them (the events are
    # keyed by request here, so a user's parts in different pairs are separate units: not ab's numbers).
    one_user, two_user = values["one_user"], values["two_user"]
    assert one_user.keys() == two_user.keys() and len(one_user) >= len(CHECKED) * 7
    for key, value in one_user.items():
        assert two_user[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert any(abs(one_user[k] - one[k]) > 1e-6 for k in one if k[0].endswith(":upper"))  # wider: users
    # ... and both are rankwatch ab's numbers on the ground truth (z instead of t for the fixed interval).
    for c in report["comparisons"]:
        key = ("rankwatch:experiment_lift_sequential:upper", "treatment", c["metric"], c["segment"], c["surface"])
        if key in one and c["lift_ci_sequential"] is not None:
            assert one[key] == pytest.approx(c["lift_ci_sequential"][1], rel=1e-9, abs=1e-12), key
    for surface in ("home_feed", "search"):  # the planted effect (few requests per cell: point estimates)
        assert one[("rankwatch:experiment_lift:ratio", "treatment", "ndcg@10", "new_user", surface)] < -0.1
