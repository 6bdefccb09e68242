"""Every numeric option of every `sera-opt bench` subcommand (and of `sera-opt demo`) is
checked on the command line, before any work: a negative seed, zero or negative counts,
a decay outside (0, 1] are one line on stderr and exit status 2, never an "unexpected
error" after minutes of work, nor a zero that silently means the default."""

from __future__ import annotations

import pytest

from sera_opt.cli import main

CASES = [
    ("solvers", ["--seed", "-1"]), ("solvers", ["--seed", str(2**32)]),
    ("solvers", ["--repeats", "0"]), ("solvers", ["--max-seconds", "-5"]),
    ("solvers", ["--max-seconds", "nan"]),
    ("rounds", ["--seed", "-1"]), ("rounds", ["--rounds", "-1"]), ("rounds", ["--rounds", "0"]),
    ("maze", ["--seed", "-1"]), ("maze", ["--seeds", "0"]), ("maze", ["--steps", "-3"]),
    ("maze", ["--rollouts-per-maze", "0"]), ("maze", ["--mazes-per-step", "0"]),
    ("maze", ["--max-rollouts", "0"]), ("maze", ["--tracker-decay", "0"]),
    ("maze", ["--tracker-decay", "1.5"]), ("maze", ["--workers", "0"]),
    ("estimator", ["--seed", "-2"]), ("estimator", ["--rollouts", "0"]),
    ("estimator", ["--prompts", "-1"]), ("estimator", ["--rounds", "0"]),
    ("estimator", ["--threads", "0"]),
    ("tracking", ["--seed", "-1"]), ("tracking", ["--rollouts", "0"]),
    ("tracking", ["--prompts", "0"]), ("tracking", ["--rounds", "-1"]),
    ("first-use", ["--seed", "-1"]), ("first-use", ["--repeats", "0"]),
    ("trl-rounds", ["--seed", "-1"]), ("trl-rounds", ["--repeats", "0"]),
    ("trl-rounds", ["--steps", "0"]), ("trl-rounds", ["--completion-length", "0"]),
    ("alignment", ["--seed", "-1"]), ("alignment", ["--budgets", "4", "0"]),
    ("alignment", ["--draws", "0"]), ("alignment", ["--batches", "-1"]),
    ("alignment", ["--batch-size", "0"]), ("alignment", ["--history-rollouts", "-1"]),
    ("alignment", ["--max-ratio", "0"]),
    ("arithmetic", ["--seed", "-1"]), ("arithmetic", ["--seeds", "0"]),
    ("arithmetic", ["--threads", "0"]), ("arithmetic", ["--rl-steps", "0"]),
    ("arithmetic", ["--sft-steps", "-1"]),
    ("default-path", ["--repeats", "0"]), ("default-path", ["--first-use-repeats", "0"]),
    ("default-path", ["--repeats", "-2"]),
    # Two presets named at once: neither is guessed.
    ("maze", ["--quick", "--preset", "hard"]),
]


@pytest.mark.parametrize("name, args", CASES, ids=[f"{n}{''.join(a)}" for n, a in CASES])
def test_a_bad_number_is_refused_in_one_line_before_any_work(name, args, capsys, tmp_path):
    code = main(["bench", name, "--out", str(tmp_path / "out"), *args])
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert err.count("\n") == 1 and err.startswith(f"sera-opt bench {name}: error: "), err
    assert args[0] in err and "unexpected" not in err, err
    assert not (tmp_path / "out").exists(), "the benchmark started before the check"


@pytest.mark.parametrize("args", [["--seed", "-1"], ["--budgets", "0"], ["--draws", "0"]])
def test_the_demo_checks_its_numbers_too(args, capsys):
    code = main(["demo", *args])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and args[0] in err, err
