"""``rankwatch_experiment_*`` families: the cumulative sums of the experiment state, summed over instances."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rankwatch.commands.run import experiment_collector
from rankwatch.config import config_from_dict
from rankwatch.errors import ConfigError
from rankwatch.exporters.experiments import FAMILIES, ExperimentCollector
from rankwatch.pipeline.clock import ManualClock
from rankwatch.pipeline.experiments.online import ExperimentAccumulator
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.slicing import SliceSpec
from rankwatch.pipeline.stream.processor import StreamConfig, StreamProcessor
from rankwatch.pipeline.traffic.generator import ExperimentTraffic, TrafficConfig, generate_events


def _published(seed: int) -> list:
    cfg = TrafficConfig(seed=seed, duration_s=600, requests_per_second=8, experiment=ExperimentTraffic(users=100))
    config = StreamConfig(windows=("5m",), slice_spec=SliceSpec(by=("segment", "surface", "variant")))
    proc = StreamProcessor(config, clock=ManualClock())
    out = []
    for e in generate_events(cfg):
        out += (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    return out + proc.flush()


def _scrape(collector: ExperimentCollector) -> dict[tuple[str, frozenset], float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_families_carry_the_cumulative_sums_and_add_up_over_instances() -> None:
    spec = ExperimentSpec(name="exp", split={"control": 1, "treatment": 1})
    by = ("segment", "surface", "variant")
    windows = _published(3)
    whole = ExperimentCollector([ExperimentAccumulator(spec, StreamConfig().metric_options, slice_by=by, window="5m")])
    halves = [ExperimentCollector([ExperimentAccumulator(spec, StreamConfig().metric_options, slice_by=by, window="5m")])
              for _ in range(2)]
    for i, pw in enumerate(windows):
        whole.publish_window(pw)
        halves[i % 2].publish_window(pw)  # two instances holding different windows
    full = _scrape(whole)
    parts = [_scrape(h) for h in halves]
    assert {name for name, _ in full} == set(FAMILIES)
    acc = whole.accumulators[0]
    overall = acc.cells[("treatment", ())]
    key = frozenset({"experiment": "exp", "arm": "treatment", "role": "treatment", "segment": "all",
                     "surface": "all", "metric": "ndcg@10"}.items())
    assert full[("rankwatch_experiment_observations", key)] == overall.sums["ndcg@10"].count
    assert full[("rankwatch_experiment_sum_of_values", key)] == pytest.approx(overall.sums["ndcg@10"].total, rel=1e-12)
    for (name, labels), value in full.items():
        if name in ("rankwatch_experiment_observations", "rankwatch_experiment_sum_of_values",
                    "rankwatch_experiment_sum_of_squares", "rankwatch_experiment_requests"):
            assert sum(p.get((name, labels), 0.0) for p in parts) == pytest.approx(value, rel=1e-12), (name, labels)


def test_run_refuses_an_experiment_whose_arm_is_not_sliced(tmp_path: Path) -> None:
    cfg = config_from_dict({"experiments": [{"name": "x"}]})
    with pytest.raises(ConfigError, match="arm label 'variant' must be in \\[slices\\] by"):
        experiment_collector(cfg)
    ok = config_from_dict({"slices": {"by": ["segment", "surface", "variant"]}, "experiments": [{"name": "x"}]})
    assert isinstance(experiment_collector(ok), ExperimentCollector)
    user = config_from_dict({"slices": {"by": ["segment", "variant"]}, "experiments": [{"name": "x", "unit": "user"}]})
    collector = experiment_collector(user)  # user-unit experiments are exported too (pipeline/experiments/users.py)
    assert isinstance(collector, ExperimentCollector) and collector.specs[0].unit == "user"


def test_user_unit_families_carry_the_per_user_sums_and_users_per_arm() -> None:
    spec = ExperimentSpec(name="u", unit="user")
    config = StreamConfig(windows=("5m",), slice_spec=SliceSpec(by=("segment", "surface", "variant")), experiments=(spec,))
    proc = StreamProcessor(config, clock=ManualClock())
    cfg = TrafficConfig(seed=4, duration_s=600, requests_per_second=8, experiment=ExperimentTraffic(users=100))
    for e in generate_events(cfg):
        (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    proc.flush()
    collector = ExperimentCollector(specs=[spec])
    collector.set_parts({0: proc.stats().experiments})
    got = _scrape(collector)
    assert not any(name == "rankwatch_experiment_observations" for name, _ in got)  # the request unit's
    data = proc.experiment_data("u")
    for arm in spec.arms:
        labels = frozenset({"experiment": "u", "arm": arm, "role": "control" if arm == "control" else "treatment"}.items())
        assert got[("rankwatch_experiment_users", labels)] == data.users[arm] > 0
        cell_labels = dict(labels) | {"segment": "all", "surface": "all"}
        assert got[("rankwatch_experiment_requests", frozenset(cell_labels.items()))] == data.requests[arm]
        u = data.cells[(arm, ())].units["ndcg@10"]
        m = frozenset((cell_labels | {"metric": "ndcg@10"}).items())
        assert got[("rankwatch_experiment_units", m)] == u.n
        for family, value in (("sum_of_values", u.sum_y), ("sum_of_counts", u.sum_n), ("sum_of_squared_values", u.sum_yy),
                              ("sum_of_squared_counts", u.sum_nn), ("sum_of_products", u.sum_yn)):
            assert got[(f"rankwatch_experiment_unit_{family}", m)] == pytest.approx(value, rel=1e-12), family


def test_state_rides_in_the_pairs_snapshots_and_sums_are_fleet_exact() -> None:
    """Two partition pairs, one restored from its snapshot half-way (a rebalance), against one processor."""
    import zlib

    from rankwatch.pipeline.events.records import SourceRef
    from rankwatch.pipeline.experiments.online import ExperimentSums

    spec = ExperimentSpec(name="exp")
    base = StreamConfig(windows=("5m", "1h"), slice_spec=SliceSpec(by=("segment", "surface", "variant")),
                        experiments=(spec,))
    cfg = TrafficConfig(seed=5, duration_s=900, requests_per_second=8, experiment=ExperimentTraffic(users=150),
                        duplicate_rate=0.02)
    events = list(generate_events(cfg))
    single = StreamProcessor(base, clock=ManualClock(), partitions=(0,))
    pairs = {p: StreamProcessor(base, clock=ManualClock(), partitions=(p,)) for p in (0, 1)}
    for i, e in enumerate(events):
        p = zlib.crc32(e.key) % 2
        for proc, part in ((single, 0), (pairs[p], p)):
            fn = proc.process_impression if e.stream == "impressions" else proc.process_feedback
            fn(e.value, source=SourceRef(e.stream, part, i))
        if i == len(events) // 2:  # pair 1 moves to another instance: restored from its snapshot
            pairs[1] = StreamProcessor.restore(pairs[1].snapshot(), config=base, clock=ManualClock())
    single.flush()
    for proc in pairs.values():
        proc.flush()
    whole = ExperimentSums.total([single.stats().experiments["exp"]])
    split = ExperimentSums.total([proc.stats().experiments["exp"] for proc in pairs.values()])
    assert whole.keys() == split.keys() and whole
    for key, (requests, metrics) in whole.items():
        assert split[key][0] == requests
        for m, (c, t, t2) in metrics.items():
            c2, s2, q2 = split[key][1][m]
            assert c2 == c and s2 == pytest.approx(t, rel=1e-12) and q2 == pytest.approx(t2, rel=1e-12)
    # the collector adds the pairs up the same way
    collector = ExperimentCollector(specs=[spec])
    collector.set_parts({p: proc.stats().experiments for p, proc in pairs.items()})
    scraped = _scrape(collector)
    key = frozenset({"experiment": "exp", "arm": "control", "role": "control", "segment": "all", "surface": "all"}.items())
    assert scraped[("rankwatch_experiment_requests", key)] == whole[("control", ())][0]


def test_pair_state_keeps_sums_only_so_checkpoints_stay_small() -> None:
    spec = ExperimentSpec(name="exp")
    config = StreamConfig(windows=("5m",), slice_spec=SliceSpec(by=("segment", "surface", "variant")),
                          experiments=(spec,))
    with_exp = StreamProcessor(config, clock=ManualClock())
    without = StreamProcessor(replace_experiments(config), clock=ManualClock())
    cfg = TrafficConfig(seed=6, duration_s=1200, requests_per_second=10, experiment=ExperimentTraffic(users=100))
    for e in generate_events(cfg):
        for proc in (with_exp, without):
            (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    for proc in (with_exp, without):
        proc.flush()
    acc = with_exp._experiments.by_window[0]
    assert acc.cells and all(agg.histogram.n_distinct == 0 for agg in acc.cells.values())
    assert len(with_exp.snapshot()) - len(without.snapshot()) < 20_000  # 14 cells x 4 metrics of sums


def replace_experiments(config: StreamConfig) -> StreamConfig:
    from dataclasses import replace

    return replace(config, experiments=())


def test_a_redefined_or_new_experiment_starts_empty_after_restore() -> None:
    spec = ExperimentSpec(name="exp")
    config = StreamConfig(windows=("5m",), slice_spec=SliceSpec(by=("segment", "surface", "variant")),
                          experiments=(spec,))
    proc = StreamProcessor(config, clock=ManualClock())
    for e in generate_events(TrafficConfig(seed=7, duration_s=900, requests_per_second=5)):
        (proc.process_impression if e.stream == "impressions" else proc.process_feedback)(e.value)
    proc.flush()
    data = proc.snapshot()
    same = StreamProcessor.restore(data, config=config, clock=ManualClock())
    assert same._experiments.by_window[0].cells == proc._experiments.by_window[0].cells and proc._experiments.by_window[0].cells
    from dataclasses import replace

    redefined = replace(config, experiments=(ExperimentSpec(name="exp", alpha=0.01), ExperimentSpec(name="new")))
    fresh = StreamProcessor.restore(data, config=redefined, clock=ManualClock())
    assert [a.cells for a in fresh._experiments.by_window] == [{}, {}]
