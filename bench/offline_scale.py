"""Offline baselines at scale: rows/s and peak memory of ``rankwatch offline`` on generated rows.

    python bench/offline_scale.py --rows 30000000 [--shuffled] [--memory-limit 1G] [--engine local|spark]
                                  [--check] [--pytrec] [--dir /tmp/rankwatch-scale] [--keep]

The evaluation set is a pure function of the global row number ``g`` (so a grouped and a shuffled file
hold exactly the same rows, and a checker can recompute any row without reading the file): request
``g // 20``, item ``g % 20``, a score with at most 100,000 distinct values overall but distinct within a
request (so the rank order does not depend on the row order), a graded label 0-2 that rises with the score,
7 segments x 3 surfaces. The shuffled file puts global row ``(j * m) mod N`` at line ``j`` (``m`` coprime with ``N``, near 0.618 N):
the 20 rows of a request are spread over the whole file. Files are Parquet, written in 1 M-row groups into
``--dir`` (under /tmp; deleted at the end unless ``--keep``).

The command runs as a child process under ``/usr/bin/time -v``; the figures are its wall time, rows/s, the
maximum resident set of the largest process (``Maximum resident set size``) and, sampled from /proc every
0.2 s, the peak total resident set of its process tree (the Spark JVM and Python workers included).

``--check`` recomputes MRR, NDCG@5, NDCG@10, MAP@10 (overall and per segment) with plain numpy over the
rows' 2-D layout, and AUC-ROC / AUC-PR from the score counts (Mann-Whitney with ties counted half;
average precision with tied scores as one threshold, as scikit-learn does, which also checks that formula on
the first 1 M rows); it compares the command's result to 1e-9. ``--pytrec`` runs pytrec_eval on the same
rows in a child process (building its dicts from the Parquet file) for its time and memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
ITEMS = 20
CHUNK = 1_000_000
N_BUCKETS = 5_000  # score = (bucket * ITEMS + item) / (N_BUCKETS * ITEMS): <= 100,000 distinct values


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a fast, good 64-bit mix of the row number (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def rows_of(g: np.ndarray) -> dict[str, np.ndarray]:
    """Columns of global rows ``g`` (uint64) as numpy arrays."""
    req = g // np.uint64(ITEMS)
    item = (g % np.uint64(ITEMS)).astype(np.int64)
    u1 = (_splitmix(g) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    u2 = (_splitmix(g ^ np.uint64(0x5DEECE66D)) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    bucket = np.floor(u1 * N_BUCKETS).astype(np.int64)
    score = (bucket * ITEMS + item) / float(N_BUCKETS * ITEMS)
    p = 0.02 + 0.25 * u1
    label = (u2 < p).astype(np.int64) + (u2 < p / 3).astype(np.int64)
    return {"req": req.astype(np.int64), "item": item, "score": score, "label": label,
            "segment": (req % np.uint64(7)).astype(np.int64), "surface": ((req // np.uint64(7)) % np.uint64(3)).astype(np.int64)}  # fmt: skip


def multiplier(n: int) -> int:
    """A step coprime with ``n`` near ``0.618 n``: consecutive lines land far apart (a full permutation)."""
    m = int(n * 0.6180339887) | 1
    while np.gcd(m, n) != 1:
        m += 2
    return m


def global_rows(j: np.ndarray, n: int, shuffled: bool) -> np.ndarray:
    if not shuffled:
        return j.astype(np.uint64)
    return (j.astype(np.uint64) * np.uint64(multiplier(n))) % np.uint64(n)  # j, m < n < 2**32: no overflow


def write_file(path: Path, n: int, shuffled: bool) -> None:
    segments = pa.array([f"segment-{i}" for i in range(7)])
    surfaces = pa.array([f"surface-{i}" for i in range(3)])
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, _schema()) as writer:
        for start in range(0, n, CHUNK):
            j = np.arange(start, min(n, start + CHUNK), dtype=np.int64)
            c = rows_of(global_rows(j, n, shuffled))
            table = pa.table({
                "request_id": pa.array(c["req"]).cast(pa.string()),
                "item_id": pa.array(c["item"]).cast(pa.string()),
                "score": c["score"], "label": c["label"],
                "segment": segments.take(pa.array(c["segment"])), "surface": surfaces.take(pa.array(c["surface"])),
            }, schema=_schema())  # fmt: skip
            writer.write_table(table)
    tmp.rename(path)


def _schema() -> pa.Schema:
    return pa.schema([("request_id", pa.string()), ("item_id", pa.string()), ("score", pa.float64()),
                      ("label", pa.int64()), ("segment", pa.string()), ("surface", pa.string())])  # fmt: skip


# -- measuring a child process -----------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Total resident bytes of ``pid`` and its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def measure(cmd: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    full = ["/usr/bin/time", "-v", *cmd]
    start = time.perf_counter()
    proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err[-3000:]}")
    max_rss = next(int(line.split(":")[1]) * 1024 for line in err.splitlines() if "Maximum resident set size" in line)
    return {"wall_s": wall, "max_rss": max_rss, "tree_peak": peak[0], "stdout": out}


# -- independent check ----------------------------------------------------------------------------------
def oracle(n: int) -> dict[str, Any]:
    """Overall and per-segment MRR/NDCG/MAP plus pooled AUC-ROC/AUC-PR, recomputed from the row function."""
    n_req = n // ITEMS
    sums = np.zeros((7, 4))
    counts = np.zeros(7)
    pos = np.zeros(N_BUCKETS * ITEMS, dtype=np.int64)
    neg = np.zeros(N_BUCKETS * ITEMS, dtype=np.int64)
    disc = 1.0 / np.log2(np.arange(2, ITEMS + 2))
    step = CHUNK // ITEMS
    for r0 in range(0, n_req, step):
        r1 = min(n_req, r0 + step)
        c = rows_of(np.arange(r0 * ITEMS, r1 * ITEMS, dtype=np.uint64))
        score, label = c["score"].reshape(-1, ITEMS), c["label"].reshape(-1, ITEMS).astype(np.float64)
        order = np.argsort(-score, axis=1)
        lab = np.take_along_axis(label, order, axis=1)
        rel = lab > 0
        has = rel.any(axis=1)
        rr = np.where(has, 1.0 / (np.argmax(rel, axis=1) + 1), 0.0)
        gain = np.exp2(lab) - 1
        ideal = np.sort(gain, axis=1)[:, ::-1]
        ndcg = [(gain[:, :k] * disc[:k]).sum(1) / np.where(has, (ideal[:, :k] * disc[:k]).sum(1), 1) for k in (5, 10)]
        hits = np.cumsum(rel, axis=1)
        prec = hits / np.arange(1, ITEMS + 1)
        ap10 = (prec[:, :10] * rel[:, :10]).sum(1) / np.maximum(rel.sum(1), 1)
        seg = c["segment"].reshape(-1, ITEMS)[:, 0]
        vals = np.stack([rr, ndcg[0], ndcg[1], ap10], axis=1)
        for s in range(7):
            m = has & (seg == s)
            sums[s] += vals[m].sum(0)
            counts[s] += m.sum()
        code = np.rint(c["score"] * N_BUCKETS * ITEMS).astype(np.int64)
        pos += np.bincount(code, weights=c["label"] > 0, minlength=pos.size).astype(np.int64)
        neg += np.bincount(code, weights=c["label"] == 0, minlength=neg.size).astype(np.int64)
        if r0 == 0:
            _check_auc_formula(c["score"], c["label"] > 0)
    names = ("mrr", "ndcg@5", "ndcg@10", "map@10")
    overall = dict(zip(names, sums.sum(0) / counts.sum(), strict=True))
    per_segment = {f"segment-{s}": dict(zip(names, sums[s] / counts[s], strict=True)) for s in range(7)}
    overall["auc_roc"], overall["auc_pr"] = _auc_from_counts(pos, neg)
    return {"overall": overall, "segments": per_segment}


def _auc_from_counts(pos: np.ndarray, neg: np.ndarray) -> tuple[float, float]:
    neg_below = np.cumsum(neg) - neg
    auc = float((pos * (neg_below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))
    tp, fp = np.cumsum(pos[::-1]), np.cumsum(neg[::-1])
    p = pos[::-1]
    ap = float((p[p > 0] * tp[p > 0] / (tp[p > 0] + fp[p > 0])).sum() / pos.sum())
    return auc, ap


def _check_auc_formula(score: np.ndarray, relevant: np.ndarray) -> None:
    from sklearn.metrics import average_precision_score, roc_auc_score

    code = np.rint(score * N_BUCKETS * ITEMS).astype(np.int64)
    ours = _auc_from_counts(np.bincount(code[relevant], minlength=N_BUCKETS * ITEMS),
                            np.bincount(code[~relevant], minlength=N_BUCKETS * ITEMS))  # fmt: skip
    ref = (roc_auc_score(relevant, score), average_precision_score(relevant, score))
    assert np.allclose(ours, ref, rtol=1e-9, atol=1e-12), (ours, ref)


def compare(doc: dict[str, Any], expected: dict[str, Any]) -> float:
    worst = 0.0
    for name, value in expected["overall"].items():
        worst = max(worst, abs(doc["overall"][name] - value))
    by_segment: dict[str, dict[str, float]] = {}
    for s in doc["slices"]:  # merge surfaces: weighted by the requests with a relevant item
        acc = by_segment.setdefault(s["segment"], {"n": 0.0, **{k: 0.0 for k in expected["overall"] if "auc" not in k}})
        acc["n"] += s["requests_with_relevant"]
        for k in acc:
            if k != "n":
                acc[k] += s[k] * s["requests_with_relevant"]
    for seg, values in expected["segments"].items():
        for name, value in values.items():
            worst = max(worst, abs(by_segment[seg][name] / by_segment[seg]["n"] - value))
    if worst > 1e-9:
        raise SystemExit(f"MISMATCH: largest difference {worst:.3g}")
    return worst


def _largest_difference(a: Any, b: Any) -> float:
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return float("inf")
        return max((_largest_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list):
        if len(a) != len(b):
            return float("inf")
        return max((_largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) / max(1.0, abs(b))
    return 0.0 if a == b else float("inf")


PYTREC_CHILD = """
import sys, time, pyarrow.parquet as pq, pytrec_eval
t = time.perf_counter()
qrels, run = {}, {}
pf = pq.ParquetFile(sys.argv[1])
for rb in pf.iter_batches(batch_size=1_000_000):
    d = rb.to_pydict()
    for q, i, s, l in zip(d["request_id"], d["item_id"], d["score"], d["label"]):
        qrels.setdefault(q, {})[i] = int(l)
        run.setdefault(q, {})[i] = float(s)
ev = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank", "ndcg_cut_5", "ndcg_cut_10", "map_cut_10"})
res = ev.evaluate(run)
mrr = sum(v["recip_rank"] for q, v in res.items() if any(qrels[q].values())) / sum(1 for q in qrels if any(qrels[q].values()))
print(mrr, time.perf_counter() - t)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--shuffled", action="store_true")
    parser.add_argument("--memory-limit", default=None)
    parser.add_argument("--engine", choices=["local", "spark"], default="local")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--pytrec", action="store_true")
    parser.add_argument("--dir", default="/tmp/rankwatch-scale")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--save", default=None, help="write the result document here (to compare two runs)")
    parser.add_argument("--compare", default=None, help="a saved result document that must be equal (1e-12)")
    args = parser.parse_args()
    n = args.rows // ITEMS * ITEMS
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{'shuffled' if args.shuffled else 'grouped'}-{n}.parquet"
    if not path.exists():
        t = time.perf_counter()
        write_file(path, n, args.shuffled)
        print(f"generated {path} ({path.stat().st_size / 1e6:,.0f} MB) in {time.perf_counter() - t:.0f} s")
    try:
        cmd = [sys.executable, "-m", "rankwatch", "offline", str(path), "--format", "json", "--by", "segment,surface",
               "--no-progress", "--spill-dir", str(folder)]  # fmt: skip
        if args.memory_limit:
            cmd += ["--memory-limit", args.memory_limit]
        if args.engine == "spark":
            cmd += ["--engine", "spark"]
        m = measure(cmd)
        doc = json.loads(m["stdout"])
        label = f"{n:,} rows {'shuffled' if args.shuffled else 'grouped'}, engine {args.engine}, " \
                f"budget {args.memory_limit or 'default'}"  # fmt: skip
        print(f"{label}: {m['wall_s']:.1f} s, {n / m['wall_s']:,.0f} rows/s, max RSS {m['max_rss'] / 2**20:,.0f} MiB, "
              f"process tree peak {m['tree_peak'] / 2**20:,.0f} MiB; requests {doc['overall']['requests']:,}")  # fmt: skip
        if args.save:
            Path(args.save).write_text(json.dumps(doc))
        if args.compare:
            worst = _largest_difference(doc, json.loads(Path(args.compare).read_text()))
            print(f"compared with {args.compare}: largest difference {worst:.2g}")
            if worst > 1e-12:
                raise SystemExit("MISMATCH with the saved result")
        if args.check:
            worst = compare(doc, oracle(n))
            print(f"check: equal to the independent computation (largest difference {worst:.2g})")
        if args.pytrec:
            p = measure([sys.executable, "-c", PYTREC_CHILD, str(path)])
            mrr, _ = map(float, p["stdout"].split())
            print(f"pytrec_eval: {p['wall_s']:.1f} s, {n / p['wall_s']:,.0f} rows/s, max RSS "
                  f"{p['max_rss'] / 2**20:,.0f} MiB; MRR diff {abs(mrr - doc['overall']['mrr']):.2g}")  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
