"""Prometheus exposition for rankwatch (docs/exporter.md).

- :class:`exporters.state.MetricsState`: ``publish_window(pw)``, ``set_stream_stats(stats)``,
  ``set_consumer_lag({(topic, partition): lag})``, ``set_baselines(...)``; immutable snapshots.
- :func:`exporters.collector.build_registry`: the custom collector in its own registry.
- :class:`exporters.http.MetricsServer`: ``/metrics``, ``/healthz``, ``/readyz``; TLS and basic auth.
- :class:`exporters.baselines.BaselineWatcher`: baseline files, reloaded when they change.
- :class:`exporters.scheduling.ExporterScheduler`: APScheduler jobs (idle ticks, reloads, lag polling).
"""
