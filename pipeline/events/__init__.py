"""Events of the contract (docs/events.md) and of a team's own schema (docs/mapping.md, docs/formats.md).

- ``records``: decoded, validated impressions and feedback, the types the join takes.
- ``validation``: raw bytes to records, or a rejection with its reason.
- ``deadletter``: rejected events with their raw bytes and reason, for a person to inspect.
- ``paths``, ``mapping``: a team's ``[events.*]`` tables compiled once into plain accessors (paths, units,
  value maps, defaults, positions, list or item layouts).
- ``translate``: a team's event to section 1 events (or a rejection), digest ids; ``reverse`` runs the
  mapping backwards (the simulator's traffic in a team's shape).
- ``formats/``: Avro and Protobuf values (raw or Confluent-framed) as the dict trees the mapping reads.
- ``logs``, ``container_log``: logged events (JSONL, gzip, Avro container files) merged by event time in
  batches for the streaming core's batch path.

Why a room of its own: how a team's events read changes without the join, windows or kernel knowing; every
path ends in section 1 events, so online, replayed and mapped input meet one core.
"""
