"""A real Prometheus (Debian's package) with the shipped rules, scraping a real ``rankwatch demo`` that has a
regression injected for the segment ``new_user`` from the start.

Checks, through Prometheus' HTTP API:
* every recording rule returns data (except the few the demo cannot feed, listed with the reason);
* every query of every dashboard panel returns data (same exceptions), with the template variables
  substituted ("All" = ``.*``, single-value variables a concrete value);
* RankwatchQualityBelowBaseline becomes pending or firing for new_user's slices and for no slice of the
  other segments (the overall slice may join: a third of its traffic regressed);
* RankwatchAUCDrop does so for new_user too, and no health alert (stall, target down, ...) is active;
* an A/A demo (no regression), run alongside with its own Prometheus for the same time, fires nothing.

The rules are the shipped files; the only change in the test copy is shorter ``for:`` durations, because
the shipped ones (up to 75 minutes) would outlast any test. Scrapes and evaluations run every second and the
demo runs event time 600x faster than the wall clock, so 1h windows close every few seconds.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
REGRESSED = "new_user"
OTHER_SEGMENTS = {"returning", "power_user"}
# Longer than two 1h windows (a window closes every 6 s at 600x), so one unlucky window cannot make an
# alert active: the shipped for: 75m does the same with real windows.
TEST_FOR = "15s"
DEADLINE_SECONDS = 300.0  # a deadline, not a duration: a demo on a busy machine took 190 s to page

# Queries the demo cannot feed: it runs without Kafka and its simulated events are all well-formed.
DEMO_HAS_NO = {
    "job_topic:rankwatch_consumer_lag:sum": "the demo consumes no Kafka topic, so there is no consumer lag",
    "stream_reason:rankwatch_rejected_events:rate5m": "the demo produces no malformed events to reject",
    # The demo's experiment is request-unit; the user-unit rules run on a real Prometheus in
    # tests/consumers/test_experiments_fleet.py and under promtool (tests/deploy/test_experiment_rules.py).
    **{f"rankwatch:experiment_{n}": "the demo's experiment is request-unit" for n in (
        "units:sum", "unit_sum_of_values:sum", "unit_sum_of_counts:sum", "unit_sum_of_squared_values:sum",
        "unit_sum_of_squared_counts:sum", "unit_sum_of_products:sum", "units:pair_sum")},
}

# Template variables that are not Prometheus queries: a concrete value. Query variables (label_values) take
# "All" (the regex ``.*``) when they are multi-value, else the first value Prometheus lists for them.
CUSTOM_VALUES = {"window": "1h", "interval": "sequential"}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+), *(?P<label>\w+)\)$")

# Not `slow`: this is the CI check that every recording rule and dashboard query runs on a real Prometheus.
pytestmark = [pytest.mark.prometheus]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


def rules_with_short_for(text: str, duration: str = TEST_FOR) -> str:
    """The rules file with every ``for:`` duration replaced, and nothing else changed."""
    return re.sub(r"(?m)^(\s+for:\s*)\S+\s*$", rf"\g<1>{duration}", text)


def query_variables() -> dict[str, tuple[str, str, bool]]:
    """Every dashboard's query variables: name -> (selector, label, multi); one definition per name."""
    out: dict[str, tuple[str, str, bool]] = {}
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] != "query":
                continue
            query = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
            m = LABEL_VALUES.match(query)
            assert m, f"{path.name}: variable {var['name']}: not a label_values query: {query}"
            found = (m["selector"], m["label"], bool(var.get("multi")))
            assert out.setdefault(var["name"], found) == found, f"variable {var['name']} defined twice differently"
    return out


def dashboard_queries(values: dict[str, str]) -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every target of every panel, variables substituted."""
    out = []
    for path in sorted(DASHBOARD_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets") or []:
                expr = target["expr"]
                for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
                    expr = expr.replace(f"${name}", value)
                assert "$" not in expr, f"unsubstituted variable in {path.name} / {panel['title']}: {expr}"
                out.append((path.name, panel["title"], expr))
    return out


class Prometheus:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        body = _get(url)
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return result if isinstance(result, list) else [result]

    def label_values(self, selector: str, label: str) -> list[str]:
        """What Grafana's ``label_values(selector, label)`` lists."""
        url = f"{self.base}/api/v1/series?" + urllib.parse.urlencode({"match[]": selector})
        body = _get(url)
        assert body["status"] == "success", body
        return sorted({s[label] for s in body["data"] if label in s})

    def alerts(self) -> list[dict[str, Any]]:
        return list(_get(f"{self.base}/api/v1/alerts")["data"]["alerts"])

    def recording_rules(self) -> list[str]:
        groups = _get(f"{self.base}/api/v1/rules?type=record")["data"]["groups"]
        return [rule["name"] for g in groups for rule in g["rules"]]


def _wait(what: str, predicate: Any, deadline: float, procs: list[subprocess.Popen[bytes]]) -> Any:
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                out = p.stdout.read().decode(errors="replace")[-2000:] if p.stdout else ""
                name = p.args[0] if isinstance(p.args, list) else p.args
                pytest.fail(f"{name!s} exited with {p.returncode} while waiting for {what}:\n{out}")
        try:
            value = predicate()
        except (urllib.error.URLError, ConnectionError, OSError):
            value = None
        if value:
            return value
        time.sleep(1.0)
    pytest.fail(f"timed out waiting for {what}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_stack(tmp: Path, regression: str) -> tuple[Prometheus, list[subprocess.Popen[bytes]]]:
    """A demo (with ``regression`` as its regressed segment, '' for none) and its own Prometheus.

    Each demo gets its own Prometheus: the recording rules combine every instance of a slice, so two
    demos scraped by one Prometheus would be read as one fleet.
    """
    demo_port, prom_port = _free_port(), _free_port()
    rules = tmp / "rules"
    rules.mkdir()
    for path in sorted(RULES_DIR.glob("*.yml")):
        (rules / path.name).write_text(rules_with_short_for(path.read_text()))
    config = {
        # Scrapes every 4 s with a 4 s timeout: a busy machine can take more than a second to answer one, and
        # a failed scrape marks every series stale, which resets the alerts' for: clocks.
        "global": {"scrape_interval": "4s", "scrape_timeout": "4s", "evaluation_interval": "1s"},
        "rule_files": [str(rules / "*.yml")],
        "scrape_configs": [
            {"job_name": "rankwatch", "static_configs": [{"targets": [f"127.0.0.1:{demo_port}"]}]},
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    demo = subprocess.Popen(
        [
            sys.executable, "-m", "rankwatch.cli", "demo",
            "--duration", str(DEADLINE_SECONDS + 60), "--speed", "600", "--port", str(demo_port),
            "--regression-segment", regression, "--regression-at", "0",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp,
    )  # fmt: skip
    prometheus = subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp,
    )  # fmt: skip
    return Prometheus(f"http://127.0.0.1:{prom_port}"), [demo, prometheus]


@pytest.fixture(scope="module")
def stacks(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[tuple[Prometheus, list[subprocess.Popen[bytes]]], tuple[Prometheus, list[subprocess.Popen[bytes]]]]]:
    """The regressed demo and, alongside for the same time, an A/A demo (no regression), each with its Prometheus."""
    if not Path(PROMETHEUS).exists():
        pytest.skip("prometheus is not installed (scripts/test.sh installs Debian's package)")
    regressed = _start_stack(tmp_path_factory.mktemp("prometheus"), REGRESSED)
    aa = _start_stack(tmp_path_factory.mktemp("prometheus-aa"), "")
    try:
        yield regressed, aa
    finally:
        for p in regressed[1] + aa[1]:
            _stop(p)
            if p.stdout:
                p.stdout.close()


@pytest.fixture(scope="module")
def live(stacks: Any) -> tuple[Prometheus, list[subprocess.Popen[bytes]]]:
    return stacks[0]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def warmed(live: tuple[Prometheus, list[subprocess.Popen[bytes]]]) -> Prometheus:
    """Prometheus once the regression alert is active: by then windows, baselines and rates exist."""
    prom, procs = live
    deadline = time.monotonic() + DEADLINE_SECONDS

    def regressed_alert() -> bool:
        return any(
            a["labels"].get("alertname") == "RankwatchQualityBelowBaseline"
            and a["labels"].get("segment") == REGRESSED
            for a in prom.alerts()
        )

    _wait("RankwatchQualityBelowBaseline for new_user", regressed_alert, deadline, procs)
    # Every query below needs a few scrapes of the cumulative counters (rate) and of the 5m window.
    _wait("fleet-exact 5m means", lambda: prom.query("metric:rankwatch_ranking_metric:mean_rate5m"), deadline, procs)
    # ... and the 95 % bands of the 1h window (their rules evaluate after the drift SE the alert reads).
    bands = (
        'segment_surface_variant:rankwatch_ranking_quality_online:lower95{window="1h"}',
        'segment_surface_variant:rankwatch_ranking_quality_drift:lower95{window="1h"}',
    )
    _wait("95 % bands", lambda: all(prom.query(q) for q in bands), deadline, procs)
    return prom


def test_rules_copy_differs_only_in_for_durations() -> None:
    for path in sorted(RULES_DIR.glob("*.yml")):
        original = path.read_text().splitlines()
        copied = rules_with_short_for(path.read_text()).splitlines()
        assert len(original) == len(copied)
        changed = [(a, b) for a, b in zip(original, copied, strict=True) if a != b]
        assert all(a.strip().startswith("for:") and b.strip() == f"for: {TEST_FOR}" for a, b in changed)


def test_regression_alert_fires_for_the_regressed_segment_only(warmed: Prometheus) -> None:
    alerts = [a for a in warmed.alerts() if a["labels"]["alertname"] == "RankwatchQualityBelowBaseline"]
    regressed = [a for a in alerts if a["labels"]["segment"] == REGRESSED]
    assert regressed and all(a["state"] in ("pending", "firing") for a in regressed)
    others = sorted(
        (a["labels"]["segment"], a["labels"]["surface"], a["labels"]["variant"], a["labels"]["metric"])
        for a in alerts
        if a["labels"]["segment"] in OTHER_SEGMENTS
    )
    assert not others, f"alert for slices that did not regress: {others}"
    # The overall slice may fire too (a third of its traffic regressed); nothing else may.
    assert {a["labels"]["segment"] for a in alerts} <= {REGRESSED, "all"}


def test_auc_drop_fires_for_the_regressed_segment(warmed: Prometheus) -> None:
    def auc_alert_segments() -> set[str]:
        return {a["labels"]["segment"] for a in warmed.alerts() if a["labels"]["alertname"] == "RankwatchAUCDrop"}

    assert _wait("RankwatchAUCDrop for new_user", lambda: REGRESSED in auc_alert_segments(), time.monotonic() + 30, [])


def test_aa_run_alongside_fires_nothing(warmed: Prometheus, stacks: Any) -> None:
    """The A/A demo ran as long as the regressed one took to fire: no alert is even pending, though its
    drifts, their SEs and z scores are evaluated."""
    aa, procs = stacks[1]
    _wait("A/A drift z scores", lambda: aa.query("segment_surface_variant:rankwatch_ranking_quality_drift:z"),
          time.monotonic() + 30, procs)  # fmt: skip
    assert [a["labels"] for a in aa.alerts()] == []


def test_healthy_pipeline_raises_no_health_alert(warmed: Prometheus) -> None:
    """Only quality alerts are active: a fresh, healthy demo is not stalled, not down, not overflowing."""
    names = {a["labels"]["alertname"] for a in warmed.alerts()}
    # RankwatchScoreDistributionShift is a model alert: the regression lowers new_user's model quality,
    # which moves its scores; test_score_shift_alert_is_for_the_regressed_segment_only checks where it is.
    assert names <= {"RankwatchQualityBelowBaseline", "RankwatchAUCDrop", "RankwatchScoreDistributionShift"}, names


def test_score_shift_alert_is_for_the_regressed_segment_only(warmed: Prometheus) -> None:
    """Issue 13: the demo's regression changes new_user's scores (score = q * grade + (1 - q) * noise with a
    lower q); healthy segments keep the baseline's score distribution and raise no score alert."""
    alerts = [a for a in warmed.alerts() if a["labels"]["alertname"] == "RankwatchScoreDistributionShift"]
    assert {a["labels"]["segment"] for a in alerts} <= {REGRESSED, "all"}, alerts
    expr = f'max by (segment) (rankwatch_score_drift{{statistic="psi", window="5m", segment=~"{"|".join(OTHER_SEGMENTS)}"}})'
    psi = _wait("score PSI of the healthy segments", lambda: warmed.query(expr), time.monotonic() + 30, [])
    assert psi and all(float(s["value"][1]) < 0.2 for s in psi), psi


def _wait_for_each(what: str, items: list[Any], has_data: Any, seconds: float = DEADLINE_SECONDS) -> None:
    """Poll every item until each has data (each is re-asked until it answers, none only once), up to a
    deadline; the failure lists the items still without data."""
    deadline = time.monotonic() + seconds
    waiting = list(items)
    while waiting:
        waiting = [item for item in waiting if not has_data(item)]
        if waiting and time.monotonic() >= deadline:
            pytest.fail(f"{what}: still without data after {seconds:.0f} s:\n" + "\n".join(map(str, waiting)))
        if waiting:
            time.sleep(1.0)


@pytest.fixture(scope="module")
def variable_values(warmed: Prometheus) -> dict[str, str]:
    """The value of every dashboard variable: each query variable polled until Prometheus lists a value."""
    variables = query_variables()
    assert {"control", "segment", "experiment"} <= set(variables)
    _wait_for_each("dashboard variables (label_values)", sorted(variables),
                   lambda name: warmed.label_values(*variables[name][:2]))  # fmt: skip
    values = dict(CUSTOM_VALUES)
    for name, (selector, label, multi) in variables.items():
        values[name] = ".*" if multi else warmed.label_values(selector, label)[0]
    return values


def test_every_dashboard_variable_lists_values(warmed: Prometheus, variable_values: dict[str, str]) -> None:
    """The A/B dashboard's control dropdown lists the variants (it once asked for a label no series has)."""
    selector, label, _ = query_variables()["control"]
    assert warmed.label_values(selector, label) == ["control", "treatment"]
    assert variable_values["control"] == "control"


def test_every_recording_rule_returns_data(warmed: Prometheus) -> None:
    names = warmed.recording_rules()
    assert len(names) >= 20
    _wait_for_each("recording rules", [n for n in names if n not in DEMO_HAS_NO], warmed.query)


def test_every_dashboard_query_returns_data(warmed: Prometheus, variable_values: dict[str, str]) -> None:
    queries = dashboard_queries(variable_values)
    assert len(queries) >= 30
    wanted = [q for q in queries if not any(skip in q[2] for skip in DEMO_HAS_NO)]
    _wait_for_each("panel queries", wanted, lambda q: warmed.query(q[2]))
