"""Overview panels of the transfer row: does an offline gain show up online? (the exporter's ``[transfer] ledgers``).

One row: an XY chart of the offline against the online difference of every ledgered comparison, with each
comparison's value on its segment's fitted line (corrected slope x offline difference); the corrected slope
with its 95 % interval per segment (stat); a table per segment of both slopes, the interval, the corrected
correlation, the sign agreement and the number of comparisons.

Every query aggregates ``max by`` the labels that identify a point or a group: instances serve the same
ledgers, and the table / XY chart join their instant queries by those labels (``merge``), which only works
when the metric name and the instance labels are gone.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, xychart
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import xychart as xy_models

from rankwatch_grafana.common import PanelIds, _framed, _targets, query, row, stat_panel, table_panel

SLOPE = "rankwatch_transfer_slope"
SLOPE_LOWER = "rankwatch_transfer_slope_lower"
SLOPE_UPPER = "rankwatch_transfer_slope_upper"
CORRELATION = "rankwatch_transfer_correlation"
SIGN_AGREEMENT = "rankwatch_transfer_sign_agreement"
COMPARISONS = "rankwatch_transfer_comparisons"
OFFLINE_DIFF = "rankwatch_transfer_offline_diff"
ONLINE_DIFF = "rankwatch_transfer_online_diff"

GROUP = 'metric=~"$metric", segment=~"$segment"'
BY_GROUP = "max by (metric, segment)"
BY_POINT = "max by (metric, segment, experiment, candidate)"
X_FIELD, Y_FIELD, FIT_FIELD = "offline difference", "online difference", "on the fitted line"


def _scatter(ids: PanelIds) -> xychart.Panel:
    """Offline (x) against online (y) difference per comparison, and its point on the fitted line."""
    offline = f"{BY_POINT} ({OFFLINE_DIFF}{{{GROUP}}})"
    fitted = (f"{offline} * on (metric, segment) group_left "
              f'{BY_GROUP} ({SLOPE}{{{GROUP}, estimator="corrected"}})')  # fmt: skip
    panel = (
        _framed(xychart.Panel(), ids, "Offline vs online difference per comparison",
                "One point per ledgered comparison (candidate - reference, latest line): x its offline "
                "difference, y its online difference; the small points are corrected slope x offline "
                "difference, the segment's fitted line (errors-in-variables, docs/transfer.md). Points near "
                "y = 0 whatever x is: offline gains do not show up online. Pick one segment to read one line.",
                width=12, height=10)  # fmt: skip
        .series_mapping(xy_models.SeriesMapping.AUTO)
        .dims(xychart.XYDimensionConfig().frame(0).x(X_FIELD))
        .show(xy_models.ScatterShow.POINTS)
        .legend(common_builders.VizLegendOptions().show_legend(True)
                .display_mode(common_models.LegendDisplayMode.LIST)
                .placement(common_models.LegendPlacement.BOTTOM))  # fmt: skip
        .with_transformation(models.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(models.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True},
            "renameByName": {"Value #A": X_FIELD, "Value #B": Y_FIELD, "Value #C": FIT_FIELD}}))  # fmt: skip
        .override_by_name(FIT_FIELD, [models.DynamicConfigValue(id_val="custom.pointSize", value={"fixed": 3})])
    )
    return _targets(panel, [  # type: ignore[no-any-return]
        query(offline, "", "A", instant=True),
        query(f"{BY_POINT} ({ONLINE_DIFF}{{{GROUP}}})", "", "B", instant=True),
        query(fitted, "", "C", instant=True),
    ])  # fmt: skip


def transfer_panels(board: dashboard.Dashboard, ids: PanelIds) -> dashboard.Dashboard:
    """The transfer row: XY chart, corrected slope with its interval, table per segment."""
    board = board.with_row(row(ids, "Offline-to-online transfer (model versions)"))
    board = board.with_panel(_scatter(ids))
    board = board.with_panel(
        stat_panel(
            ids,
            "Corrected slope [95 % interval] per segment",
            "Online difference per unit of offline difference, corrected for the offline noise, with its "
            "95 % jackknife t interval. RankwatchTransferSlopeBelowFloor fires when the upper end stays "
            "below the floor (0.2) over at least 8 comparisons: offline gains in that segment no longer "
            "transfer.",
            [
                query(f'{BY_GROUP} ({SLOPE}{{{GROUP}, estimator="corrected"}})', "{{segment}} slope", "A"),
                query(f"{BY_GROUP} ({SLOPE_LOWER}{{{GROUP}}})", "{{segment}} lower 95%", "B"),
                query(f"{BY_GROUP} ({SLOPE_UPPER}{{{GROUP}}})", "{{segment}} upper 95%", "C"),
            ],
            width=12,
            height=10,
        )
    )
    board = board.with_panel(
        table_panel(
            ids,
            "Transfer per segment",
            "Per metric and segment over the ledgers' latest comparisons: the naive OLS slope (attenuated "
            "by offline noise), the corrected slope with its 95 % interval, the corrected correlation, the "
            "share of significant online differences whose sign offline had, and the number of comparisons "
            "(rankwatch transfer --by segment gives the same numbers).",
            [
                query(f'{BY_GROUP} ({SLOPE}{{{GROUP}, estimator="ols"}})', "", "A", instant=True),
                query(f'{BY_GROUP} ({SLOPE}{{{GROUP}, estimator="corrected"}})', "", "B", instant=True),
                query(f"{BY_GROUP} ({SLOPE_LOWER}{{{GROUP}}})", "", "C", instant=True),
                query(f"{BY_GROUP} ({SLOPE_UPPER}{{{GROUP}}})", "", "D", instant=True),
                query(f"{BY_GROUP} ({CORRELATION}{{{GROUP}}})", "", "E", instant=True),
                query(f"{BY_GROUP} ({SIGN_AGREEMENT}{{{GROUP}}})", "", "F", instant=True),
                query(f"{BY_GROUP} ({COMPARISONS}{{{GROUP}}})", "", "G", instant=True),
            ],
            rename={
                "Value #A": "slope OLS",
                "Value #B": "slope corrected",
                "Value #C": "lower 95%",
                "Value #D": "upper 95%",
                "Value #E": "correlation corrected",
                "Value #F": "sign agreement",
                "Value #G": "comparisons",
            },
            sort_by="segment",
        )
    )
    return board
