"""Building blocks shared by the dashboards: the datasource, template variables, queries and panels.

Every query names recording rules of deploy/prometheus/rules/ where one exists, so a dashboard shows the
same numbers as the alerts, and every slice filter is a regex match (``=~``) so that the "All" value
``.*`` of a variable works.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import prometheus as prometheus_models

# The datasource of every panel is the dashboard's "datasource" variable; its default is the datasource
# provisioned by grafana/provisioning/datasources/rankwatch.yml.
DATASOURCE_UID = "rankwatch-prometheus"
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label matchers of the slice variables, for series that carry segment, surface and variant.
SLICE = 'segment=~"$segment", surface=~"$surface", variant=~"$variant"'

# Recording rules (deploy/prometheus/rules/rankwatch-recording.yml).
ONLINE = "segment_surface_variant:rankwatch_ranking_quality_online:requests_weighted_mean"
OFFLINE = "segment_surface_variant:rankwatch_ranking_quality_offline:max"
DRIFT = "segment_surface_variant:rankwatch_ranking_quality_drift:online_minus_offline"
DRIFT_RELATIVE = "segment_surface_variant:rankwatch_ranking_quality_drift:relative"
DRIFT_STDERR = "segment_surface_variant:rankwatch_ranking_quality_drift:stderr"
DRIFT_Z = "segment_surface_variant:rankwatch_ranking_quality_drift:z"
DRIFT_LOWER = "segment_surface_variant:rankwatch_ranking_quality_drift:lower95"
DRIFT_UPPER = "segment_surface_variant:rankwatch_ranking_quality_drift:upper95"
ONLINE_LOWER = "segment_surface_variant:rankwatch_ranking_quality_online:lower95"
ONLINE_UPPER = "segment_surface_variant:rankwatch_ranking_quality_online:upper95"
OFFLINE_LOWER = "segment_surface_variant:rankwatch_ranking_quality_offline:lower95"
OFFLINE_UPPER = "segment_surface_variant:rankwatch_ranking_quality_offline:upper95"
# Legend prefix of the 95 % interval bounds; timeseries_panel(band_regex=...) draws them as a light band.
BAND_REGEX = "^95% .*"
REQUESTS_ONLINE = "segment_surface_variant:rankwatch_ranking_requests_online:sum"
REQUESTS_OFFLINE = "segment_surface_variant:rankwatch_ranking_requests_offline:max"
MEAN_1H = "segment_surface_variant:rankwatch_ranking_metric:mean_rate1h"
SLICE_LEGEND = "{{segment}}/{{surface}}/{{variant}}"


class PanelIds:
    """Stable, sequential panel ids (Grafana needs them unique within a dashboard)."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._next


def row(ids: PanelIds, title: str, *, repeat: str | None = None) -> dashboard.Row:
    """A row; with ``repeat`` Grafana repeats the row and its panels once per value of that variable."""
    r = dashboard.Row(title).id(ids())
    if repeat is not None:
        r = r.repeat(repeat)
    return r


def query(expr: str, legend: str, ref_id: str, *, instant: bool = False) -> prometheus.Dataquery:
    """A Prometheus target; ``instant`` ones are formatted as a table."""
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(DATASOURCE)
    if instant:
        q = q.instant().format(prometheus_models.PromQueryFormat.TABLE)
    else:
        q = q.range()
    return q


def _targets(panel: Any, targets: Sequence[prometheus.Dataquery]) -> Any:
    for t in targets:
        panel = panel.with_target(t)
    return panel


def _framed(panel: Any, ids: PanelIds, title: str, description: str, width: int, height: int) -> Any:
    """The settings every rankwatch panel shares: id, title, description, datasource and size."""
    return panel.id(ids()).title(title).description(description).datasource(DATASOURCE).span(width).height(height)


def timeseries_panel(
    ids: PanelIds,
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "none",
    width: int = 12,
    height: int = 8,
    dashed_regex: str | None = None,
    band_regex: str | None = None,
) -> timeseries.Panel:
    """A time series panel; series whose name matches ``dashed_regex`` (e.g. baselines) are dashed.

    Series matching ``band_regex`` are the bounds of 95 % intervals: thin dotted lines, lightly filled
    towards each other's side (Grafana's fill-between needs fixed series names, which slices do not have).
    """
    panel = (
        _framed(timeseries.Panel(), ids, title, description, width, height)
        .unit(unit)
        .line_width(1)
        .fill_opacity(0)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common_models.LegendDisplayMode.TABLE)
            .placement(common_models.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull"])
        )
    )
    if dashed_regex is not None:
        panel = panel.override_by_regexp(
            dashed_regex,
            [models.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})],
        )
    if band_regex is not None:
        panel = panel.override_by_regexp(
            band_regex,
            [
                models.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dot", "dash": [0, 4]}),
                models.DynamicConfigValue(id_val="custom.lineWidth", value=1),
                models.DynamicConfigValue(id_val="custom.fillOpacity", value=6),
                models.DynamicConfigValue(id_val="custom.hideFrom", value={"legend": True, "tooltip": False, "viz": False}),
            ],
        )
    return _targets(panel, targets)


def table_panel(
    ids: PanelIds,
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    rename: dict[str, str],
    width: int = 24,
    height: int = 10,
    sort_by: str | None = None,
) -> table.Panel:
    """A table of instant queries, merged into one row per label set, columns renamed by ``rename``;
    rows sorted ascending by the column named ``sort_by``."""
    panel = (
        _framed(table.Panel(), ids, title, description, width, height)
        .with_transformation(models.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            models.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True}, "renameByName": rename},
            )
        )
    )
    if sort_by is not None:
        panel = panel.sort_by([common_builders.TableSortByFieldState().display_name(sort_by).desc(False)])
    return _targets(panel, targets)


def stat_panel(
    ids: PanelIds,
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "none",
    width: int = 6,
    height: int = 6,
) -> stat.Panel:
    panel = (
        _framed(stat.Panel(), ids, title, description, width, height)
        .unit(unit)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
    )
    return _targets(panel, targets)


def datasource_variable() -> dashboard.DatasourceVariable:
    return (
        dashboard.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .current(models.VariableOption(selected=True, text="Prometheus (rankwatch)", value=DATASOURCE_UID))
    )


def label_variable(
    name: str,
    label: str,
    source: str,
    *,
    multi: bool = True,
    include_all: bool = True,
    default: str | None = None,
    of: str | None = None,
) -> dashboard.QueryVariable:
    """A variable over the values of label ``of`` (default: ``name``) of ``source``; "All" is the regex ``.*``."""
    var = (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({source}, {of or name})")
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(include_all)
    )
    if include_all:
        var = var.all_value(".*")
    if default is not None:
        var = var.current(models.VariableOption(selected=True, text=default, value=default))
    elif include_all:
        var = var.current(models.VariableOption(selected=True, text="All", value="$__all"))
    return var


def slice_variables() -> list[dashboard.QueryVariable]:
    source = 'rankwatch_ranking_requests{source="online"}'
    return [
        label_variable("segment", "Segment", source),
        label_variable("surface", "Surface", source),
        label_variable("variant", "Variant", source),
    ]


def window_variable() -> dashboard.QueryVariable:
    return label_variable(
        "window",
        "Window",
        'rankwatch_ranking_requests{source="online"}',
        multi=False,
        include_all=False,
        default="1h",
    )


def metric_variable() -> dashboard.QueryVariable:
    return label_variable("metric", "Metric", 'rankwatch_ranking_quality{source="online"}')


def base_dashboard(title: str, uid: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["rankwatch", "ranking-quality"])
        .editable()
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("utc")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("rankwatch dashboards")
            .type(models.DashboardLinkType.DASHBOARDS)
            .tags(["rankwatch"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


def to_json(board: dashboard.Dashboard) -> str:
    """The dashboard as stable, human-diffable JSON (what is committed under grafana/dashboards/)."""
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
