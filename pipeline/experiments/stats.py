"""Statistics of A/B comparisons from sufficient statistics: pure functions, scipy for the distributions.

Every arm of a slice is reduced to an :class:`ArmEstimate`: a mean, the variance of one randomisation unit's
linearised contribution, and the number of units. Requests as the unit (``n, sum, sum of squares``) and users
as the unit (per-user sums ``Y_u`` and counts ``N_u``, the delta method) give the same shape, so one Welch,
one delta-method lift and one always-valid interval serve both.

Formulas (``t`` treatment, ``c`` control, ``V = var_unit / n`` the variance of an arm's mean):

- difference ``d = m_t - m_c``, ``se_d = sqrt(V_t + V_c)``; Welch-Satterthwaite degrees of freedom
  ``df = (V_t + V_c)^2 / (V_t^2 / (n_t - 1) + V_c^2 / (n_c - 1))``; interval ``d +- t_{1-a/2, df} se_d``,
  two-sided p-value from Student's t (``scipy.stats.ttest_ind(equal_var=False)``);
- lift ``L = m_t / m_c - 1``, delta method ``se_L^2 = V_t / m_c^2 + m_t^2 V_c / m_c^4``, interval
  ``L +- z_{1-a/2} se_L``;
- always-valid (normal-mixture confidence sequence, Robbins 1970; Howard et al. 2021; the one GrowthBook
  and Eppo use): with ``N`` units in both arms, ``eta = N rho^2`` and the tuning
  ``rho^2 = (-2 ln a + ln(1 - 2 ln a)) / N*`` that makes the boundary tightest at ``N = N*``,
  ``half = se * sqrt(2 (1 + 1/eta) ln(sqrt(1 + eta) / a))``; its always-valid p-value is
  ``min(1, sqrt(1 + eta) exp(-eta z^2 / (2 (1 + eta))))`` with ``z = d / se_d`` (the interval excludes 0
  exactly when that p-value is below ``a``). The same multiplier widens the lift's delta-method interval;
- sample ratio mismatch: Pearson's chi-square of the arm counts against the expected split
  (``scipy.stats.chisquare``), flagged at ``p < 0.001``;
- Benjamini-Hochberg step-up adjusted p-values over one family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

from rankwatch.pipeline.metrics.uncertainty import ratio_variance

__all__ = [
    "ArmEstimate",
    "Comparison",
    "SrmResult",
    "benjamini_hochberg",
    "compare_means",
    "compare_values",
    "mixture_multiplier",
    "mixture_p_value",
    "mixture_rho2",
    "srm_test",
]

SRM_THRESHOLD = 0.001


@dataclass(frozen=True)
class ArmEstimate:
    """One arm of one slice: ``mean``, per-unit variance ``var_unit`` (ddof = 1) and ``n`` units.

    ``var_unit / n`` is the variance of ``mean``. Build it with :meth:`from_moments` (the unit is one
    request: ``count, sum, sum of squares``) or :meth:`from_unit_sums` (the unit is a user holding several
    requests; the mean is a ratio of sums and its variance comes from the delta method).
    """

    mean: float
    var_unit: float
    n: int

    @property
    def var_mean(self) -> float:
        return self.var_unit / self.n

    @classmethod
    def from_moments(cls, n: int, total: float, total_sq: float) -> ArmEstimate | None:
        """``mean = total / n``, ``var = (total_sq - total^2 / n) / (n - 1)``; None below two units."""
        if n < 2:
            return None
        mean = total / n
        var = max(total_sq - total * mean, 0.0) / (n - 1)
        return cls(mean, var, n)

    @classmethod
    def from_unit_sums(
        cls, n: int, sum_y: float, sum_n: float, sum_yy: float, sum_nn: float, sum_yn: float
    ) -> ArmEstimate | None:
        """Ratio mean ``r = sum Y_u / sum N_u`` over ``n`` units, delta-method variance.

        The linearised contribution of unit ``u`` is ``(Y_u - r N_u) / mean(N)``; its sample variance is
        ``(s_YY - 2 r s_YN + r^2 s_NN) / mean(N)^2`` with the (co)variances taken over units (ddof = 1).
        With one request per unit (``N_u = 1``) this is the request-level variance. None below two units.
        """
        var_mean = ratio_variance(n, sum_y, sum_n, sum_yy, sum_nn, sum_yn)
        return None if var_mean is None else cls(sum_y / sum_n, var_mean * n, n)


@dataclass(frozen=True)
class Comparison:
    """Treatment against control: difference and lift with fixed and always-valid intervals."""

    diff: float
    diff_se: float
    diff_ci: tuple[float, float] | None
    diff_ci_sequential: tuple[float, float] | None
    lift: float | None
    lift_se: float | None
    lift_ci: tuple[float, float] | None
    lift_ci_sequential: tuple[float, float] | None
    p_value: float | None
    p_value_sequential: float | None
    df: float


def mixture_rho2(alpha: float, n_star: float) -> float:
    """Mixing variance per unit, ``(-2 ln a + ln(1 - 2 ln a)) / N*`` (tightest boundary at ``N*`` units)."""
    la = -2.0 * math.log(alpha)
    return (la + math.log(1.0 + la)) / n_star


def mixture_multiplier(n_units: float, alpha: float, n_star: float) -> float:
    """Half-width of the always-valid interval in standard errors: ``sqrt(2 (1 + 1/eta) ln(sqrt(1+eta)/a))``."""
    eta = n_units * mixture_rho2(alpha, n_star)
    return math.sqrt(2.0 * (1.0 + 1.0 / eta) * (0.5 * math.log1p(eta) - math.log(alpha)))


def mixture_p_value(z: float, n_units: float, alpha: float, n_star: float) -> float:
    """Always-valid p-value ``min(1, 1 / Lambda)``, ``Lambda = exp(eta z^2 / (2 (1 + eta))) / sqrt(1 + eta)``.

    ``alpha`` only enters through the tuning of ``rho``; the p-value is below ``alpha`` exactly when the
    interval of :func:`mixture_multiplier` excludes 0.
    """
    eta = n_units * mixture_rho2(alpha, n_star)
    log_lambda = eta * z * z / (2.0 * (1.0 + eta)) - 0.5 * math.log1p(eta)
    return 1.0 if log_lambda <= 0 else math.exp(-log_lambda)


def _interval(centre: float, half: float) -> tuple[float, float]:
    return (centre - half, centre + half)


def compare_means(t: ArmEstimate, c: ArmEstimate, *, alpha: float = 0.05, n_star: float = 50_000) -> Comparison:
    """Welch difference, delta-method lift, and their always-valid intervals (see the module docstring)."""
    vt, vc = t.var_mean, c.var_mean
    var = vt + vc
    se = math.sqrt(var)
    diff = t.mean - c.mean
    denom = (vt * vt / (t.n - 1) if vt else 0.0) + (vc * vc / (c.n - 1) if vc else 0.0)
    df = var * var / denom if denom > 0 else math.inf
    lift, lift_se = _lift(t.mean, vt, c.mean, vc)
    z = float(stats.norm.ppf(1.0 - alpha / 2.0))
    mult = mixture_multiplier(t.n + c.n, alpha, n_star)
    p: float | None
    p_seq: float | None
    diff_ci: tuple[float, float] | None
    diff_seq: tuple[float, float] | None
    if se > 0:
        tq = float(stats.t.ppf(1.0 - alpha / 2.0, df))
        p = float(2.0 * stats.t.sf(abs(diff) / se, df))
        p_seq = mixture_p_value(diff / se, t.n + c.n, alpha, n_star)
        diff_ci, diff_seq = _interval(diff, tq * se), _interval(diff, mult * se)
    else:  # no variance in either arm: no interval, no p-value
        p = p_seq = None
        diff_ci = diff_seq = None
    return Comparison(
        diff=diff, diff_se=se, diff_ci=diff_ci, diff_ci_sequential=diff_seq,
        lift=lift, lift_se=lift_se,
        lift_ci=None if lift is None or lift_se is None or se == 0 else _interval(lift, z * lift_se),
        lift_ci_sequential=None if lift is None or lift_se is None or se == 0 else _interval(lift, mult * lift_se),
        p_value=p, p_value_sequential=p_seq, df=df,
    )  # fmt: skip


def compare_values(
    value_t: float, se_t: float, value_c: float, se_c: float, *, n_units: float, alpha: float = 0.05,
    n_star: float = 50_000,
) -> Comparison:
    """Two independent estimates with their standard errors (AUC-ROC, AUC-PR): variances add, normal theory.

    ``n_units`` (both arms together) sets the always-valid interval's information time.
    """
    var_t, var_c = se_t * se_t, se_c * se_c
    se = math.sqrt(var_t + var_c)
    diff = value_t - value_c
    lift, lift_se = _lift(value_t, var_t, value_c, var_c)
    z = float(stats.norm.ppf(1.0 - alpha / 2.0))
    mult = mixture_multiplier(n_units, alpha, n_star)
    ok = se > 0
    return Comparison(
        diff=diff, diff_se=se,
        diff_ci=_interval(diff, z * se) if ok else None,
        diff_ci_sequential=_interval(diff, mult * se) if ok else None,
        lift=lift, lift_se=lift_se,
        lift_ci=_interval(lift, z * lift_se) if ok and lift is not None and lift_se is not None else None,
        lift_ci_sequential=_interval(lift, mult * lift_se) if ok and lift is not None and lift_se is not None else None,
        p_value=float(2.0 * stats.norm.sf(abs(diff) / se)) if ok else None,
        p_value_sequential=mixture_p_value(diff / se, n_units, alpha, n_star) if ok else None,
        df=math.inf,
    )  # fmt: skip


def _lift(m_t: float, v_t: float, m_c: float, v_c: float) -> tuple[float | None, float | None]:
    """``m_t / m_c - 1`` and its delta-method SE; None when the control mean is 0."""
    if m_c == 0:
        return None, None
    var = v_t / (m_c * m_c) + m_t * m_t * v_c / m_c**4
    return m_t / m_c - 1.0, math.sqrt(var)


@dataclass(frozen=True)
class SrmResult:
    """Sample-ratio-mismatch test: ``mismatch`` when ``p_value < threshold``."""

    p_value: float | None
    observed: dict[str, int]
    expected: dict[str, float]
    mismatch: bool

    def document(self) -> dict[str, object]:
        return {"p_value": self.p_value, "observed": dict(self.observed), "expected": dict(self.expected),
                "mismatch": self.mismatch}


def srm_test(
    observed: dict[str, int], shares: dict[str, float], *, threshold: float = SRM_THRESHOLD
) -> SrmResult:
    """Pearson chi-square of ``observed`` counts per arm against ``shares`` (normalised to sum 1).

    ``chi2 = sum (o - e)^2 / e`` with ``e = share * total``, ``k - 1`` degrees of freedom. No units at all:
    p-value None, no mismatch.
    """
    arms = list(shares)
    total_share = sum(shares.values())
    total = sum(observed.get(a, 0) for a in arms)
    expected = {a: total * shares[a] / total_share for a in arms}
    if total == 0 or len(arms) < 2:
        return SrmResult(None, {a: observed.get(a, 0) for a in arms}, expected, False)
    chi2 = sum((observed.get(a, 0) - expected[a]) ** 2 / expected[a] for a in arms)
    p = float(stats.chi2.sf(chi2, len(arms) - 1))
    return SrmResult(p, {a: observed.get(a, 0) for a in arms}, expected, p < threshold)


def benjamini_hochberg(p_values: Sequence[float | None]) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values: ``p_(i) m / i``, made monotone from the largest down, capped at 1.

    None entries (insufficient data) are not part of the family and stay None; ``m`` counts the others.
    """
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(present)
    out: list[float | None] = [None] * len(p_values)
    running = 1.0
    for rank in range(m, 0, -1):
        p, i = present[rank - 1]
        running = min(running, p * m / rank)
        out[i] = running
    return out
