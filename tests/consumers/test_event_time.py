"""consumers/event_time.py: the event time the merge orders by equals the time of the event the core reads.

The golden messy traffic (tests/pipeline/golden_traffic.py), native and in the two foreign shapes of
``replay --config``'s test: wherever the translator maps a message, the ts-only reader gives the translated
event's time (:meth:`Translator.event_ts_ms`); a message without a readable time gets 0.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipeline"))
from golden_traffic import messy_traffic  # noqa: E402

from rankwatch.consumers.event_time import event_time_of  # noqa: E402
from rankwatch.pipeline.events.mapping import EventMapping  # noqa: E402
from rankwatch.pipeline.events.translate import translator_for  # noqa: E402
from rankwatch.pipeline.events.validation import sniff_ts_ms  # noqa: E402
from tests.rankwatch.test_cli_replay_mapped import CONFIG_A, CONFIG_B, shape_a, shape_b  # noqa: E402


def test_native_events_are_sniffed() -> None:
    of = event_time_of(None, 1_000_000)
    for stream, raw, _ in messy_traffic(1):
        assert of(stream == "impressions", raw) == (sniff_ts_ms(raw) or 0)


@pytest.mark.parametrize(("config", "shape"), [(CONFIG_A, shape_a), (CONFIG_B, shape_b)], ids=["nested", "items"])
def test_mapped_events_read_the_translated_time(config: str, shape: object) -> None:
    mapping = EventMapping.from_tables(tomllib.loads(config)["events"], where="test")
    translator = translator_for(mapping)
    assert translator is not None
    of = event_time_of(mapping, 1_000_000)
    checked = 0
    for seed in (1, 2):
        for stream, raw, _ in messy_traffic(seed):
            value = shape(stream, raw)  # type: ignore[operator]
            want = translator.event_ts_ms(stream, value)
            got = of(stream == "impressions", value)
            if want is not None:
                assert got == want, value
                checked += 1
            else:
                assert got >= 0
    assert checked > 500
