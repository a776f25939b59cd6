"""``rankwatch ab``'s paired model comparison and ledger writer (issue 21, SPEC section 7, docs/transfer.md).

Layout: :func:`paired_section` (the ``"paired"`` list of the A/B report when two models scored the same
evaluation requests); :func:`offline_differences` (``--offline`` files -> offline differences: evaluation
rows paired, or baseline files unpaired); :func:`write_ledger` (report + offline -> lines appended to
``--ledger``, ``recorded_at`` = now in UTC, read here in the application layer).

Why a module of its own: the command module stays about reading inputs and printing; the arithmetic lives in
``pipeline.transfer`` (pure), and this glue is the only place that reads the wall clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rankwatch.errors import ConfigError, RankwatchError
from rankwatch.pipeline.transfer.ledger import append_to_ledger
from rankwatch.pipeline.transfer.paired import PairedDifference, paired_differences
from rankwatch.pipeline.transfer.writer import (
    OfflineKey,
    baseline_differences,
    ledger_entries,
    ledger_level,
    offline_by_segment,
)

__all__ = ["offline_differences", "paired_section", "write_ledger"]


def paired_section(evalset: Any, spec: Any, options: Any, slice_spec: Any) -> list[dict[str, Any]]:
    """Per metric x treatment x slice with shared requests: candidate - control paired over them.

    Keys: ``metric, treatment, control, <slice labels>, paired (True), n_pairs, diff, stderr, diff_ci``
    (``diff +- z stderr``, z = 1.96 for ``alpha = 0.05``, from the experiment's ``alpha``).
    """
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - spec.alpha / 2.0))
    out: list[dict[str, Any]] = []
    for treatment in spec.treatments:
        paired = paired_differences(evalset, candidate=treatment, reference=spec.control, options=options,
                                    slice_spec=slice_spec, label=spec.label)  # fmt: skip
        for key in sorted(paired, key=lambda k: (len(k) > 0, k)):
            labels = dict(key)
            for metric, d in paired[key].items():
                ci = None if d.diff is None or d.stderr is None else [d.diff - z * d.stderr, d.diff + z * d.stderr]
                out.append({"metric": metric, "treatment": treatment, "control": spec.control,
                            **{b: labels.get(b, "all") for b in slice_spec.by}, "paired": True,
                            "n_pairs": d.n_pairs, "diff": d.diff, "stderr": d.stderr, "diff_ci": ci})  # fmt: skip
    return out


def _is_baseline(path: str) -> bool:
    if not path.lower().endswith(".json"):
        return False
    try:
        doc = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "result" in doc


def offline_differences(
    paths: Sequence[str], spec: Any, options: Any, level: str, *, skip_invalid: bool = False
) -> dict[OfflineKey, PairedDifference]:
    """Offline differences of every treatment against the control, at the ledger's level.

    ``paths``: evaluation rows holding both models (paired, the ``model`` column, or the experiment's arm
    label, names the arm), or baseline files (``rankwatch offline --output``) whose top-level ``model``
    (or ``variant``) names an arm (unpaired).
    """
    from rankwatch.pipeline.offline.baseline import parse_baseline
    from rankwatch.pipeline.offline.readers import InvalidEvaluationData, read_evaluation_files
    from rankwatch.pipeline.slicing import SliceSpec

    for path in paths:
        if not Path(path).is_file():
            raise RankwatchError(f"--offline {path}: no such file")
    baselines = [p for p in paths if _is_baseline(p)]
    if baselines and len(baselines) != len(paths):
        raise ConfigError("--offline takes evaluation rows or baseline files, not both")
    out: dict[OfflineKey, PairedDifference] = {}
    if baselines:
        by_arm: dict[str, Any] = {}
        for path in baselines:
            try:
                b = parse_baseline(json.loads(Path(path).read_bytes()), source=path)
            except ValueError as e:
                raise RankwatchError(str(e)) from None
            arm = b.model if spec.label == "model" else b.variant
            arm = arm or b.model or b.variant
            if arm is None:
                raise ConfigError(f"--offline {path}: the baseline names no model; compute it from rows of one model")
            by_arm[arm] = b.result
        if spec.control not in by_arm:
            raise ConfigError(f"--offline: no baseline of the control {spec.control!r} (found {', '.join(sorted(by_arm))})")
        for t in spec.treatments:
            if t in by_arm:
                out.update(baseline_differences(t, by_arm[t], by_arm[spec.control]))
        return out
    try:
        evalset = read_evaluation_files(list(paths), skip_invalid=skip_invalid, key_by_model=True)
    except InvalidEvaluationData as e:
        raise RankwatchError(f"--offline: {e}") from None
    slice_spec = SliceSpec(by=("segment",) if level == "segment" else ())
    for t in spec.treatments:
        paired = paired_differences(evalset, candidate=t, reference=spec.control, options=options,
                                    slice_spec=slice_spec, label="model")  # fmt: skip
        out.update(offline_by_segment(t, paired))
    return out


def write_ledger(
    ledger: str, offline_paths: Sequence[str], report: dict[str, Any], spec: Any, options: Any, by: Sequence[str],
    *, skip_invalid: bool = False,
) -> int:  # fmt: skip
    """Append the report's comparisons to ``ledger``; returns the number of lines written."""
    if not offline_paths:
        raise ConfigError("--ledger needs --offline BASELINE_OR_ROWS (the offline side of each comparison)")
    level = ledger_level(by)
    offline = offline_differences(offline_paths, spec, options, level, skip_invalid=skip_invalid)
    recorded_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    entries = ledger_entries(report, offline, level=level, recorded_at=recorded_at)
    try:
        return append_to_ledger(ledger, entries)
    except OSError as e:
        raise RankwatchError(f"--ledger {ledger}: cannot write: {e.strerror or e}") from None
