"""Regenerate the example evaluation set: ``python examples/make_examples.py`` (fixed seed, deterministic).

Writes ``eval.csv``, ``eval.jsonl`` and ``eval.parquet`` next to this file: the same 400-odd rows (one per
shown item) of 40 requests over 3 segments x 2 surfaces, graded labels 0-3 loosely following the score.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
SEGMENTS = {"new_user": -0.4, "returning": 0.2, "power_user": 0.6}  # how well the ranker serves each
SURFACES = ("home_feed", "search")


def make(seed: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(40):
        segment = list(SEGMENTS)[r % 3]
        surface = SURFACES[(r // 3) % 2]
        n_items = int(rng.integers(6, 13))
        quality = rng.normal(size=n_items) + SEGMENTS[segment]
        score = np.round(1 / (1 + np.exp(-(quality + rng.normal(scale=0.8, size=n_items)))), 4)
        grade = np.clip(np.floor(quality), 0, 3).astype(int) * (rng.random(n_items) < 0.7)
        for pos, i in enumerate(np.argsort(-score, kind="stable"), start=1):
            rows.append({
                "request_id": f"req-{r:03d}", "item_id": f"item-{int(rng.integers(0, 500)):03d}",
                "position": pos, "score": float(score[i]), "label": int(grade[i]),
                "segment": segment, "surface": surface, "variant": "control", "model": "ranker-v12",
            })  # fmt: skip
    return pd.DataFrame(rows)


if __name__ == "__main__":
    frame = make()
    frame.to_csv(HERE / "eval.csv", index=False)
    frame.to_json(HERE / "eval.jsonl", orient="records", lines=True)
    frame.to_parquet(HERE / "eval.parquet", index=False)
    print(f"{len(frame)} rows, {frame['request_id'].nunique()} requests")
