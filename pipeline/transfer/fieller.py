"""The ratio of two independent, normally distributed differences with Fieller's interval.

Layout: :data:`Z95`; :class:`FiellerInterval`; :func:`fieller_interval` (scalar, the one the report uses).

For ``r = y / x`` with ``x ~ N(mu_x, sx^2)`` and ``y ~ N(mu_y, sy^2)`` independent, the Fieller set is every
``r`` with ``(y - r x)^2 <= z^2 (sy^2 + r^2 sx^2)``, i.e. ``a r^2 - 2 x y r + c <= 0`` with

    a = x^2 - z^2 sx^2,    c = y^2 - z^2 sy^2.

When ``a > 0`` (the offline interval ``x +- z sx`` excludes 0) the set is the bounded interval

    [(x y - sqrt(D)) / a, (x y + sqrt(D)) / a],    D = (x y)^2 - a c = z^2 (a sy^2 + y^2 sx^2) >= 0,

which contains ``y / x``. When ``a <= 0`` the set is unbounded (the whole line, or the complement of an
interval, or a half-line): there is no finite interval and the ratio itself is reported as undefined.
Why Fieller rather than the delta method: the ratio's denominator is a noisy offline difference that is
often near 0; the delta method's symmetric interval is then badly wrong, Fieller's is exact under normality.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Z95", "FiellerInterval", "fieller_interval"]

Z95 = 1.959963984540054  # the 97.5 % quantile of N(0, 1): two-sided 95 %


@dataclass(frozen=True)
class FiellerInterval:
    """``ratio = y / x`` and ``[lo, hi]`` when ``bounded``; all three ``None`` otherwise."""

    bounded: bool
    ratio: float | None
    lo: float | None
    hi: float | None


def fieller_interval(y: float, sy: float, x: float, sx: float, z: float = Z95) -> FiellerInterval:
    """Fieller interval of ``y / x`` (numerator ``y`` with SE ``sy``, denominator ``x`` with SE ``sx``).

    Bounded exactly when ``x^2 > z^2 sx^2``; so ``x == 0`` is never bounded.
    """
    a = x * x - z * z * sx * sx
    if not a > 0:
        return FiellerInterval(False, None, None, None)
    root = z * math.sqrt(a * sy * sy + y * y * sx * sx)
    xy = x * y
    lo, hi = (xy - root) / a, (xy + root) / a
    ratio = y / x
    # rounding must not leave the point estimate outside its own interval
    return FiellerInterval(True, ratio, min(lo, ratio), max(hi, ratio))
