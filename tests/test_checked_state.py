"""State on disk (sera_opt.checked_state): one checksum for one state, whatever the order of
its dicts; any change of a value, dtype, shape or key is seen; a write is whole or absent."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sera_opt import checked_state
from sera_opt.exceptions import SeraOptError


def _state():
    return {"format": "x/1", "counts": np.array([3, 1, 4], dtype=np.int64),
            "probs": np.array([0.5, 0.25]), "ids": np.array(["a", "b"], dtype=object),
            "nested": {"step": 7, "prior": [1.0, 2.0], "none": None, "flag": True,
                       "scalar": np.float32(0.5)}}


def test_the_digest_ignores_dict_order_and_sees_every_change():
    base = checked_state.state_digest(_state())
    reordered = dict(reversed(list(_state().items())))
    assert checked_state.state_digest(reordered) == base
    changes = [
        lambda s: s["counts"].__setitem__(0, 2),
        lambda s: s.__setitem__("counts", s["counts"].astype(np.int32)),
        lambda s: s.__setitem__("counts", s["counts"].reshape(3, 1)),
        lambda s: s["probs"].view(np.uint64).__setitem__(1, s["probs"].view(np.uint64)[1] ^ 1),
        lambda s: s["ids"].__setitem__(1, "c"),
        lambda s: s["nested"].__setitem__("step", 8),
        lambda s: s["nested"].__setitem__("flag", 1),
        lambda s: s["nested"].__setitem__("extra", None),
        lambda s: s["nested"].pop("none"),
        lambda s: s["nested"]["prior"].append(3.0),
        lambda s: s.__setitem__("format", "x/2"),
    ]
    digests = {base}
    for change in changes:
        state = _state()
        change(state)
        digests.add(checked_state.state_digest(state))
    assert len(digests) == len(changes) + 1, "two different states share a checksum"


def test_seal_and_unseal_round_trip_and_refuse_a_changed_state():
    payload = checked_state.seal(_state())
    assert checked_state.is_sealed(payload)
    assert checked_state.unseal(payload, source="f.pt") is payload["state"]
    payload["state"]["counts"][2] += 1
    with pytest.raises(SeraOptError, match="f.pt is damaged"):
        checked_state.unseal(payload, source="f.pt")
    with pytest.raises(SeraOptError, match="not a sealed sera_opt state"):
        checked_state.unseal({"format": checked_state.SEALED_FORMAT, "state": {}}, source="f")


def test_an_object_that_cannot_be_checked_is_refused_at_save():
    with pytest.raises(SeraOptError, match=r"the state\['solver'\], a object"):
        checked_state.seal({"solver": object()})


def test_write_atomic_replaces_whole_or_leaves_the_old_file(tmp_path):
    path = tmp_path / "state.bin"
    checked_state.write_atomic(path, lambda f: f.write(b"old"))
    assert path.read_bytes() == b"old"

    def fails(f):
        f.write(b"new, half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        checked_state.write_atomic(path, fails)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.bin"]
    checked_state.write_atomic(path, lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new"


def test_write_atomic_keeps_the_mode_a_plain_write_would_give(tmp_path):
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x")
    atomic = tmp_path / "atomic.bin"
    checked_state.write_atomic(atomic, lambda f: f.write(b"x"))
    assert (atomic.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)
    os.chmod(atomic, 0o640)
    checked_state.write_atomic(atomic, lambda f: f.write(b"y"))
    assert atomic.stat().st_mode & 0o777 == 0o640
