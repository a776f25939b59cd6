"""Prometheus family names and label sets (SPEC section 5 and docs/architecture.md "Prometheus names").

Dashboards, alert rules and tests rely on these exact strings; they are kept in one place so a rename is a
deliberate, reviewed change. Counter family names are given without the ``_total`` suffix, as
prometheus-client's ``Metric`` expects; the exposed sample name adds it.
"""

from __future__ import annotations

SLICE_LABEL_NAMES: tuple[str, str, str] = ("segment", "surface", "variant")

# SPEC section 5
RANKING_QUALITY = "rankwatch_ranking_quality"  # gauge {metric, source, window, segment, surface, variant}
RANKING_QUALITY_DRIFT = "rankwatch_ranking_quality_drift"  # gauge {metric, window, segment, surface, variant}
RANKING_REQUESTS = "rankwatch_ranking_requests"  # gauge {source, window, segment, surface, variant}
EVENTS = "rankwatch_events"  # counter {stream, outcome}
RANKING_QUALITY_STDERR = "rankwatch_ranking_quality_stderr"  # gauge {metric, source, window, segment, ...}

# The online window's sufficient statistics per slice: instances sum them, so recording rules
# get a fleet's mean and standard error exactly (per-request metrics).
WINDOW_OBSERVATIONS = "rankwatch_ranking_window_observations"  # gauge {metric, window, segment, surface, variant}
WINDOW_SUM = "rankwatch_ranking_window_sum_of_values"  # gauge {metric, window, segment, surface, variant}
WINDOW_SUM_OF_SQUARES = "rankwatch_ranking_window_sum_of_squares"  # gauge {metric, window, segment, ...}
WINDOW_START = "rankwatch_ranking_window_start_timestamp_seconds"  # gauge {window}

# Fleet-exact cumulative parts, fed from the smallest window
RANKING_METRIC = "rankwatch_ranking_metric"  # summary {metric, segment, surface, variant}: _sum, _count
FINALIZED_REQUESTS = "rankwatch_finalized_requests"  # counter {segment, surface, variant}

# Health (docs/architecture.md)
REJECTED_EVENTS = "rankwatch_rejected_events"  # counter {stream, reason}
CONSUMER_LAG = "rankwatch_consumer_lag"  # gauge {topic, partition}
KAFKA_OUTAGE = "rankwatch_kafka_outage"  # gauge: 1 while Kafka is unreachable (consumers/outage.py)
KAFKA_OUTAGE_SECONDS = "rankwatch_kafka_outage_seconds"  # counter: seconds spent in Kafka outages
# gauge: 1 while the schema registry answers, 0 in an outage; only with a Confluent-framed topic (docs/formats.md)
SCHEMA_REGISTRY_UP = "rankwatch_schema_registry_up"
SCHEMA_REGISTRY_OUTAGE_SECONDS = "rankwatch_schema_registry_outage_seconds"  # counter: seconds of registry outages
WATERMARK_DELAY = "rankwatch_watermark_delay_seconds"  # gauge
PENDING_REQUESTS = "rankwatch_pending_requests"  # gauge
PENDING_REQUESTS_LIMIT = "rankwatch_pending_requests_limit"  # gauge
PENDING_ITEMS = "rankwatch_pending_items"  # gauge
REQUESTS_EVICTED = "rankwatch_requests_evicted"  # counter
LABEL_VALUES = "rankwatch_label_values"  # gauge {label}
LABEL_VALUES_LIMIT = "rankwatch_label_values_limit"  # gauge
LABEL_OVERFLOW = "rankwatch_label_overflow"  # counter {label}
BASELINE_AGE = "rankwatch_baseline_age_seconds"  # gauge {baseline}
BASELINE_LOAD_ERRORS = "rankwatch_baseline_load_errors"  # counter {baseline}
LAST_PUBLISH_TIMESTAMP = "rankwatch_last_publish_timestamp_seconds"  # gauge {window}
WINDOWS_PUBLISHED = "rankwatch_windows_published"  # counter {window}
BUILD_INFO = "rankwatch_build_info"  # gauge {version} = 1

# Additions of the exporter (documented in docs/exporter.md)
DRIFT_UNMATCHED_SLICES = "rankwatch_drift_unmatched_slices"  # gauge {window, only_in}
BASELINE_LOADED = "rankwatch_baseline_loaded"  # gauge {baseline}: 1 = file on disk is the one served
BASELINE_SLICES = "rankwatch_baseline_slices"  # gauge {baseline}: slices exposed from that file
EXPORTER_LABEL_OVERFLOW = (
    "rankwatch_exporter_label_overflow"  # counter {label}: slices folded by the exporter
)

# GAUC, positions and score drift (docs/exporter.md, docs/metrics.md)
POSITION_CTR = "rankwatch_position_ctr"  # gauge {rank, source, window, segment, surface, variant}
SCORE_DRIFT = "rankwatch_score_drift"  # gauge {statistic=psi|ks, window, segment, surface, variant}
SCORE_DRIFT_ITEMS = "rankwatch_score_drift_items"  # gauge {window, segment, surface, variant}: items compared
GAUC_ITEMS_DROPPED = "rankwatch_gauc_items_dropped"  # gauge {window, segment, surface, variant}: past the cap

SOURCE_ONLINE = "online"
SOURCE_OFFLINE = "offline"
BASELINE_WINDOW = "baseline"

# offline-to-online transfer, from the [transfer] ledgers (exporters/transfer.py, docs/exporter.md)
TRANSFER_SLOPE = "rankwatch_transfer_slope"  # gauge {metric, segment, estimator=ols|corrected}
TRANSFER_SLOPE_LOWER = "rankwatch_transfer_slope_lower"  # gauge {metric, segment}: corrected slope, 95 % lower
TRANSFER_SLOPE_UPPER = "rankwatch_transfer_slope_upper"  # gauge {metric, segment}: corrected slope, 95 % upper
TRANSFER_CORRELATION = "rankwatch_transfer_correlation"  # gauge {metric, segment}: corrected
TRANSFER_SIGN_AGREEMENT = "rankwatch_transfer_sign_agreement"  # gauge {metric, segment}
TRANSFER_COMPARISONS = "rankwatch_transfer_comparisons"  # gauge {metric, segment}
TRANSFER_OFFLINE_DIFF = "rankwatch_transfer_offline_diff"  # gauge {metric, segment, experiment, candidate}
TRANSFER_ONLINE_DIFF = "rankwatch_transfer_online_diff"  # gauge {metric, segment, experiment, candidate}
TRANSFER_LOAD_ERRORS = "rankwatch_transfer_load_errors"  # counter: failed ledger (re)loads
