"""Rounds as a first-class part of the library: one public seam between the planner,
the policies and the session; everything checked before the first round; a session
that is a value (pickled, copied, resumed, observed once); only rounds that sample;
names that say what they are; and the edges of the rounds' public functions."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap
import threading
import tracemalloc
import warnings

import numpy as np
import pytest

import sera_opt
from sera_opt.rounds import (
    ROUND_MODES,
    RoundSession,
    fixed_rule,
    round_budgets,
    rule_scale,
    run_rounds,
)


def draw(p, seed=0):
    """A sampler of binary rewards for ``run_rounds``: round ``r`` draws from its own
    stream, so that a step resumed part-way draws what it would have drawn."""
    p = np.asarray(p, dtype=np.float64)
    state = {"round": 0}

    def sample(counts):
        rng = np.random.default_rng([seed, state["round"]])
        state["round"] += 1
        return rng.random(int(counts.sum())) < np.repeat(p, counts)

    return sample


# ---------------------------------------------------------------- one public seam
def test_taking_part_in_rounds_is_declared_by_every_policy():
    for name in sera_opt.available_policies():
        mode = sera_opt.get_policy(name).round_mode
        assert mode in ROUND_MODES, name
        want = "scale" if name in ("sera", "sera-paper", "sera-fair", "sera-bayes") else "totals"
        assert mode == want, name
    # Declared, not inferred from offset_sensitive: a policy whose counts depend on the
    # offset but that declares "totals" allocates its rounds on the prompts' totals.
    class Declared(sera_opt.get_policy("sera-fair").__class__):
        name = "declared-totals-for-this-test"
        round_mode = "totals"

    p = np.array([0.05, 0.1, 0.6, 0.9])
    counts = {}
    for policy in (sera_opt.get_policy("sera-fair", max_rollouts=20), Declared(max_rollouts=20)):
        session = policy.start_rounds(p, 32, rounds=2, first_round=2)
        session.record(np.zeros(int(session.next_round().sum())))
        counts[policy.round_mode] = session.next_round()
    assert counts["scale"].sum() == counts["totals"].sum() == 24
    assert not np.array_equal(counts["scale"], counts["totals"])


def test_the_planner_starts_a_session_through_the_policys_public_start_rounds():
    calls = []

    class Watched(sera_opt.get_policy("uniform").__class__):
        name = "watched-uniform-for-this-test"

        def start_rounds(self, success_probs, budget, **options):
            calls.append(sorted(options))
            return super().start_rounds(success_probs, budget, **options)

    planner = sera_opt.RolloutPlanner(Watched(offset=1, max_rollouts=12))
    session = planner.start_rounds(range(4), 24, rounds=3)
    assert isinstance(session, RoundSession) and len(calls) == 1
    assert {"prior", "observer", "prompt_ids", "first_round"} <= set(calls[0])
    run_rounds(session, draw([0.2, 0.4, 0.6, 0.8]))
    assert planner.tracker.step == 1


def test_objectives_give_the_gains_of_some_rows_publicly():
    from sera_opt.problem import AllocationProblem

    p = np.linspace(0.05, 0.95, 12)
    problem = AllocationProblem(p, 96, min_rollouts=2, max_rollouts=20, offset=1)
    rows = np.array([1, 4, 5, 11])
    counts = np.arange(2, 14)
    for name in ("sera", "sera-fair", "uniform", "gvm"):
        objective = sera_opt.get_policy(name, offset=1).round_objective(problem)
        assert isinstance(objective.gains_by_row, bool)
        np.testing.assert_array_equal(objective.row_gains(rows, counts),
                                      objective.gains(counts)[rows])


# ---------------------------------------------------------------- checked before round 1
def _error(call):
    with pytest.raises(sera_opt.SeraOptError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("norms", [np.ones(3), np.ones(5), np.array([1.0, -1.0, 1.0, 1.0])])
def test_extra_inputs_are_checked_when_the_session_starts_as_allocate_checks_them(norms):
    policy = sera_opt.get_policy("gvm")
    p = np.full(4, 0.3)
    want = _error(lambda: policy.allocate(p, 24, gradient_norms=norms))
    assert _error(lambda: policy.start_rounds(p, 24, gradient_norms=norms)) == want
    planner = sera_opt.RolloutPlanner("gvm")
    assert _error(lambda: planner.start_rounds(range(4), 24, gradient_norms=norms)) == want


def test_a_posterior_that_disagrees_with_the_probabilities_is_refused_at_the_start():
    policy = sera_opt.get_policy("sera-bayes")
    p = np.array([0.5, 0.5, 0.5])
    posterior = (np.array([1.0, 1.0, 1.0]), np.array([1.0, 3.0, 1.0]))
    want = _error(lambda: policy.allocate(p, 12, posterior=posterior))
    assert "posterior means" in want
    assert _error(lambda: policy.start_rounds(p, 12, posterior=posterior)) == want


@pytest.mark.parametrize("budget", [3, 10**6])
def test_bounds_and_budget_are_checked_when_the_session_starts(budget):
    policy = sera_opt.get_policy("uniform", max_rollouts=8)
    p = np.full(4, 0.3)
    want = _error(lambda: policy.allocate(p, budget))
    assert _error(lambda: policy.start_rounds(p, budget)) == want


# ---------------------------------------------------------------- a session is a value
def _planner_and_ids():
    planner = sera_opt.RolloutPlanner(max_rollouts=16)
    ids = [f"q{i}" for i in range(6)]
    planner.observe(np.repeat(ids, 2), np.tile([0.0, 1.0], 6))
    return planner, ids


P6 = [0.05, 0.2, 0.4, 0.5, 0.7, 0.9]


@pytest.mark.parametrize("name", sera_opt.available_policies())
def test_every_policys_session_pickles_and_copies_mid_step(name):
    m = 6
    inputs = {"gradient_norms": np.linspace(0.5, 2.0, m)} if name == "gvm" else {}
    policy = sera_opt.get_policy(name, offset=1, max_rollouts=16)
    session = policy.start_rounds(P6, 48, rounds=3, **inputs)
    sample = draw(P6, seed=5)
    session.record(sample(session.next_round()))
    for clone in (pickle.loads(pickle.dumps(session)), copy.deepcopy(session),
                  copy.copy(session)):
        out = run_rounds(clone, _resumed(P6, 5, 1))
        assert clone.session_id == session.session_id
        np.testing.assert_array_equal(out.counts.sum(), 48)
    assert session.round == 1  # the copies' rounds did not touch it
    ref = run_rounds(session, _resumed(P6, 5, 1))
    np.testing.assert_array_equal(out.counts, ref.counts)
    np.testing.assert_array_equal(out.round_index, ref.round_index)
    np.testing.assert_array_equal(out.factors, ref.factors)


def _resumed(p, seed, start):
    """``draw(p, seed)`` from its round ``start`` on."""
    sample = draw(p, seed)
    for r in range(start):
        sample(np.zeros(len(p), dtype=np.int64))
    return sample


def test_a_copy_does_not_feed_the_tracker_and_one_session_is_observed_once():
    planner, ids = _planner_and_ids()
    session = planner.start_rounds(ids, 48, rounds=3)
    assert planner.open_rounds == (session.session_id,)
    twin = copy.deepcopy(session)
    step = planner.tracker.step
    run_rounds(twin, draw(P6))
    assert planner.tracker.step == step  # a copy is detached: it reports to no one
    run_rounds(session, draw(P6))
    assert planner.tracker.step == step + 1 and planner.open_rounds == ()
    with pytest.raises(sera_opt.SeraOptError, match="observed already"):
        planner.observe_rounds(twin)  # the same id: it cannot count twice
    # The other order: the copy delivered first, then the original is refused when it ends.
    session = planner.start_rounds(ids, 48, rounds=3)
    twin = pickle.loads(pickle.dumps(session))
    run_rounds(twin, draw(P6))
    planner.observe_rounds(twin)
    with pytest.raises(sera_opt.SeraOptError, match="observed already"):
        run_rounds(session, draw(P6))
    # A session the planner does not owe: observe=False, or unfinished.
    quiet = planner.start_rounds(ids, 48, rounds=3, observe=False)
    with pytest.raises(sera_opt.SeraOptError, match="rounds left"):
        planner.observe_rounds(quiet)
    run_rounds(quiet, draw(P6))
    with pytest.raises(sera_opt.SeraOptError, match="observe=False"):
        planner.observe_rounds(quiet)


def test_a_planner_state_saved_with_a_session_open_carries_what_it_owes():
    planner, ids = _planner_and_ids()
    session = planner.start_rounds(ids, 48, rounds=3)
    session.record(draw(P6)(session.next_round()))
    state = planner.state_dict()
    assert state["open_rounds"] == [session.session_id]
    restored = sera_opt.RolloutPlanner().load_state_dict(pickle.loads(pickle.dumps(state)),
                                                         replace_config=True)
    assert restored.open_rounds == (session.session_id,)
    again = pickle.loads(pickle.dumps(session))
    run_rounds(again, _resumed(P6, 0, 1))
    restored.observe_rounds(again)
    with pytest.raises(sera_opt.SeraOptError, match="observed already"):
        restored.observe_rounds(again)
    # A planner whose state does not carry the session refuses it.
    with pytest.raises(sera_opt.SeraOptError, match="not owed"):
        sera_opt.RolloutPlanner().observe_rounds(again)
    with pytest.raises(sera_opt.SeraOptError, match="open_rounds"):
        sera_opt.RolloutPlanner().load_state_dict({**state, "open_rounds": [1]})


_CHILD = textwrap.dedent("""
    import pickle, sys
    import numpy as np
    import sera_opt
    from sera_opt.rounds import run_rounds

    state, session, p, start = pickle.loads(sys.stdin.buffer.read())

    def sample(counts, _round=[start]):
        rng = np.random.default_rng([9, _round[0]])
        _round[0] += 1
        return rng.random(int(counts.sum())) < np.repeat(p, counts)

    planner = sera_opt.RolloutPlanner().load_state_dict(state, replace_config=True)
    out = run_rounds(session, sample)
    planner.observe_rounds(session)
    sys.stdout.buffer.write(pickle.dumps((out, planner.tracker.state_dict())))
""")


def _tracker_states_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            _tracker_states_equal(a[key], b[key])
        elif isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3])
def test_a_step_resumed_in_a_fresh_process_equals_the_step_run_through(stop_after):
    def through():
        planner, ids = _planner_and_ids()
        session = planner.start_rounds(ids, 48, rounds=4)
        return planner, ids, session

    planner, ids, session = through()
    want = run_rounds(session, draw(P6, seed=9))
    want_tracker = planner.tracker.state_dict()

    planner, ids, session = through()
    sample = draw(P6, seed=9)
    for _ in range(stop_after):
        session.record(sample(session.next_round()))
    blob = pickle.dumps((planner.state_dict(), session, np.asarray(P6), stop_after))
    child = subprocess.run([sys.executable, "-c", _CHILD], input=blob, capture_output=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr.decode()
    got, got_tracker = pickle.loads(child.stdout)
    assert got.rounds == want.rounds == 4
    for key in ("counts", "prompt_index", "round_index", "rewards", "round_counts", "factors",
                "unsolved_fraction", "active_fraction"):
        np.testing.assert_array_equal(getattr(got, key), getattr(want, key), err_msg=key)
    _tracker_states_equal(got_tracker, want_tracker)


# ---------------------------------------------------------------- only rounds that sample
def test_iterating_yields_only_rounds_that_sample_and_done_means_spent():
    policy = sera_opt.get_policy("uniform", offset=1)
    # budget = M x min: the first round is the whole step, with the default rounds quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = policy.start_rounds(np.full(3, 0.5), 6)
    seen = []
    for counts in session:
        seen.append(counts)
        session.record(np.zeros(int(counts.sum())))
    assert [c.tolist() for c in seen] == [[2, 2, 2]] and session.done and session.spent == 6
    assert session.result().round_budgets == (6,)
    # Rounds asked for that the budget cannot fill are dropped, with a warning.
    with pytest.warns(sera_opt.SeraOptWarning, match="rounds=100000 asks for more rounds"):
        session = policy.start_rounds(np.full(4, 0.5), 24, rounds=100_000)
    out = run_rounds(session, lambda counts: np.zeros(int(counts.sum())))
    assert out.rounds == len(session.round_budgets) == 1 + 24 - 12
    assert (out.round_counts.sum(1) > 0).all() and out.counts.sum() == 24
    # done follows the budget: not done with a round handed out and not recorded.
    session = policy.start_rounds(np.full(4, 0.5), 24, rounds=2)
    counts = session.next_round()
    assert not session.done and session.spent == 0
    session.record(np.ones(int(counts.sum())))
    assert session.spent == 12 and not session.done


def test_a_billion_rounds_cost_no_memory_per_round():
    policy = sera_opt.get_policy("uniform", offset=1)
    policy.start_rounds(np.full(4, 0.5), 24, rounds=2)  # the imports it makes, made before
    tracemalloc.start()
    try:
        with pytest.warns(sera_opt.SeraOptWarning):
            session = policy.start_rounds(np.full(4, 0.5), 24, rounds=10**9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One entry per requested round would be gigabytes; the rounds that sample are 13.
    assert peak < 16 << 20 and session.round_budgets == (12,) + (1,) * 12
    assert round_budgets(24, 12, 10**9) == [12] + [1] * 12


def test_round_budgets_refuses_what_is_not_a_number_of_rounds():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(sera_opt.SeraOptError, match="rounds"):
            round_budgets(20, 6, bad)
    assert round_budgets(20, 6, 3, [14, 0]) == [6, 14]  # a later round of 0 draws nothing


def test_run_rounds_is_the_loop_and_says_what_it_takes():
    policy = sera_opt.get_policy("sera-fair", offset=1, max_rollouts=12)
    by_hand = policy.start_rounds(P6, 40, rounds=3)
    sample = draw(P6, seed=2)
    while not by_hand.done:
        by_hand.record(sample(by_hand.next_round()))
    out = run_rounds(policy.start_rounds(P6, 40, rounds=3), draw(P6, seed=2))
    np.testing.assert_array_equal(out.counts, by_hand.result().counts)
    np.testing.assert_array_equal(out.factors, by_hand.result().factors)
    with pytest.raises(sera_opt.SeraOptError, match="sample"):
        run_rounds(policy.start_rounds(P6, 40), [0, 1])
    ada = sera_opt.rounds.ReinforceAda(per_round=2)
    result = run_rounds(ada.start_rounds(num_prompts=3), lambda c: np.ones(int(c.sum())))
    assert result.rounds >= 1 and (result.round_counts.sum(1) > 0).all()


# ---------------------------------------------------------------- names and state
def test_one_name_per_concept():
    policy = sera_opt.get_policy("uniform", offset=1)
    session = policy.start_rounds(P6, 48, rounds=3, first_round=3, later_budgets=[20, 10])
    assert session.round_budgets == (18, 20, 10)
    for old in ({"first": 3}, {"round_budgets": [20, 10]}):
        with pytest.raises(sera_opt.SeraOptError, match="does not take"):
            policy.start_rounds(P6, 48, rounds=3, **old)
    out = run_rounds(session, draw(P6))
    # prompt_index: a property on the session as on the result.
    np.testing.assert_array_equal(session.prompt_index, out.prompt_index)
    assert out.session_id == session.session_id


def test_unsolved_and_active_fractions_say_what_they_count():
    # Prompt 0 fails until its cap; prompt 1 succeeds; prompt 2 fails but has room.
    policy = sera_opt.get_policy("uniform", max_rollouts=np.array([2, 8, 8]))
    session = policy.start_rounds([0.5, 0.5, 0.5], 12, rounds=2, first_round=2)
    assert session.next_round().tolist() == [2, 2, 2]
    session.record([0, 0, 1, 0, 0, 0])
    session.record(np.zeros(int(session.next_round().sum())))
    out = session.result()
    np.testing.assert_allclose(out.unsolved_fraction, [2 / 3, 2 / 3])
    # Prompt 2 reaches its cap of 8 in round 2: no longer active, still unsolved.
    np.testing.assert_allclose(out.active_fraction, [1 / 3, 0.0])


def test_a_planners_configuration_shows_its_round_policy_and_equal_ones_plan_alike():
    default = sera_opt.RolloutPlanner(max_rollouts=32)
    named = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2,
                                    max_rollouts=32)
    assert default.config() != named.config() and repr(default) != repr(named)
    assert "round_policy=UniformPolicy" in repr(default)
    assert "round_policy=SERAFairPolicy" in repr(named)
    mixed = sera_opt.RolloutPlanner("sera-fair", alpha=1.0, offset=1, min_rollouts=2,
                                    max_rollouts=32, round_policy="uniform")
    assert mixed.policy.config() == named.policy.config() and mixed.config() != named.config()
    assert "round_policy=UniformPolicy" in repr(mixed)
    # The default planner is uniform allocation with the estimator's offset and minimum.
    same = sera_opt.RolloutPlanner("uniform", offset=1, min_rollouts=2, max_rollouts=32)
    assert same.config() == default.config()
    ids = list(range(8))
    p = np.linspace(0.02, 0.9, 8)
    runs = []
    for planner in (default, same):
        planner.observe(np.repeat(ids, 2), np.tile([0.0, 1.0], 8))
        runs.append(run_rounds(planner.start_rounds(ids, 64, rounds=4), draw(p, seed=4)))
    np.testing.assert_array_equal(runs[0].round_counts, runs[1].round_counts)


# ---------------------------------------------------------------- edges (issue 39)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "bool"])
def test_record_takes_half_precision_torch_rewards(dtype):
    torch = pytest.importorskip("torch")
    session = sera_opt.get_policy("uniform").start_rounds([0.5, 0.5], 8, rounds=2,
                                                         first_round=2)
    counts = session.next_round()
    rewards = torch.tensor([1, 0, 0, 1], dtype=getattr(torch, dtype))
    session.record(rewards)
    assert counts.sum() == 4 and session.successes.tolist() == [1, 1]
    later = int(session.next_round().sum())
    with pytest.raises(sera_opt.SeraOptError, match="binary"):
        session.record(torch.full((later,), 0.5, dtype=torch.bfloat16))


def test_rule_scale_holds_at_a_thousand_rollouts_and_more():
    for n in (1030, 1500):
        out = rule_scale(0.5, fixed_rule(n), rounds=1)
        assert np.isfinite(out.scale) and out.scale == pytest.approx(1.0, abs=1e-12)
        assert out.rollouts == pytest.approx(n, rel=1e-12)
        low = rule_scale(0.001, fixed_rule(n), rounds=1, offset=1)
        want = 1 - 0.999 ** n - 0.001 * 0.999 ** (n - 1)
        assert low.scale == pytest.approx(want, rel=1e-10)


def test_a_session_shared_between_threads_stays_whole():
    # Threads switch every microsecond, so that a call can be cut between its reads and
    # its writes (without the session's lock, about half the trials end broken).
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _hammer(sera_opt.get_policy("uniform", offset=1))
    finally:
        sys.setswitchinterval(before)


def _hammer(policy):
    for trial in range(30):
        session = policy.start_rounds(np.full(8, 0.5), 8 * 40, rounds=40)
        unexpected = []

        def work():
            for _ in range(300):
                try:
                    counts = session.next_round()
                    session.record(np.zeros(int(counts.sum())))
                except sera_opt.SeraOptError:
                    pass
                except Exception as exc:  # noqa: BLE001 - the test reports any other
                    unexpected.append(repr(exc))
                if session.done:
                    return

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not unexpected, unexpected
        assert session.done and session.result().counts.sum() == 8 * 40, trial
        assert session.round == session.rounds


# ---------------------------------------------------------------- round_index
def test_round_index_must_give_every_prompt_its_round_0():
    torch = pytest.importorskip("torch")
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    idx = torch.tensor([0, 0, 1, 1, 1])
    fine = sera_opt.maxrl_advantages(r, idx, round_index=torch.tensor([0, 0, 0, 0, 1]))
    assert torch.isfinite(fine).all()
    # Rounds counted from 1: no prompt has a round 0, and every baseline would be lost.
    with pytest.raises(sera_opt.SeraOptError, match=r"2 prompt\(s\) no rollout in round 0.*"
                                                    r"subtract 1"):
        sera_opt.maxrl_advantages(r, idx, round_index=torch.tensor([1, 1, 1, 1, 2]))
    # One prompt's first round left out of the rows.
    with pytest.raises(sera_opt.SeraOptError, match=r"1 prompt\(s\) no rollout in round 0"):
        sera_opt.maxrl_advantages(r, idx, round_index=torch.tensor([0, 0, 1, 1, 2]))
    # The success average has no baseline: any rounds from 0 are fine.
    sera_opt.maxrl_advantages(r, idx, estimator="success_average",
                              round_index=torch.tensor([1, 1, 1, 1, 2]))
    # A session's round_index always qualifies.
    out = run_rounds(sera_opt.get_policy("uniform", offset=1).start_rounds(P6, 36, rounds=3),
                     draw(P6))
    adv = sera_opt.maxrl_advantages(torch.tensor(out.rewards), torch.tensor(out.prompt_index),
                                    round_index=torch.tensor(out.round_index))
    assert adv.shape == (36,)
