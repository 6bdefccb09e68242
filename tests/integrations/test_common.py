"""The adapters' shared glue (sera_opt.integrations._common): one rule each, checked once."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sera_opt
from sera_opt.exceptions import SeraOptError, SeraOptWarning
from sera_opt.integrations import _common


def test_estimators_and_offsets_are_the_libraries_own():
    assert _common.ESTIMATOR_OFFSETS is sera_opt.ESTIMATOR_OFFSETS
    assert _common.ESTIMATORS == tuple(sera_opt.ESTIMATORS)
    assert _common.LOSS_MODES == tuple(sera_opt.LOSS_MODES)
    for estimator, offset in sera_opt.ESTIMATOR_OFFSETS.items():
        assert _common.estimator_offset(estimator) == offset
        assert _common.default_min_rollouts(estimator) == 1 + offset
    with pytest.raises(SeraOptError, match=r"algorithm\.x must be one of"):
        _common.estimator_offset("grpo", option="algorithm.x")
    with pytest.raises(SeraOptError, match="must be one of"):
        _common.estimator_offset(["mean_centred"])


def test_default_max_rollouts():
    assert _common.default_max_rollouts(8) == 4 * 8
    assert _common.default_max_rollouts(1, min_rollouts=6) == 6


def test_loss_mode_names_the_setting():
    table = {"dapo": "token-mean"}
    assert _common.loss_mode(table, "dapo", option="loss_type") == "token-mean"
    with pytest.raises(SeraOptError, match=r"loss_type='ppo' is not one of \['dapo'\]"):
        _common.loss_mode(table, "ppo", option="loss_type")
    with pytest.raises(SeraOptError, match="not one of"):
        _common.loss_mode(table, ["dapo"], option="loss_type")


def test_every_adapter_table_maps_into_the_librarys_loss_modes():
    from sera_opt.integrations import torch_loop

    assert set(torch_loop.LOSS_MODES) == set(sera_opt.LOSS_MODES)
    tables = []
    try:
        from sera_opt.integrations.trl import LOSS_TYPE_TO_MODE

        tables.append(LOSS_TYPE_TO_MODE)
    except sera_opt.MissingDependencyError:
        pass
    try:
        from sera_opt.integrations.verl import LOSS_AGG_MODES

        tables.append(LOSS_AGG_MODES)
    except sera_opt.MissingDependencyError:
        pass
    for table in tables:
        assert set(table.values()) <= set(sera_opt.LOSS_MODES), table


# --------------------------------------------------------------------------- outcomes


@settings(max_examples=80, deadline=None)
@given(
    rewards=st.lists(
        st.floats(-2, 3, allow_nan=False, allow_infinity=False), min_size=1, max_size=30
    ),
    threshold=st.floats(-1, 2, allow_nan=False),
    data=st.data(),
)
def test_outcomes_follow_the_estimators_rule(rewards, threshold, data):
    """The planner sees the successes sera_opt.maxrl_advantages counts, prompt by prompt."""
    index = data.draw(st.lists(st.integers(0, 4), min_size=len(rewards), max_size=len(rewards)))
    outcomes = _common.binary_outcomes(np.array(rewards), threshold)
    assert outcomes.dtype == np.float64
    assert outcomes.tolist() == [float(r >= threshold) for r in rewards]
    stats = sera_opt.group_statistics(
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(index),
        success_threshold=threshold,
    )
    per_prompt = np.bincount(index, weights=outcomes, minlength=5)
    np.testing.assert_array_equal(
        per_prompt[stats.prompt_ids.numpy()], stats.successes.numpy().astype(float)
    )


def test_outcomes_without_a_threshold_must_be_binary():
    np.testing.assert_array_equal(_common.binary_outcomes([0, 1, 1]), [0.0, 1.0, 1.0])
    np.testing.assert_array_equal(_common.binary_outcomes(torch.tensor([True, False])), [1.0, 0.0])
    for bad, match in [
        ([0, 0.5], "binary"),
        ([1.0, float("nan")], "NaN"),
        ([1.0, float("inf")], "NaN or infinite"),
        ([[0, 1]], "one number per rollout"),
        (np.array(["a", "b"]), "real numbers"),
        (np.array([1j, 0]), "real numbers"),
    ]:
        with pytest.raises(SeraOptError, match=match):
            _common.binary_outcomes(bad)
    # NaN compared with a threshold would be a silent failure: refused too.
    with pytest.raises(SeraOptError, match="NaN"):
        _common.binary_outcomes([float("nan"), 1.0], success_threshold=0.5)
    for threshold in (float("nan"), True, "0.5"):
        with pytest.raises(SeraOptError, match="finite number"):
            _common.binary_outcomes([1.0], success_threshold=threshold)


# --------------------------------------------------------------------------- counts


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(-2, 9), min_size=1, max_size=8),
    minimum=st.integers(0, 2),
    as_float=st.booleans(),
)
def test_check_counts_matches_a_plain_reference(counts, minimum, as_float):
    array = np.asarray(counts, dtype=np.float64 if as_float else np.int64)
    valid = min(counts) >= minimum and sum(counts) > 0
    if valid:
        out = _common.check_counts(array, len(counts), minimum=minimum)
        assert out.dtype == np.int64 and out.tolist() == counts
        assert (
            _common.check_counts(torch.as_tensor(array), len(counts), minimum=minimum).tolist()
            == counts
        )
    else:
        with pytest.raises(SeraOptError):
            _common.check_counts(array, len(counts), minimum=minimum)


def test_check_counts_rejects_what_is_not_a_count():
    for counts, match in [
        ([1.5, 2], "whole numbers"),
        ([True, True], "whole numbers"),
        ([1.0, float("nan")], "whole numbers"),
        (["1", "2"], "whole numbers"),
        ([1, 2, 3], "one entry per prompt"),
        ([[1, 2]], "one entry per prompt"),
        ([1, 0], "at least 1 rollout"),
    ]:
        with pytest.raises(SeraOptError, match=match):
            _common.check_counts(counts, 2)
    with pytest.raises(SeraOptError, match="sum to 0"):
        _common.check_counts([0, 0], 2, minimum=0)
    with pytest.raises(SeraOptError, match="summing to the budget"):
        _common.check_counts([2, 2], 2, budget=5)
    allocation = sera_opt.allocate([0.2, 0.8], budget=6, min_rollouts=1)
    assert _common.check_counts(allocation, 2, budget=6).sum() == 6


# --------------------------------------------------------------------------- checkpoints


def _planner(ids):
    planner = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    planner.observe(ids, np.array([1.0, 0.0, 1.0, 1.0]))
    return planner


def _assert_same_state(left, right):
    if isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            _assert_same_state(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            _assert_same_state(a, b)
    elif isinstance(left, np.ndarray):
        np.testing.assert_array_equal(left, right)
    else:
        assert left == right or (left != left and right != right), (left, right)


@pytest.mark.parametrize("ids", [[3, 3, 7, 9], ["a", "a", "b", "c"]], ids=["int-ids", "str-ids"])
def test_planner_round_trips_through_a_checkpoint_folder(tmp_path, ids):
    planner = _planner(ids)
    path = _common.save_planner(planner, tmp_path / "checkpoint-4")
    assert os.path.basename(path) == _common.PLANNER_STATE_FILE == "sera_planner.pt"
    fresh = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    assert _common.load_planner(fresh, tmp_path / "checkpoint-4") == path
    _assert_same_state(fresh.state_dict(), planner.state_dict())


def test_planner_saved_under_the_earlier_name_is_restored(tmp_path):
    planner = _planner([1, 1, 2, 3])
    legacy = tmp_path / _common.LEGACY_PLANNER_STATE_FILES[0]
    torch.save(planner.state_dict(), legacy)
    fresh = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    assert _common.load_planner(fresh, tmp_path) == str(legacy)
    _assert_same_state(fresh.state_dict(), planner.state_dict())
    # The current name wins when both are there.
    newer = _planner([5, 5, 6, 6])
    _common.save_planner(newer, tmp_path)
    assert _common.load_planner(fresh, tmp_path) == _common.planner_state_path(tmp_path)
    _assert_same_state(fresh.state_dict(), newer.state_dict())


def test_no_planner_file_leaves_the_planner_alone(tmp_path):
    planner = _planner([1, 1, 2, 3])
    before = planner.state_dict()
    assert _common.load_planner(planner, tmp_path) is None
    _assert_same_state(planner.state_dict(), before)


class _Payload:
    """Would create a file when unpickled."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_planner_file_cannot_run_code_on_resume(tmp_path):
    target = tmp_path / "ran"
    torch.save({"format": _Payload(str(target))}, tmp_path / _common.PLANNER_STATE_FILE)
    planner = _planner([1, 1, 2, 3])
    before = planner.state_dict()
    with pytest.raises(SeraOptError, match="cannot|can be loaded safely"):
        _common.load_planner(planner, tmp_path)
    assert not target.exists(), "unpickling ran code"
    _assert_same_state(planner.state_dict(), before)


def _flip_bit_in_successes(path, tmp_path):
    """Rewrite the sealed file with one bit of a stored success count flipped and the old
    checksum kept, as a damaged disk or a hand edit would leave it."""
    payload = torch.load(path, weights_only=False)
    successes = payload["state"]["tracker"]["successes"]
    successes.view(np.uint64)[0] ^= np.uint64(1) << np.uint64(40)
    torch.save(payload, path)


def test_a_flipped_bit_in_a_stored_success_count_is_refused(tmp_path):
    planner = _planner([1, 1, 2, 3])
    path = _common.save_planner(planner, tmp_path)
    _flip_bit_in_successes(path, tmp_path)
    fresh = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    before = fresh.state_dict()
    with pytest.raises(SeraOptError, match="is damaged: its state's checksum"):
        _common.load_planner(fresh, tmp_path)
    _assert_same_state(fresh.state_dict(), before)


def test_a_flipped_byte_anywhere_in_the_file_is_refused_or_changes_nothing(tmp_path):
    # Bytes of the zip's bookkeeping that torch does not read (timestamps, padding, the
    # directory's copies) may change without changing the state; every other flip is
    # refused in the library's words, never with torch's advice to load unsafely.
    planner = _planner([1, 1, 2, 3])
    saved = planner.state_dict()
    path = _common.save_planner(planner, tmp_path)
    original = open(path, "rb").read()
    # torch pickles with protocol 2, where numpy's bytes travel as latin-1 text in UTF-8.
    counts = saved["tracker"]["successes"].tobytes().decode("latin-1").encode("utf-8")
    inside = original.find(counts)
    assert inside > 0, "the success counts are not where the test looks for them"
    offsets = sorted({*range(0, len(original), 7), *range(inside, inside + len(counts))})
    refused = 0
    for offset in offsets:
        damaged = bytearray(original)
        damaged[offset] ^= 0xFF
        open(path, "wb").write(bytes(damaged))
        fresh = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's note on an unknown pickle protocol
                _common.load_planner(fresh, tmp_path)
        except SeraOptError as exc:
            refused += 1
            assert "weights_only=False" not in str(exc) and path in str(exc), (offset, exc)
            assert exc.__cause__ is None, offset
            continue
        _assert_same_state(fresh.state_dict(), saved)
    assert refused > len(counts), f"only {refused} of {len(offsets)} damaged files refused"


def test_an_interrupted_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    first = _planner([1, 1, 2, 3])
    path = _common.save_planner(first, tmp_path)
    before = open(path, "rb").read()
    second = _planner([5, 5, 6, 7])
    real_save = torch.save

    def dies_halfway(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(len(before) // 2)
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(_common.torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        _common.save_planner(second, tmp_path)
    monkeypatch.undo()
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == [_common.PLANNER_STATE_FILE], "a temporary file was left"
    fresh = sera_opt.RolloutPlanner("sera", min_rollouts=2, max_rollouts=8, offset=1)
    _common.load_planner(fresh, tmp_path)
    _assert_same_state(fresh.state_dict(), first.state_dict())


def test_a_saved_planner_carries_the_checksum_of_its_state(tmp_path):
    from sera_opt import checked_state

    planner = _planner([1, 1, 2, 3])
    payload = torch.load(_common.save_planner(planner, tmp_path), weights_only=False)
    assert payload["format"] == checked_state.SEALED_FORMAT
    assert payload["sha256"] == checked_state.state_digest(planner.state_dict())


# --------------------------------------------------------------------------- versions


def test_version_policy(monkeypatch):
    monkeypatch.delenv(_common.ALLOW_UNTESTED_VERSIONS_ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _common.check_version("pkg", "1.16.2", ("1.16.",), adapter="a", reason="r.")
    with pytest.raises(
        SeraOptError, match=r"a supports pkg 1\.16\.\*; found pkg 1\.17\.0\. r\."
    ) as error:
        _common.check_version("pkg", "1.17.0", ("1.16.",), adapter="a", reason="r.")
    assert "pip install 'pkg==1.16.*'" in str(error.value)
    monkeypatch.setenv(_common.ALLOW_UNTESTED_VERSIONS_ENV, "yes")  # only "1" opts in
    with pytest.raises(SeraOptError):
        _common.check_version("pkg", "1.17.0", ("1.16.",), adapter="a", reason="r.")
    monkeypatch.setenv(_common.ALLOW_UNTESTED_VERSIONS_ENV, "1")
    with pytest.warns(SeraOptWarning, match="running anyway") as caught:
        _common.check_version("pkg", "1.17.0", ("1.16.",), adapter="a", reason="r.", stacklevel=1)
    assert caught[0].filename == __file__
