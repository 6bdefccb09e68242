"""``sera-opt bench verl``: the step-time split read from a run's recorded metrics.

The whole runs themselves are tested in tests/integrations/test_verl_cpu.py; here the
arithmetic of the split and the options, on metrics written by hand.
"""

from __future__ import annotations

import pytest

from tests.markers import requires_verl

pytestmark = [pytest.mark.verl, requires_verl]


def _step(gen, old, adv, update, weights, step, plan=0.0, observe=0.0, estimator=0.0):
    return {"timing_s/gen": gen, "timing_s/old_log_prob": old, "timing_s/adv": adv,
            "timing_s/update_actor": update, "timing_s/update_weights": weights,
            "timing_s/step": step, "sera_timing_s/plan": plan,
            "sera_timing_s/observe": observe, "sera_timing_s/estimator": estimator}


def test_the_split_is_the_median_after_the_first_step_and_sera_opts_share():
    from sera_opt.benchmarks import verl

    steps = {
        1: _step(9.0, 9.0, 9.0, 9.0, 9.0, 90.0, plan=9.0),    # one-off costs: left out
        2: _step(2.0, 0.2, 0.01, 0.5, 0.1, 3.0, plan=0.01, observe=0.02, estimator=0.03),
        3: _step(2.2, 0.3, 0.01, 0.6, 0.1, 4.0, plan=0.02, observe=0.02, estimator=0.04),
        4: _step(2.4, 0.4, 0.03, 0.7, 0.3, 5.0, plan=0.03, observe=0.03, estimator=0.04),
    }
    split = verl.split(steps)
    assert split["gen"] == pytest.approx(2.2)
    assert split["old_log_prob"] == pytest.approx(0.3)
    assert split["update_weights"] == pytest.approx(0.1)
    assert split["step"] == pytest.approx(4.0)
    assert split["sera_opt"] == pytest.approx(0.08)  # median of 0.06, 0.08, 0.10
    assert split["sera_opt_share"] == pytest.approx(0.02)  # median of 0.02, 0.02, 0.02


def test_one_step_is_its_own_split():
    from sera_opt.benchmarks import verl

    split = verl.split({1: _step(1.0, 0.5, 0.1, 0.2, 0.1, 2.0, estimator=0.1)})
    assert split["step"] == 2.0 and split["sera_opt_share"] == pytest.approx(0.05)


def test_arms_and_steps_are_checked_before_any_run(capsys):
    from sera_opt.benchmarks import verl
    from sera_opt.exceptions import SeraOptError

    with pytest.raises(SeraOptError, match="--arms takes names among"):
        verl.main(["--arms", "grpo,ppo"])
    with pytest.raises(SeraOptError, match="--arms"):
        verl.main(["--arms", ","])
    with pytest.raises(SystemExit):
        verl.main(["--steps", "1"])
    assert "at least 2" in capsys.readouterr().err
