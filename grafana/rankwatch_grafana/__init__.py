"""rankwatch's Grafana dashboards as code (grafana-foundation-sdk).

Run ``python grafana/generate.py`` from the repository root to write ``grafana/dashboards/*.json``; see
docs/dashboards.md. This package lives under ``grafana/`` on purpose and is not installed with rankwatch.
"""

from rankwatch_grafana.ab import ab_dashboard
from rankwatch_grafana.overview import overview_dashboard

DASHBOARDS = {
    "rankwatch-overview.json": overview_dashboard,
    "rankwatch-ab.json": ab_dashboard,
}

__all__ = ["DASHBOARDS", "ab_dashboard", "overview_dashboard"]
