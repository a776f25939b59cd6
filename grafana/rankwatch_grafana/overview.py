"""The Overview dashboard: online vs offline per metric with drift, AUC, sample sizes, the worst drifts
per slice, fleet-exact running means, offline-to-online transfer and pipeline health."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from rankwatch_grafana.common import (
    BAND_REGEX,
    DRIFT,
    DRIFT_LOWER,
    DRIFT_RELATIVE,
    DRIFT_STDERR,
    DRIFT_UPPER,
    DRIFT_Z,
    MEAN_1H,
    OFFLINE,
    OFFLINE_LOWER,
    OFFLINE_UPPER,
    ONLINE,
    ONLINE_LOWER,
    ONLINE_UPPER,
    REQUESTS_OFFLINE,
    REQUESTS_ONLINE,
    SLICE,
    SLICE_LEGEND,
    PanelIds,
    base_dashboard,
    datasource_variable,
    metric_variable,
    query,
    row,
    slice_variables,
    stat_panel,
    table_panel,
    timeseries_panel,
    window_variable,
)
from rankwatch_grafana.overview_ranking import ranking_panels
from rankwatch_grafana.overview_transfer import transfer_panels

UID = "rankwatch-overview"


def overview_dashboard() -> dashboard.Dashboard:
    ids = PanelIds()
    board = base_dashboard(
        "rankwatch / Overview",
        UID,
        "Online ranking quality of the last published window next to the offline baseline, per slice; "
        "sample sizes; the pipeline's health. Alerts: docs/alerts.md.",
    )
    for var in [datasource_variable(), *slice_variables(), metric_variable(), window_variable()]:
        board = board.with_variable(var)

    sel = f'metric=~"$metric", window=~"$window", {SLICE}'
    board = board.with_row(row(ids, "$metric: online vs offline baseline", repeat="metric"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "$metric: online vs offline baseline",
            "Online: value of the last published window (requests-weighted over instances). Dashed: the "
            "offline baseline of the same slice. Dotted: the 95 % (logit) interval of each line.",
            [
                query(f"{ONLINE}{{{sel}}}", f"online {SLICE_LEGEND} {{{{window}}}}", "A"),
                query(f'{OFFLINE}{{metric=~"$metric", {SLICE}}}', f"baseline {SLICE_LEGEND}", "B"),
                query(f"{ONLINE_LOWER}{{{sel}}}", f"95% lower online {SLICE_LEGEND} {{{{window}}}}", "C"),
                query(f"{ONLINE_UPPER}{{{sel}}}", f"95% upper online {SLICE_LEGEND} {{{{window}}}}", "D"),
                query(f'{OFFLINE_LOWER}{{metric=~"$metric", {SLICE}}}', f"95% lower baseline {SLICE_LEGEND}", "E"),
                query(f'{OFFLINE_UPPER}{{metric=~"$metric", {SLICE}}}', f"95% upper baseline {SLICE_LEGEND}", "F"),
            ],
            width=8,
            dashed_regex="^baseline.*",
            band_regex=BAND_REGEX,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "$metric: drift, online - offline",
            "Absolute drift of the online value from the baseline; negative is worse than offline. Dotted: "
            "its 95 % interval, drift -+ 1.96 SE with SE = sqrt(SE_online^2 + SE_offline^2).",
            [
                query(f"{DRIFT}{{{sel}}}", SLICE_LEGEND, "A"),
                query(f"{DRIFT_LOWER}{{{sel}}}", f"95% lower {SLICE_LEGEND}", "B"),
                query(f"{DRIFT_UPPER}{{{sel}}}", f"95% upper {SLICE_LEGEND}", "C"),
            ],
            width=8,
            band_regex=BAND_REGEX,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "$metric: relative drift, online / offline - 1",
            "Relative drift, comparable across metrics. RankwatchQualityBelowBaseline fires below -3 % "
            "when the drop is also significant (99 % one-sided), on the 1h window, sustained.",
            [query(f"{DRIFT_RELATIVE}{{{sel}}}", SLICE_LEGEND, "A")],
            unit="percentunit",
            width=8,
        )
    )

    board = board.with_row(row(ids, "AUC"))
    for metric, title in (("auc_roc", "AUC-ROC"), ("auc_pr", "AUC-PR")):
        auc_sel = f'metric="{metric}", window=~"$window", {SLICE}'
        board = board.with_panel(
            timeseries_panel(
                ids,
                f"{title}: online vs offline baseline",
                f"{title} pooled over the shown items of each slice; absent for a one-class slice. Dashed: "
                "baseline. Dotted: 95 % intervals (request-clustered SEs).",
                [
                    query(f"{ONLINE}{{{auc_sel}}}", f"online {SLICE_LEGEND}", "A"),
                    query(f'{OFFLINE}{{metric="{metric}", {SLICE}}}', f"baseline {SLICE_LEGEND}", "B"),
                    query(f"{ONLINE_LOWER}{{{auc_sel}}}", f"95% lower online {SLICE_LEGEND}", "C"),
                    query(f"{ONLINE_UPPER}{{{auc_sel}}}", f"95% upper online {SLICE_LEGEND}", "D"),
                ],
                dashed_regex="^baseline.*",
                band_regex=BAND_REGEX,
            )
        )

    board = board.with_row(row(ids, "Worst drifts"))
    board = board.with_panel(
        table_panel(
            ids,
            "Worst drifts per slice, by z score",
            "The 25 slices and metrics with the lowest z = (online - offline) / SE (the most significant "
            "drops first), with the drift, its SE, the relative drift and the sample sizes.",
            [
                query(f"sort(bottomk(25, {DRIFT_Z}{{{sel}}}))", "", "A", instant=True),
                query(f"{DRIFT}{{{sel}}}", "", "B", instant=True),
                query(f"{DRIFT_STDERR}{{{sel}}}", "", "E", instant=True),
                query(f"{DRIFT_RELATIVE}{{{sel}}}", "", "F", instant=True),
                query(f'{REQUESTS_ONLINE}{{window=~"$window", {SLICE}}}', "", "C", instant=True),
                query(f"{REQUESTS_OFFLINE}{{{SLICE}}}", "", "D", instant=True),
            ],
            rename={
                "Value #A": "z",
                "Value #B": "online - offline",
                "Value #E": "SE",
                "Value #F": "relative drift",
                "Value #C": "requests (online)",
                "Value #D": "requests (baseline)",
            },
            sort_by="z",
        )
    )

    board = board.with_row(row(ids, "Sample sizes"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Requests behind the online values",
            "Requests of the last published window per slice, summed over instances. Quality alerts need "
            "significance (the interval carries the sample size) and at least 30 requests in the 1h window.",
            [query(f'{REQUESTS_ONLINE}{{window=~"$window", {SLICE}}}', SLICE_LEGEND, "A")],
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Finalized requests per second",
            "Requests finalized per second (5m rate), summed over instances.",
            [
                query(
                    f"segment_surface_variant:rankwatch_finalized_requests:rate5m{{{SLICE}}}",
                    SLICE_LEGEND,
                    "A",
                )
            ],
            unit="reqps",
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Requests behind the baselines",
            "Sample size of each slice in the offline evaluation set.",
            [query(f"{REQUESTS_OFFLINE}{{{SLICE}}}", SLICE_LEGEND, "A")],
            width=8,
        )
    )

    board = board.with_row(row(ids, "Fleet-exact running means (cumulative sums)"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Mean of the requests finalized in the last hour",
            "sum(rate(_sum[1h])) / sum(rate(_count[1h])) over all instances: exact for a fleet. "
            "RankwatchQualitySuddenDrop compares it with the slice's previous day.",
            [query(f'{MEAN_1H}{{metric=~"$metric", {SLICE}}}', f"{{{{metric}}}} {SLICE_LEGEND}", "A")],
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Per segment, all surfaces and variants, last hour",
            "Roll-up of the primary slices per segment (fleet-exact).",
            [
                query(
                    'segment:rankwatch_ranking_metric:mean_rate1h{metric=~"$metric", segment=~"$segment"}',
                    "{{metric}} {{segment}}",
                    "A",
                )
            ],
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Whole fleet: last hour and last 5 minutes",
            "The overall slice of every instance, summed.",
            [
                query('metric:rankwatch_ranking_metric:mean_rate1h{metric=~"$metric"}', "{{metric}} 1h", "A"),
                query('metric:rankwatch_ranking_metric:mean_rate5m{metric=~"$metric"}', "{{metric}} 5m", "B"),
            ],
            width=8,
        )
    )

    board = ranking_panels(board, ids)
    board = transfer_panels(board, ids)
    return _pipeline_health(board, ids)


def _pipeline_health(board: dashboard.Dashboard, ids: PanelIds) -> dashboard.Dashboard:
    board = board.with_row(row(ids, "Pipeline health"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Consumer lag",
            "Messages behind the high watermark per consumer group and topic (RankwatchConsumerLagGrowing).",
            [query("job_topic:rankwatch_consumer_lag:sum", "{{job}} {{topic}}", "A")],
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Watermark delay",
            "Event-time clock minus the event-time watermark: how far behind the windows close.",
            [query("max by (instance) (rankwatch_watermark_delay_seconds)", "{{instance}}", "A")],
            unit="s",
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Pending requests",
            "Requests waiting for their attribution window to end, and the cap beyond which they are "
            "finalized early (RankwatchRequestsEvicted).",
            [
                query("sum by (instance) (rankwatch_pending_requests)", "pending {{instance}}", "A"),
                query("max by (instance) (rankwatch_pending_requests_limit)", "limit {{instance}}", "B"),
                query(
                    "sum by (instance) (rate(rankwatch_requests_evicted_total[5m]))",
                    "evicted/s {{instance}}",
                    "C",
                ),
            ],
            width=8,
            dashed_regex="^limit.*",
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Events by outcome",
            "Events per second by stream and outcome (accepted, duplicate, rejected, orphan, late).",
            [query("stream_outcome:rankwatch_events:rate5m", "{{stream}} {{outcome}}", "A")],
            unit="ops",
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Rejects by reason",
            "Rejected events per second by reason, and the rejected share of each stream "
            "(RankwatchRejectRateSpike).",
            [
                query("stream_reason:rankwatch_rejected_events:rate5m", "{{stream}} {{reason}}", "A"),
                query("stream:rankwatch_events_rejected:ratio_rate5m", "share {{stream}}", "B"),
            ],
            unit="ops",
            width=8,
        )
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Label values and overflow",
            "Distinct values per slice label against the cap; events folded into __other__ per second "
            "(RankwatchLabelOverflow).",
            [
                query("max by (label) (rankwatch_label_values)", "{{label}} values", "A"),
                query("max(rankwatch_label_values_limit)", "cap", "B"),
                query("sum by (label) (rate(rankwatch_label_overflow_total[5m]))", "{{label}} folded/s", "C"),
            ],
            width=8,
            dashed_regex="^cap$",
        )
    )
    board = board.with_panel(
        stat_panel(
            ids,
            "Since last publication",
            "Time since the last window of each size was published (RankwatchPipelineStalled).",
            [query("time() - max by (window) (rankwatch_last_publish_timestamp_seconds)", "{{window}}", "A")],
            unit="s",
            width=12,
        )
    )
    board = board.with_panel(
        stat_panel(
            ids,
            "Baseline age",
            "Age of each loaded baseline file (RankwatchBaselineStale after 7 days).",
            [query("max by (baseline) (rankwatch_baseline_age_seconds)", "{{baseline}}", "A")],
            unit="s",
            width=12,
        )
    )
    return board
