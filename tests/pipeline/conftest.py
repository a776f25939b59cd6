"""The core's tests mirror its packages (``tests/pipeline/metrics`` tests ``pipeline/metrics``, ...).

Their shared helpers stay here, beside this file: ``naive_metrics`` (the deliberately slow, obvious
oracles), ``offline_data`` (random evaluation frames) and ``golden_traffic`` (the golden stream). This
directory goes on ``sys.path`` so a test in any sub-package imports them by name.
"""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
