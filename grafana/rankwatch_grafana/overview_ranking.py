"""Overview panels of the ranking metrics beyond the core four: GAUC, precision / recall / hit rate, positive rate, click-through by
position (online against the baseline) and score-distribution drift."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from rankwatch_grafana.common import (
    OFFLINE,
    ONLINE,
    SLICE,
    SLICE_LEGEND,
    PanelIds,
    query,
    row,
    timeseries_panel,
)

CTR = "rankwatch_position_ctr"
SCORE_DRIFT = "rankwatch_score_drift"
SCORE_DRIFT_ITEMS = "rankwatch_score_drift_items"


def ranking_panels(board: dashboard.Dashboard, ids: PanelIds) -> dashboard.Dashboard:
    """Three rows: more ranking metrics, click-through by position, score drift."""
    board = board.with_row(row(ids, "GAUC, precision / recall / hit rate, positive rate"))
    for metrics, title, description in (
        ("gauc", "GAUC: online vs offline baseline",
         "Impression-weighted mean of per-user AUC-ROC (DIN paper); one-class users left out. Online it is "
         "exact per instance when both topics are keyed by user_id (docs/metrics.md). Dashed: baseline."),
        ("precision@.*|recall@.*|hit_rate@.*", "Precision, recall and hit rate at k",
         "Per-request means (trec_eval P_k, recall_k, success_k), requests without a relevant item left "
         "out by default. Dashed: baseline."),
        ("positive_rate", "Positive rate: online vs offline baseline",
         "Shown items with rel > 0 / shown items. Labels arrive after the attribution window."),
    ):  # fmt: skip
        sel = f'metric=~"{metrics}", {SLICE}'
        board = board.with_panel(
            timeseries_panel(
                ids,
                title,
                description,
                [
                    query(
                        f'{ONLINE}{{{sel}, window=~"$window"}}', f"online {{{{metric}}}} {SLICE_LEGEND}", "A"
                    ),
                    query(f"{OFFLINE}{{{sel}}}", f"baseline {{{{metric}}}} {SLICE_LEGEND}", "B"),
                ],
                width=8,
                dashed_regex="^baseline.*",
            )  # fmt: skip
        )

    board = board.with_row(row(ids, "Click-through by position"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Click-through by rank: online vs offline baseline",
            "Share of shown items with rel > 0 at each rank 1..10, averaged over the selected slices and "
            "instances. A change of shape at the top ranks with the baseline unchanged points at the UI or "
            "position bias; relevant items moving down the ranks, at the model. Dashed: baseline.",
            [
                query(
                    f'avg by (rank) ({CTR}{{source="online", window=~"$window", {SLICE}}})',
                    "online rank {{rank}}",
                    "A",
                ),
                query(f'avg by (rank) ({CTR}{{source="offline", {SLICE}}})', "baseline rank {{rank}}", "B"),
            ],
            unit="percentunit",
            width=24,
            dashed_regex="^baseline.*",
        )  # fmt: skip
    )

    board = board.with_row(row(ids, "Score-distribution drift"))
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Score PSI against the baseline",
            "Population stability index of the window's scores over the baseline slice's 20 quantile bins "
            "(RankwatchScoreDistributionShift above 0.2 with 2000 items, 5m window, 15m). Known before any "
            "click.",
            [
                query(
                    f'max by (window, segment, surface, variant) ({SCORE_DRIFT}{{statistic="psi", window=~"$window", {SLICE}}})',
                    f"{SLICE_LEGEND} {{{{window}}}}",
                    "A",
                )
            ],
            width=8,
        )  # fmt: skip
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Score KS against the baseline",
            "Largest gap between the window's and the baseline's score CDFs at the bin edges.",
            [
                query(
                    f'max by (window, segment, surface, variant) ({SCORE_DRIFT}{{statistic="ks", window=~"$window", {SLICE}}})',
                    f"{SLICE_LEGEND} {{{{window}}}}",
                    "A",
                )
            ],
            width=8,
        )  # fmt: skip
    )
    board = board.with_panel(
        timeseries_panel(
            ids,
            "Items behind the score drift",
            "Scored items of the window per slice, summed over instances.",
            [
                query(
                    f'sum by (window, segment, surface, variant) ({SCORE_DRIFT_ITEMS}{{window=~"$window", {SLICE}}})',
                    f"{SLICE_LEGEND} {{{{window}}}}",
                    "A",
                )
            ],
            width=8,
        )  # fmt: skip
    )
    return board
