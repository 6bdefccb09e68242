"""`sera-opt bench device`: without CUDA it refuses in one line and writes nothing; with CUDA
its bf16 TRL stage trains the shipped trainer on the device (a gpu-marked test, which the
command itself runs)."""

import pytest

from tests.markers import requires_gpu, requires_trl

#: requires_gpu skips where there is no CUDA device: its condition is "no CUDA".
NO_CUDA = bool(requires_gpu.args[0])


@pytest.mark.skipif(not NO_CUDA, reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_so_and_writes_nothing(tmp_path, capsys):
    from sera_opt.cli import main

    assert main(["bench", "device", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device is available" in err, err
    assert not (tmp_path / "out").exists()


@requires_trl
@requires_gpu
@pytest.mark.trl
@pytest.mark.gpu
def test_the_bf16_stage_trains_the_shipped_trainer_on_cuda(tmp_path):
    from sera_opt.benchmarks import device

    result = device.trl_bf16_steps(tmp_path, 2)
    assert result["device"].startswith("cuda") and result["mixed_precision"] == "bf16"
    assert result["steps"] == 2 and result["counts_match"]
    assert all(calls >= 2 for calls in result["generation_calls"])  # the shipped rounds
