"""Write (or check) rankwatch's Grafana dashboards from the code in grafana/rankwatch_grafana/.

    python grafana/generate.py          # writes grafana/dashboards/*.json
    python grafana/generate.py --check  # exits 1 if the committed JSON differs from the generator's output

Run as a file, not as ``python -m``: the ``grafana`` folder is deliberately not a Python package.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DASHBOARD_DIR = HERE / "dashboards"


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from rankwatch_grafana import DASHBOARDS
    from rankwatch_grafana.common import to_json

    return {name: to_json(build()) for name, build in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files, write nothing"
    )
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = DASHBOARD_DIR / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            DASHBOARD_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
