"""The A/B dashboard: the same metrics per variant, side by side, with the lift over a control variant.

The experiments section (docs/experiments.md) reads the fleet-exact experiment rules: an SRM banner, each
treatment's lift with its fixed or always-valid interval (the ``interval`` switch), requests per arm and
a per-cell forest table; BH-adjusted p-values and verdicts come from ``rankwatch ab --prometheus``.

Whole-population values per variant come from the exporter's roll-up rows ``segment="all",
surface="all", variant="<v>"`` (present whenever rankwatch slices by variant); the per-slice view shows the
variants of every selected segment x surface slice.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models import dashboard as models

from rankwatch_grafana.common import (
    ONLINE,
    REQUESTS_ONLINE,
    PanelIds,
    base_dashboard,
    datasource_variable,
    label_variable,
    metric_variable,
    query,
    row,
    slice_variables,
    stat_panel,
    table_panel,
    timeseries_panel,
    window_variable,
)

UID = "rankwatch-ab"

# Variant roll-up rows (whole population of each variant) and per-slice rows with a variant.
VARIANTS = 'segment="all", surface="all", variant=~"$variant", variant!="all"'
VARIANT_SLICES = 'segment=~"$segment", surface=~"$surface", variant=~"$variant", variant!="all"'


def ab_dashboard() -> dashboard.Dashboard:
    ids = PanelIds()
    board = base_dashboard(
        "rankwatch / A/B",
        UID,
        "Ranking quality per variant side by side: whole population, lift over the control variant, "
        "per slice, fleet-exact running means and sample sizes.",
    )
    # The control is one of the variants (no series has a `control` label): the online variants, excluding
    # the roll-up value "all"; "control" is preselected when a variant has that name.
    control = label_variable(
        "control", "Control variant", 'rankwatch_ranking_requests{source="online", variant!="all"}',
        multi=False, include_all=False, default="control", of="variant",
    )
    experiment = label_variable("experiment", "Experiment", "rankwatch_experiment_expected_share")
    interval = (
        dashboard.CustomVariable("interval")
        .label("Interval")
        .values("sequential,fixed")
        .current(models.VariableOption(selected=True, text="sequential", value="sequential"))
    )
    for var in [datasource_variable(), *slice_variables(), control, metric_variable(), window_variable(), experiment,
                interval]:  # fmt: skip
        board = board.with_variable(var)

    mw = 'metric=~"$metric", window=~"$window"'
    board = board.with_row(row(ids, "$metric per variant", repeat="metric"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "$metric per variant",
            "Online value of the last published window per variant (roll-up over all segments and "
            "surfaces). Dashed: the variant's offline baseline (its own row in the baseline file, or the "
            "requests-weighted mean of the variant's slices).",
            [
                query(f"{ONLINE}{{{mw}, {VARIANTS}}}", "{{variant}}", "A"),
                query(
                    'variant:rankwatch_ranking_quality_offline:requests_weighted_mean{metric=~"$metric", '
                    'variant=~"$variant"}',
                    "baseline {{variant}}",
                    "B",
                ),
            ],
            width=8,
            dashed_regex="^baseline.*",
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "$metric: lift over $control",
            "Online value of each variant divided by the control variant's, minus 1.",
            [
                query(
                    f"{ONLINE}{{{mw}, {VARIANTS}}}"
                    " / on (metric, window, segment, surface) group_left () "
                    f'{ONLINE}{{{mw}, segment="all", surface="all", variant="$control"}} - 1',
                    "{{variant}}",
                    "A",
                )
            ],
            unit="percentunit",
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "$metric per variant and slice",
            "Every selected segment x surface slice, one line per variant.",
            [query(f"{ONLINE}{{{mw}, {VARIANT_SLICES}}}", "{{variant}} {{segment}}/{{surface}}", "A")],
            width=8,
        )
    )

    board = board.with_row(row(ids, "Variants side by side"))
    board = board.with_panel(
        table_panel(
            ids,
            "Variants side by side",
            "Last published value per variant and metric, its lift over the control variant and the "
            "requests behind it.",
            [
                query(f"{ONLINE}{{{mw}, {VARIANTS}}}", "", "A", instant=True),
                query(
                    f"{ONLINE}{{{mw}, {VARIANTS}}}"
                    " / on (metric, window, segment, surface) group_left () "
                    f'{ONLINE}{{{mw}, segment="all", surface="all", variant="$control"}} - 1',
                    "",
                    "B",
                    instant=True,
                ),
                query(f'{REQUESTS_ONLINE}{{window=~"$window", {VARIANTS}}}', "", "C", instant=True),
            ],
            rename={"Value #A": "online", "Value #B": "lift over control", "Value #C": "requests"},
            width=24,
        )
    )

    board = board.with_row(row(ids, "Fleet-exact running means and sample sizes"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Mean of the requests finalized in the last hour, per variant",
            "sum(rate(_sum[1h])) / sum(rate(_count[1h])) over the primary slices of each variant and all "
            "instances (MRR, NDCG, MAP; exact for a fleet).",
            [
                query(
                    'variant:rankwatch_ranking_metric:mean_rate1h{metric=~"$metric", variant=~"$variant"}',
                    "{{metric}} {{variant}}",
                    "A",
                )
            ],
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Requests per variant (last published window)",
            "Sample size behind each variant's value.",
            [query(f'{REQUESTS_ONLINE}{{window=~"$window", {VARIANTS}}}', "{{variant}}", "A")],
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Finalized requests per second per variant",
            "Traffic split between the variants over the selected slices (5m rate).",
            [
                query(
                    "sum by (variant) (segment_surface_variant:rankwatch_finalized_requests:rate5m"
                    f"{{{VARIANT_SLICES}}})",
                    "{{variant}}",
                    "A",
                )
            ],
            unit="reqps",
            width=8,
        )
    )
    return _experiment_section(board, ids)


EXPERIMENT = 'experiment=~"$experiment"'
LIFT_ALL = f'{EXPERIMENT}, metric=~"$metric", segment="all", surface="all"'
LIFT_CELLS = f'{EXPERIMENT}, metric=~"$metric", segment=~"$segment", surface=~"$surface", segment!="all"'


def _experiment_section(board: dashboard.Dashboard, ids: PanelIds) -> dashboard.Dashboard:
    """Experiments (docs/experiments.md): fleet-exact lifts with fixed or always-valid intervals, SRM, n."""
    board = board.with_row(row(ids, "Experiments: lift with its interval (cumulative since the start)"))
    board = board.with_panel(stat_panel(
        ids, "Sample ratio (>= 1: MISMATCH, results untrustworthy)",
        "Chi-square of the arms' requests against the configured split divided by its p = 0.001 critical "
        "value: at 1 or more the split is broken (RankwatchSampleRatioMismatch) and no lift below can be trusted.",
        [query(f"rankwatch:experiment_srm:chi2{{{EXPERIMENT}}} / on (experiment) rankwatch:experiment_srm:critical",
               "{{experiment}}", "A")], width=6))  # fmt: skip
    board = board.with_panel(timeseries_panel(
        ids, "Lift of $metric over the control, all segments ($interval interval)",
        "Treatment mean / control mean - 1, fleet-exact from the rankwatch_experiment_* sums, with the fixed "
        "or the always-valid 95 % interval (switch: Interval). Read the always-valid one when watching: it "
        "stays valid at every look. An upper bound below 0 is a regression (RankwatchExperimentRegression).",
        [query(f"rankwatch:experiment_lift:ratio{{{LIFT_ALL}}}", "{{arm}} {{metric}}", "A"),
         query(f'rankwatch:experiment_lift_interval:lower{{{LIFT_ALL}, interval="$interval"}}',
               "lower {{arm}} {{metric}}", "B"),
         query(f'rankwatch:experiment_lift_interval:upper{{{LIFT_ALL}, interval="$interval"}}',
               "upper {{arm}} {{metric}}", "C")],
        unit="percentunit", width=12, dashed_regex="^(lower|upper) .*"))  # fmt: skip
    verdict = stat_panel(
        ids, "Verdict, all segments ($interval interval)",
        "Per treatment and metric: better (interval above 0), worse (below 0) or inconclusive, at alpha "
        "unadjusted on the all-segments slice. Segment verdicts need Benjamini-Hochberg: `rankwatch ab`.",
        [query(f'rankwatch:experiment_verdict_interval:sign{{{LIFT_ALL}, interval="$interval"}}',
               "{{arm}} {{metric}}", "A")], width=24, height=4)  # fmt: skip
    board = board.with_panel(verdict.color_mode("background").mappings([models.ValueMap(options={
        "-1": models.ValueMappingResult(text="worse", color="red", index=0),
        "0": models.ValueMappingResult(text="inconclusive", color="text", index=1),
        "1": models.ValueMappingResult(text="better", color="green", index=2),
    })]))  # fmt: skip
    board = board.with_panel(timeseries_panel(
        ids, "Requests per arm", "Requests of each arm since the experiment's start (all segments).",
        [query(f"rankwatch:experiment_arm_requests:sum{{{EXPERIMENT}}}", "{{experiment}} {{arm}}", "A")],
        width=6))  # fmt: skip
    board = board.with_panel(table_panel(
        ids, "Per segment x surface: lift and $interval interval (forest)",
        "One row per treatment, metric and segment x surface cell: lift with its interval and the units per "
        "arm. Segment decisions need Benjamini-Hochberg over the cells, which PromQL cannot do: the adjusted "
        "p-values and verdicts come from `rankwatch ab --prometheus URL`.",
        [query(f"rankwatch:experiment_lift:ratio{{{LIFT_CELLS}}}", "", "A", instant=True),
         query(f'rankwatch:experiment_lift_interval:lower{{{LIFT_CELLS}, interval="$interval"}}', "", "B", instant=True),
         query(f'rankwatch:experiment_lift_interval:upper{{{LIFT_CELLS}, interval="$interval"}}', "", "C", instant=True),
         query(f"rankwatch:experiment_observations:pair_sum{{{LIFT_CELLS}}} "
               f"or rankwatch:experiment_units:pair_sum{{{LIFT_CELLS}}}", "", "D", instant=True)],
        rename={"Value #A": "lift", "Value #B": "lower", "Value #C": "upper", "Value #D": "n (both arms, units)"},
        width=24))  # fmt: skip
    return board
