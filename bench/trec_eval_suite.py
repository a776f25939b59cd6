"""rankwatch offline against trec_eval's own expected outputs (its test suite) for P_k, recall_k, success_k.

    python bench/trec_eval_suite.py PATH/TO/trec_eval/test

The directory is trec_eval's ``test`` folder (``qrels.test``, ``qrels.rel_level``, ``results.test`` and the
expected outputs ``out.test.aq`` = ``trec_eval -a -q qrels.test results.test`` and ``out.test.aql`` = the
same with ``-l2`` on ``qrels.rel_level``). For each case the run is turned into an evaluation set (one row
per retrieved document, ``label`` from the qrels, 0 when unjudged), ranked as trec_eval ranks it (score
descending, ties by document id descending) and given as ``position``; every query is its own slice
(``--by segment``), so the per-slice values of ``rankwatch offline --format json`` are per-query values.
They must equal every per-query ``P_k``, ``recall_k`` and ``success_k`` line at the file's 4 decimals.

Two conventions differ (docs/metrics.md section 11) and are bridged here, not hidden:

* trec_eval's ``recall_k`` divides by every judged relevant document, also the never retrieved ones;
  rankwatch by the relevant items of the list. For recall the judged relevant documents that were not
  retrieved are appended after the largest k (non-relevant filler rows up to it), so they count in R only.
* a query without a relevant document is 0 in trec_eval and left out (null) by rankwatch's default; the
  check requires trec_eval's 0 there.
With ``-l2`` a grade counts as relevant when >= 2: the labels are binarised to that before rankwatch sees
them (rankwatch's relevance is ``rel > 0``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pandas as pd

MEASURES = ("P", "recall", "success")
CASES = (("out.test.aq", "qrels.test", 1), ("out.test.aql", "qrels.rel_level", 2))


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for line in path.read_text().splitlines():
        if line.strip():
            qid, _, doc, rel = line.split()[:4]
            out[qid][doc] = int(rel)
    return out


def read_run(path: Path) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        if line.strip():
            qid, _, doc, _, score = line.split()[:5]
            out[qid].append((doc, float(score)))
    return out


def expected_values(path: Path) -> dict[tuple[str, str], float]:
    """``{(measure, qid): value}`` for the P/recall/success lines of one trec_eval output (``all`` excluded)."""
    out = {}
    for line in path.read_text().splitlines():
        name, qid, value = line.split()
        if name.split("_")[0] in MEASURES and "_" in name and qid != "all":
            out[(name, qid)] = float(value)
    return out


def evaluation_rows(qrels: dict[str, dict[str, int]], run: dict[str, list[tuple[str, float]]], level: int,
                    *, append_after: int | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per retrieved document in trec_eval's order; with ``append_after``, non-relevant filler rows
    up to that rank, then the judged relevant documents never retrieved (never inside a top k <= it)."""
    rows = []
    for qid, docs in run.items():
        # trec_eval's order: score descending, then document id descending.
        ranked = sorted(docs, key=lambda d: (d[1], d[0]), reverse=True)
        judged = qrels.get(qid, {})
        seen = {doc for doc, _ in ranked}
        extra: list[tuple[str, float]] = []
        if append_after is not None:
            extra = [(f"filler-{i}", float("-inf")) for i in range(max(append_after - len(ranked), 0))]
            extra += [(d, float("-inf")) for d, r in sorted(judged.items()) if r >= level and d not in seen]
        for pos, (doc, score) in enumerate(ranked + extra, start=1):
            rel = 1 if judged.get(doc, 0) >= level else 0
            rows.append({"request_id": qid, "item_id": doc, "position": pos, "score": max(score, -1e300),
                         "label": rel, "segment": qid, "surface": "run"})  # fmt: skip
    return pd.DataFrame(rows)


def rankwatch_values(frame: pd.DataFrame, ks: dict[str, list[int]]) -> dict[tuple[str, str], float | None]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "eval.csv"
        frame.to_csv(path, index=False)
        cmd = [sys.executable, "-m", "rankwatch", "offline", str(path), "--by", "segment", "--max-label-values",
               "100000", "--format", "json", "--precision-k", ",".join(map(str, ks["P"])),
               "--recall-k", ",".join(map(str, ks["recall"])), "--hit-rate-k", ",".join(map(str, ks["success"]))]  # fmt: skip
        doc = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    names = {"P": "precision", "recall": "recall", "success": "hit_rate"}
    return {
        (f"{m}_{k}", s["segment"]): s[f"{names[m]}@{k}"] for s in doc["slices"] for m in MEASURES for k in ks[m]
    }


def check_case(folder: Path, output: str, qrels_name: str, level: int) -> tuple[int, list[str]]:
    expected = expected_values(folder / output)
    ks: dict[str, list[int]] = defaultdict(list)
    for name, _ in expected:
        measure, k = name.rsplit("_", 1)
        if int(k) not in ks[measure]:
            ks[measure].append(int(k))
    qrels, run = read_qrels(folder / qrels_name), read_run(folder / "results.test")
    plain = rankwatch_values(evaluation_rows(qrels, run, level), ks)
    full = rankwatch_values(evaluation_rows(qrels, run, level, append_after=max(ks["recall"])), ks)
    problems = []
    for (name, qid), want in sorted(expected.items()):
        got = (full if name.startswith("recall") else plain).get((name, qid))
        value = 0.0 if got is None else got  # null: no relevant item, which trec_eval scores 0
        if got is None and want != 0.0:
            problems.append(f"{output} {name} {qid}: rankwatch null, trec_eval {want}")
        elif abs(round(value, 4) - want) > 5e-5:
            problems.append(f"{output} {name} {qid}: rankwatch {value:.6f}, trec_eval {want:.4f}")
    return len(expected), problems


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    folder = Path(sys.argv[1])
    failed = False
    for output, qrels_name, level in CASES:
        if not (folder / output).is_file():
            print(f"{output}: missing, skipped")
            continue
        n, problems = check_case(folder, output, qrels_name, level)
        print(f"{output} ({qrels_name}, relevance level {level}): {n - len(problems)}/{n} per-query values agree")
        for p in problems:
            print("  " + p)
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
