"""``rankwatch ab --config`` on logs in a team's own schema (SPEC section 6) equals ``ab`` on the section 1 events.

The generator's traffic (duplicates, malformed lines, item-form events, orphan and late feedback) is written
in the nested-list shape of ``replay --config``'s test (seconds, 0-based ranks, coded segments and actions);
the variant, user and model keep their names at the root, so the config maps them by default. The config
has only ``[events.*]`` tables: the experiment comes from the options.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rankwatch.cli import main
from rankwatch.pipeline.traffic.generator import TrafficConfig, generate_with_truth
from tests.rankwatch.test_cli_replay_mapped import CONFIG_A, _expressible_a, shape_a

OPTS = ("--min-requests", "50", "--min-positives", "20", "--min-negatives", "20", "--format", "json")


def _ab(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["ab", *args, *OPTS]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_foreign_logs_equal_native_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = TrafficConfig(seed=4, duration_s=300, requests_per_second=12, duplicate_rate=0.05, malformed_rate=0.02,
                        out_of_order_ms=3000, item_form_share=0.1, orphan_rate=0.02, late_rate=0.02)
    events, _ = generate_with_truth(cfg)
    files: dict[str, Path] = {}
    for stream in ("impressions", "clicks"):
        raws = [e.value for e in events if e.stream == stream and _expressible_a(stream, e.value)]
        files[stream] = tmp_path / f"{stream}.jsonl"
        files[stream].write_bytes(b"".join(r + b"\n" for r in raws))
        files[f"a-{stream}"] = tmp_path / f"a-{stream}.jsonl"
        files[f"a-{stream}"].write_bytes(b"".join(shape_a(stream, r) + b"\n" for r in raws))
    config = tmp_path / "team.toml"
    config.write_text(CONFIG_A, encoding="utf-8")
    native = _ab(capsys, "--impressions", str(files["impressions"]), "--clicks", str(files["clicks"]))
    foreign = _ab(capsys, "--impressions", str(files["a-impressions"]), "--clicks", str(files["a-clicks"]),
                  "--config", str(config))
    assert len(native["comparisons"]) > 0
    assert foreign == native
    # without the mapping the foreign shape has no valid impression: the translate step did the work
    assert main(["ab", "--impressions", str(files["a-impressions"]), "--clicks", str(files["a-clicks"]), *OPTS]) != 0
    assert "no valid impressions" in capsys.readouterr().err
