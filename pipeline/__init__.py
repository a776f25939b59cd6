"""Pure core of rankwatch: events, validation, join, windows, the metric kernel and offline baselines.

Nothing in this package imports Kafka, HTTP, a scheduler or reads the wall clock; time comes in through
:class:`pipeline.clock.Clock`.
"""
