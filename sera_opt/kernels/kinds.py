"""The kind numbers of the compiled objectives, and the constants the Python side shares.

numba-free: the objectives (:mod:`sera_opt.separable`) read these without loading
numba, and the kernels compile them in as constants. One list, used by both.
(SERA's own levels ``a_i (n - c)`` run on the waterline kernels,
:mod:`sera_opt.kernels.waterline`, and have no kind number.)
"""

from __future__ import annotations

BETA_LEVELS = 1  # max-min of -log E[(1 - p)^(n - c)], Beta      (sera-bayes)
KNAPSACK = 2  # max sum (1 - p^n - (1-p)^n) p (1-p)^2             (Knapsack RL)
HIT_UTILITY = 3  # max sum 1 - E[(1 - p)^n], Beta (log gains)      (HORA)
RLOO_VARIANCE = 4  # min sum a/(n - 1) + gamma log(p) n              (VIP)
INVERSE_COUNT = 5  # min sum W / n                                   (GVM)
POINT_HIT = 6  # max sum 1 - (1 - p)^n, point estimate (log gains)   (HORA, known p)
ALPHA_FAIR = 7  # max sum U_alpha(1 - (1 - p)^(n - c)) (log gains)    (sera-fair)
# The same objective at alpha = 0, 1, 2, where the crossing of a gain value is known in
# closed form (so a count pass evaluates no gain): x0 = a, x1 = log p (alpha = 0) or p.
FAIR_SUM = 8  # alpha = 0: sum of the factors
FAIR_LOG = 9  # alpha = 1: sum of log factors (proportional fairness)
FAIR_INVERSE = 10  # alpha = 2: minus the sum of inverse factors

#: The alpha-fair kinds with a closed-form crossing, by alpha.
FAIR_KIND_OF_ALPHA = {0.0: FAIR_SUM, 1.0: FAIR_LOG, 2.0: FAIR_INVERSE}

#: Beta levels with at most this many effective rollouts use the exact product.
PRODUCT_MAX = 64

#: The kinds that :func:`sera_opt.kernels.gains.closed_form` sends to the closed-form
#: engine, for callers that choose the entry kernel in Python (:func:`closed_entry`).
CLOSED_FORM_KINDS = frozenset({FAIR_SUM, FAIR_LOG, FAIR_INVERSE, POINT_HIT, KNAPSACK,
                               RLOO_VARIANCE, INVERSE_COUNT})

#: From this many rows on the closed-form engine opens its bracket from a strided
#: subsample (one row in sixteen); below, from the rows' extreme gains.
CLOSED_SUBSAMPLE_FROM = 512

#: From this many rows on a subsample is solved exactly by the general engine
#: (:func:`sera_opt.kernels.entries.solve`, and the closed-form engine's subsample);
#: below, the general engine opens from the rows' extremes and the closed-form engine
#: solves its subsample by its own search stopped early.
SUBSAMPLE_FROM = 32768


#: Up to this many spare rollouts (above the minimums) the closed-form kinds are solved
#: one rollout at a time (:func:`sera_opt.kernels.closed.stepwise_counts`, which
#: :func:`~sera_opt.kernels.closed.closed_solve` enters alone, so that a small first call
#: compiles only it): there it takes 0.2x to 1.4x the bracket search's time (tens of
#: microseconds either way).
STEPWISE_MAX_SPARE = 1024

#: Up to this many spare rollouts the one-at-a-time kernel also serves a larger spare
#: while the bracket search compiles in a background process (:mod:`sera_opt._background`):
#: the same counts, at about 0.1 us a rollout handed out (0.76 ms for 1,024 prompts with
#: 7,168 spare, `sera-opt bench default-path`). Beyond it, the search is compiled in the
#: calling process.
INTERIM_MAX_SPARE = 1 << 16


def closed_entry(num_rows: int) -> str:
    """The name of the entry kernel in :mod:`sera_opt.kernels.closed` for ``num_rows`` rows.

    Below ``SUBSAMPLE_FROM`` rows :func:`~sera_opt.kernels.closed.closed_solve`, which
    enters the one-at-a-time kernel or the bracket search by the spare rollouts (numba
    compiles a kernel together with everything it can call, so a first call compiles only
    the one it takes); from ``SUBSAMPLE_FROM`` rows on, the kernel
    whose subsample is solved exactly by the general engine, which no smaller problem
    compiles."""
    if num_rows < SUBSAMPLE_FROM:
        return "closed_solve"
    return "closed_counts_sampled_exact"


def search_entry(kind: int) -> str:
    """The kernel of :mod:`sera_opt.kernels.closed` that
    :func:`~sera_opt.kernels.closed.closed_solve` calls for this closed-form kind beyond
    ``STEPWISE_MAX_SPARE`` spare rollouts: ``collect_solve`` for Knapsack (whose gain
    costs two exponentials, evaluated once per step in the bracket and shared between
    equal rows), ``bracket_solve`` (the heap's finish) for the others."""
    return "collect_solve" if kind == KNAPSACK else "bracket_solve"
