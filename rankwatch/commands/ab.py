"""``rankwatch ab``: an A/B report per metric x treatment x slice, with the sample-ratio-mismatch test.

Two inputs (SPEC section 4): evaluation rows (``rankwatch ab INPUT...``, as ``offline`` reads them, plus the
optional columns ``user_id`` and ``request_ts`` for ``--unit user`` and ``--start``), or logged events
(``--impressions FILE... --clicks FILE...``, joined in batch with hindsight, see
:func:`rankwatch.pipeline.experiments.data.rows_from_logs`). The experiment comes from ``--config FILE``'s
``[[experiments]]`` (``--experiment NAME`` picks one) or from the options below, which mirror its keys.
docs/experiments.md explains the statistics and the decisions.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import click

from rankwatch.errors import ConfigError, RankwatchError


def _csv(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for raw in values for v in raw.split(",") if v.strip()]


@click.command(name="ab")
@click.argument("inputs", nargs=-1, metavar="[INPUT...]")
@click.option("--impressions", "impression_files", multiple=True, metavar="FILE", help="Impression log (JSONL, .gz).")
@click.option("--clicks", "click_files", multiple=True, metavar="FILE", help="Feedback log (JSONL, .gz).")
@click.option("--prometheus", "prometheus_url", default=None, metavar="URL",
              help="A running fleet: read the rankwatch_experiment_* sums through Prometheus' HTTP API.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML with [[experiments]] (the run configuration); its [events.*] tables read logs "
                   "in the team's own schema (docs/mapping.md).")
@click.option("--experiment", "experiment_name", default=None, help="Which [[experiments]] entry (default: the only one).")
@click.option("--name", default="experiment", show_default=True, help="Experiment name (without --config).")
@click.option("--label", "--arm", "label", default=None,
              help="Label carrying the arm: variant (default) or model (evaluation rows: paired when shared).")
@click.option("--control", default=None, help="Control arm (default: control).")
@click.option("--treatment", "treatments", multiple=True, metavar="ARM[,ARM...]", help="Treatment arms (default: treatment).")
@click.option("--split", default=None, metavar="ARM=SHARE,...", help="Expected split (default: equal).")
@click.option("--start", default=None, metavar="RFC3339", help="Experiment start; earlier requests are left out.")
@click.option("--unit", type=click.Choice(["request", "user"]), default=None, help="Unit of randomisation (default: request).")
@click.option("--alpha", type=float, default=None, help="Significance level (default: 0.05).")
@click.option("--min-requests", type=int, default=None, help="Requests per arm and slice for a result (default: 1000).")
@click.option("--min-positives", type=int, default=None, help="Positive items per arm for AUCs (default: 100).")
@click.option("--min-negatives", type=int, default=None, help="Negative items per arm for AUCs (default: 100).")
@click.option("--n-star", type=int, default=None, help="Always-valid tuning N* in units (default: 50000 requests / 5000 users).")
@click.option("--decision", type=click.Choice(["sequential", "fixed"]), default=None,
              help="p-values the verdicts use (default: sequential, safe under continuous looking).")
@click.option("--by", default="segment,surface", show_default=True, metavar="LABEL[,LABEL...]",
              help="Slice labels ('' for the all-segments slice only).")
@click.option("--k", "ks", default=None, metavar="K[,K...]", help="NDCG@k and MAP@k cut-offs (default NDCG@5,10, MAP@10).")
@click.option("--attribution-window", default="30m", show_default=True, help="Feedback attribution window (logs).")
@click.option("--skip-invalid", is_flag=True, help="Skip and count invalid rows instead of failing.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--ledger", default=None, metavar="FILE",
              help="Append one transfer-ledger line per comparison (docs/transfer.md); needs --offline.")
@click.option("--offline", "offline_paths", multiple=True, metavar="FILE",
              help="Offline side for --ledger: evaluation rows of both models (paired) or their baseline files.")
def command(
    inputs: tuple[str, ...], impression_files: tuple[str, ...], click_files: tuple[str, ...],
    prometheus_url: str | None, config_path: Path | None, experiment_name: str | None, name: str, label: str | None, control: str | None,
    treatments: tuple[str, ...], split: str | None, start: str | None, unit: str | None, alpha: float | None,
    min_requests: int | None, min_positives: int | None, min_negatives: int | None, n_star: int | None,
    decision: str | None, by: str, ks: str | None, attribution_window: str, skip_invalid: bool, fmt: str,
    ledger: str | None, offline_paths: tuple[str, ...],
) -> None:  # fmt: skip
    """Compare the arms of an experiment: lifts with fixed and always-valid intervals, SRM, BH."""
    from rankwatch.pipeline.experiments.data import experiment_cells, request_extras, rows_from_logs
    from rankwatch.pipeline.experiments.report import experiment_report
    from rankwatch.pipeline.metrics.options import MetricOptions
    from rankwatch.pipeline.offline.readers import (
        InvalidEvaluationData,
        read_evaluation_files,
        validate_evaluation_frame,
    )
    from rankwatch.pipeline.slicing import SliceSpec
    from rankwatch.pipeline.stream.durations import parse_duration_ms

    overrides = {"label": label, "control": control, "treatments": _csv(treatments) or None,
                 "split": _split(split) if split else None, "start": start, "unit": unit, "alpha": alpha,
                 "min_requests": min_requests, "min_positives": min_positives, "min_negatives": min_negatives,
                 "n_star": n_star, "decision": decision}  # fmt: skip
    given = {k: v for k, v in overrides.items() if v is not None}
    if prometheus_url is not None:
        if inputs or impression_files or click_files:
            raise ConfigError("--prometheus reads a running fleet: give no INPUT or --impressions")
        base = None
        if config_path is not None:
            base = _spec(config_path, experiment_name, name, given)
        elif given:
            base = _spec(None, None, name, given)
        wanted = experiment_name or (base.name if base is not None and config_path is not None else None)
        data = prometheus_data(prometheus_url, wanted, base)
        doc = experiment_report(data)
        if ledger is not None:
            _ledger(ledger, offline_paths, doc, data.spec, MetricOptions(), _csv((by,)), skip_invalid)
        if fmt == "json":
            click.echo(json.dumps(doc, indent=2, allow_nan=False))
        else:
            _print_table(doc, ("segment", "surface"))
        return
    spec = _spec(config_path, experiment_name, name, given)
    try:
        cut = tuple(int(k) for k in _csv((ks,))) if ks else ()
        options = MetricOptions(ndcg_cutoffs=cut, map_cutoffs=cut) if cut else MetricOptions()
        slice_spec = SliceSpec(by=tuple(dict.fromkeys(_csv((by,)))))
        attr_ms = parse_duration_ms(attribution_window)
    except ValueError as e:
        raise ConfigError(f"bad option: {e}") from None
    imp_paths, clk_paths = _csv(impression_files), _csv(click_files)
    if bool(inputs) == bool(imp_paths):
        raise ConfigError("give evaluation rows (INPUT...) or --impressions/--clicks logs, not both or neither")
    try:
        if inputs and spec.label == "model":  # several models may score one request: paired (issue 21)
            evalset = read_evaluation_files(list(inputs), skip_invalid=skip_invalid, key_by_model=True)
            users, ts = None, None
        elif inputs:
            evalset = read_evaluation_files(list(inputs), skip_invalid=skip_invalid)
            users, ts = request_extras(evalset, _read_extras(inputs))
        else:
            translator = _translator(config_path)
            frame, _counts = rows_from_logs(_lines(imp_paths), _lines(clk_paths), attribution_window_ms=attr_ms,
                                            translator=translator)  # fmt: skip
            if frame.empty:
                raise RankwatchError("no valid impressions in the logs")
            evalset = validate_evaluation_frame(frame, source="logs")
            users, ts = request_extras(evalset, frame[["request_id", "user_id", "request_ts"]])
        data = experiment_cells(evalset, spec, options=options, slice_spec=slice_spec, users=users, request_ts_ms=ts)
    except FileNotFoundError as e:
        raise RankwatchError(str(e).strip("'\"")) from None
    except InvalidEvaluationData as e:
        raise RankwatchError(str(e)) from None
    except ValueError as e:
        raise RankwatchError(str(e)) from None
    doc = experiment_report(data)
    if inputs and spec.label == "model":
        from rankwatch.commands.ab_ledger import paired_section

        doc["paired"] = paired_section(evalset, spec, options, slice_spec)
    if ledger is not None:
        _ledger(ledger, offline_paths, doc, spec, options, slice_spec.by, skip_invalid)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2, allow_nan=False))
    else:
        _print_table(doc, slice_spec.by)


def _ledger(path: str, offline: tuple[str, ...], doc: dict[str, Any], spec: Any, options: Any, by: Any,
            skip_invalid: bool) -> None:  # fmt: skip
    from rankwatch.commands.ab_ledger import write_ledger

    written = write_ledger(path, list(offline), doc, spec, options, tuple(by), skip_invalid=skip_invalid)
    click.echo(f"{path}: {written} ledger line(s) appended", err=True)


def _split(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in _csv((text,)):
        arm, sep, share = part.partition("=")
        try:
            out[arm.strip()] = float(share)
        except ValueError:
            sep = ""
        if not sep or not arm.strip():
            raise ConfigError(f"--split takes ARM=SHARE,..., got {text!r}")
    return out


def _spec(config_path: Path | None, which: str | None, name: str, overrides: dict[str, Any]) -> Any:
    from rankwatch.pipeline.experiments.spec import experiment_from_dict

    base: dict[str, Any] = {"name": name}
    if config_path is not None:
        from rankwatch.config import load_config

        experiments = load_config(config_path).experiments
        if not experiments and which is not None:
            raise ConfigError(f"{config_path}: no [[experiments]]")
        chosen = [e for e in experiments if which is None or e.name == which]
        if which is None and len(experiments) > 1:
            raise ConfigError(f"{config_path}: several experiments, pick one with --experiment "
                              f"({', '.join(e.name for e in experiments)})")  # fmt: skip
        if not chosen and which is not None:
            raise ConfigError(f"{config_path}: no experiment named {which!r}")
        if chosen:  # a config without [[experiments]] (only [events.*], say): the options describe it
            base = chosen[0].to_dict()
            base.pop("split") if "split" in overrides else None
            base["max_users"], base["user_buckets"] = chosen[0].max_users, chosen[0].user_buckets
    elif which is not None:
        raise ConfigError("--experiment needs --config")
    merged = {**base, **overrides}
    if "treatments" in overrides and "split" not in overrides:
        merged.pop("split", None)
    try:
        return experiment_from_dict(merged)
    except ValueError as e:
        raise ConfigError(f"experiment {e}") from None


def _translator(config_path: Path | None) -> Any:
    """The [events.*] translator of ``--config`` (None without one or for a config that maps nothing)."""
    if config_path is None:
        return None
    from rankwatch.commands.event_files import events_translator
    from rankwatch.pipeline.stream.config import StreamConfig

    translator, _opener = events_translator(str(config_path), StreamConfig().max_event_bytes)  # JSONL logs only
    return translator


def _lines(paths: list[str]) -> Any:
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise RankwatchError(f"no such file: {path}")
        with p.open("rb") as raw:
            magic = raw.read(2)
        opener: Any = gzip.open if magic == b"\x1f\x8b" else open
        try:
            with opener(p, "rb") as f:
                for line in f:
                    line = line.strip()
                    if line:
                        yield line
        except (OSError, EOFError) as e:
            raise RankwatchError(f"{path}: cannot read: {e}") from None


def _read_extras(paths: tuple[str, ...]) -> Any:
    """``request_id`` with ``user_id`` / ``request_ts`` where the files have them (a second, narrow read)."""
    import msgspec
    import pandas as pd
    import pyarrow.parquet as pq

    from rankwatch.pipeline.offline.readers import detect_format

    wanted = ("request_id", "user_id", "request_ts")

    class Wire(msgspec.Struct):
        request_id: str | int | None = None
        user_id: str | int | None = None
        request_ts: str | int | float | None = None

    frames = []
    for path in paths:
        fmt = detect_format(path)
        if fmt == "csv":
            frame = pd.read_csv(path, dtype=str, usecols=lambda c: c in wanted, keep_default_na=False,
                                on_bad_lines="skip", encoding="utf-8-sig")  # fmt: skip
        elif fmt == "parquet":
            names = set(pq.read_schema(path).names)
            frame = pd.read_parquet(path, columns=[c for c in wanted if c in names])
        else:
            decoder = msgspec.json.Decoder(Wire)
            rows = []
            for line in _lines([path]):
                try:
                    w = decoder.decode(line)
                except msgspec.DecodeError:
                    continue
                rows.append((w.request_id, w.user_id, w.request_ts))
            frame = pd.DataFrame(rows, columns=list(wanted)).dropna(axis=1, how="all")
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    if "request_id" not in out.columns or len(out.columns) == 1:
        return pd.DataFrame()
    if "user_id" in out.columns:
        out["user_id"] = out["user_id"].map(lambda v: None if v is None or v == "" else str(v))
    return out


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _interval(pair: list[float] | None, percent: bool = False) -> str:
    if pair is None:
        return "-"
    if percent:
        return f"[{pair[0]:+.2%}, {pair[1]:+.2%}]"
    return f"[{pair[0]:+.4f}, {pair[1]:+.4f}]"


def _print_table(doc: dict[str, Any], by: tuple[str, ...]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 220, soft_wrap=False, highlight=False)
    exp, srm = doc["experiment"], doc["srm"]
    observed = ", ".join(f"{a} {n:,}" for a, n in srm["observed"].items())
    state = "MISMATCH: results are untrustworthy" if srm["mismatch"] else "ok"
    console.print(f"experiment {exp['name']} ({exp['label']}: {exp['control']} vs {', '.join(exp['treatments'])}; "
                  f"unit {exp['unit']}, alpha {exp['alpha']}, decision {exp['decision']})")  # fmt: skip
    console.print(f"sample ratio: {observed} {exp['unit']}s, p = {_fmt(srm['p_value'], 6)}: {state}")
    table = Table(title_justify="left")
    for col in ("metric", "treatment", *by, "n", "n control", "mean", "control", "diff [fixed]",
                "lift", "lift [fixed]", "lift [always valid]", f"p ({exp['decision']})", "p adj", "verdict"):
        table.add_column(col, justify="left" if col in ("metric", "treatment", *by, "verdict") else "right")
    for c in doc["comparisons"]:
        style = {"better": "green", "worse": "red"}.get(c["verdict"])
        diff = "-" if c["diff"] is None else f"{c['diff']:+.4f} {_interval(c['diff_ci'])}"
        lift = "-" if c["lift"] is None else f"{c['lift']:+.2%}"
        table.add_row(c["metric"], c["treatment"], *(c[b] for b in by), f"{c['n']:,}", f"{c['n_control']:,}",
                      _fmt(c["mean"]), _fmt(c["mean_control"]), diff, lift, _interval(c["lift_ci"], True),
                      _interval(c["lift_ci_sequential"], True), _fmt(c["p_value"]), _fmt(c["p_adjusted"]),
                      c["verdict"], style=style)  # fmt: skip
    console.print(table)
    if doc.get("paired"):
        _print_paired(console, doc["paired"], by)
    notes = []
    if exp["other_arm_requests"]:
        notes.append(f"{exp['other_arm_requests']:,} requests of other arms left out")
    if exp["before_start_requests"]:
        notes.append(f"{exp['before_start_requests']:,} requests before the start left out")
    if exp["crossover_users"]:
        notes.append(f"{exp['crossover_users']:,} users seen in more than one arm")
    if exp["users_folded"]:
        notes.append(f"{exp['users_folded']:,} users past the per-user cap share hashed buckets")
    for note in notes:
        console.print(note)


def _print_paired(console: Any, rows: list[dict[str, Any]], by: tuple[str, ...]) -> None:
    from rich.table import Table

    table = Table(title="paired over the requests both models scored (AUC-ROC: items, DeLong)", title_justify="left")
    for col in ("metric", "treatment", *by, "n pairs", "diff", "stderr", "diff [fixed]"):
        table.add_column(col, justify="left" if col in ("metric", "treatment", *by) else "right")
    for r in rows:
        table.add_row(r["metric"], r["treatment"], *(r[b] for b in by), f"{r['n_pairs']:,}",
                      "-" if r["diff"] is None else f"{r['diff']:+.4f}", _fmt(r["stderr"]),
                      _interval(r["diff_ci"]))  # fmt: skip
    console.print(table)


def prometheus_data(url: str, spec_name: str | None, base: Any, *, timeout_s: float = 10.0) -> Any:
    """The experiment's cells from a fleet: the ``rankwatch_experiment_*`` samples summed over instances.

    ``base`` (an ExperimentSpec from ``--config`` or None) supplies alpha, minimums and the decision; the
    arms, roles and split come from the exported labels. AUC comparisons need histograms, which are not
    exported: they come out as insufficient data. An experiment exporting users and per-user sums is read
    as ``unit = "user"``.
    """
    import urllib.error
    import urllib.parse
    import urllib.request

    from rankwatch.pipeline.experiments.data import ArmCell, ExperimentData, UnitSums
    from rankwatch.pipeline.experiments.spec import experiment_from_dict
    from rankwatch.pipeline.metrics.aggregates import MetricSum, RankingAggregate
    from rankwatch.pipeline.metrics.options import MetricOptions
    from rankwatch.pipeline.slicing import ALL_VALUE, SliceSpec

    def query(family: str) -> list[tuple[dict[str, str], float]]:
        selector = f'{family}{{experiment="{spec_name}"}}' if spec_name else family
        target = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": selector})
        try:
            with urllib.request.urlopen(target, timeout=timeout_s) as resp:
                body = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise RankwatchError(f"cannot query Prometheus at {url}: {getattr(e, 'reason', e)}") from None
        if body.get("status") != "success":
            raise RankwatchError(f"Prometheus at {url}: {body.get('error', 'query failed')}")
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    shares = query("rankwatch_experiment_expected_share")
    names = sorted({labels["experiment"] for labels, _v in shares})
    if not names:
        raise RankwatchError(f"Prometheus at {url} has no rankwatch_experiment_* series"
                             + (f" for experiment {spec_name!r}" if spec_name else ""))  # fmt: skip
    if len(names) > 1:
        raise RankwatchError(f"several experiments in Prometheus, pick one with --experiment ({', '.join(names)})")
    name = names[0]
    roles = {labels["arm"]: labels.get("role", "treatment") for labels, _v in shares}
    split = {labels["arm"]: v for labels, v in shares}
    controls = [a for a, r in roles.items() if r == "control"]
    if len(controls) != 1:
        raise RankwatchError(f"experiment {name!r}: expected one control arm in Prometheus, found {controls}")
    merged = {**(base.to_dict() if base is not None else {}), "name": name, "control": controls[0],
              "treatments": sorted(a for a in roles if a != controls[0]), "split": split}  # fmt: skip
    users: dict[str, float] = {}
    for labels, v in query("rankwatch_experiment_users"):  # summed over instances
        if labels.get("experiment") == name:
            users[labels["arm"]] = users.get(labels["arm"], 0.0) + v
    # Only unit = "user" experiments export users and the per-user sums: the families say the unit. The
    # tuning N* follows it unless --config / --n-star set one.
    merged["unit"] = "user" if users else "request"
    if base is None or (base.unit != merged["unit"] and not base.n_star):
        merged.pop("n_star", None)
    try:
        spec = experiment_from_dict(merged)
    except ValueError as e:
        raise ConfigError(f"experiment {e}") from None

    def total(family: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for labels, value in query(family):
            key = (labels["arm"], labels.get("segment", ALL_VALUE), labels.get("surface", ALL_VALUE),
                   labels.get("metric", ""))  # fmt: skip
            out[key] = out.get(key, 0.0) + value
        return out

    # Request unit: count, sum, sum of squares; user unit: n, sum Y, sum N, sum Y^2, sum N^2, sum Y N.
    families = (("units", "unit_sum_of_values", "unit_sum_of_counts", "unit_sum_of_squared_values",
                 "unit_sum_of_squared_counts", "unit_sum_of_products") if users
                else ("observations", "sum_of_values", "sum_of_squares"))  # fmt: skip
    stats = [total(f"rankwatch_experiment_{f}") for f in families]
    requests = total("rankwatch_experiment_requests")
    metrics = sorted({k[3] for k in stats[0]}, key=lambda m: (m != "mrr", m.split("@")[0], int(m.split("@")[1] or 0)
                                                               if "@" in m else 0))  # fmt: skip
    ndcg = tuple(int(m.split("@")[1]) for m in metrics if m.startswith("ndcg@"))
    map_k = tuple(int(m.split("@")[1]) for m in metrics if m.startswith("map@"))
    options = MetricOptions(ndcg_cutoffs=ndcg, map_cutoffs=map_k)
    cells: dict[Any, ArmCell] = {}
    for (arm, segment, surface, _m), n in requests.items():
        agg = RankingAggregate(options)
        agg.requests = int(n)
        key = () if segment == ALL_VALUE and surface == ALL_VALUE else (("segment", segment), ("surface", surface))
        cell = cells[(arm, key)] = ArmCell(agg)
        for metric in options.rank_metric_names:
            k = (arm, segment, surface, metric)
            if users:  # the report reads the per-user sums; the request-level sums stay empty
                if k in stats[0]:
                    cell.units[metric] = UnitSums(int(stats[0][k]), *(u.get(k, 0.0) for u in stats[1:]))
            else:
                agg.sums[metric] = MetricSum(int(stats[0].get(k, 0)), stats[1].get(k, 0.0), stats[2].get(k, 0.0))
    for arm in spec.arms:
        cells.setdefault((arm, ()), ArmCell(RankingAggregate(options)))
    return ExperimentData(spec=spec, options=options, slice_spec=SliceSpec(by=("segment", "surface")), cells=cells,
                          requests={a: cells[(a, ())].aggregate.requests for a in spec.arms},
                          users={a: int(users.get(a, 0)) for a in spec.arms})  # fmt: skip
