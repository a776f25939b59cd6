"""Pure core of rankwatch: events, the join and windows, the metric kernel, offline baselines, experiments.

Layout, one concept a package, imports pointing down (a test draws them from the code):

- ``metrics/``: the one kernel and everything computed from its output: options, per-request metrics,
  pooled and grouped AUCs, request-clustered states, standard errors, mergeable aggregates, positions,
  score drift and the result document.
- ``events/``: the events of the contract and of a team's own schema: types, decoding and validation, dead
  letters, the field mapping, Avro and Protobuf, logged events in event-time order.
- ``offline/``: evaluation sets read, validated and grouped, in memory or in bounded memory, into baselines.
- ``experiments/``: A/B definitions, per-arm sufficient statistics, their statistics and reports, and the
  online accumulators of the service.
- ``stream/``: the streaming core: join, bounded memories, watermark, windows, snapshots, the processor and
  its batch path.
- ``transfer/``: offline-to-online transfer: ledgers, paired offline differences, slopes corrected for the
  noise in both differences, and their intervals.
- ``traffic/``: the deterministic traffic generator the simulator, the demo and the tests share.
- Loose at the top, used by several rooms: ``clock`` (injected clocks), ``errors`` (one-line errors),
  ``slicing`` (slice keys and caps) and ``published`` (a published window, what the core hands out).

Why: the streaming core and the offline path must compute the same numbers, so both stand on ``metrics/``
and neither on the other. Nothing in this package imports Kafka, HTTP, a scheduler or reads the wall clock;
time comes in through :class:`pipeline.clock.Clock`.
"""
