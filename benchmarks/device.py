"""The checks that need a CUDA device, in one command: ``sera-opt bench device``.

On a machine with CUDA it runs, each in its own process with its own time limit
(8 minutes in all):

1. ``gpu-tests``: the test suite's ``gpu``-marked tests (``pytest -m gpu`` on the
   ``tests`` folder of the source checkout this package runs from; skipped, with
   the reason, where there is none);
2. ``trl-bf16``: a few optimizer steps of :class:`sera_opt.integrations.trl.SeraGRPOTrainer`
   as shipped (default planner, rounds and estimator) in bf16 on the CUDA device,
   on the tiny GPT-2 and character tokenizer built in code (nothing downloaded):
   per step the wall time, the generation calls and whether the completions
   generated per prompt were the planned counts;
3. ``trl-coverage-quick``: ``sera-opt bench trl-coverage --quick`` end to end.

It writes ``device.json`` under ``--out``: the machine (GPU name, memory, CUDA and
torch versions) and, per stage, whether it passed, its wall time, its output's
last lines and its own results. The exit status is 0 when every stage passed, 1
otherwise. On a machine without CUDA it writes nothing and stops with an error
saying so (exit status 2).

    sera-opt bench device [--out DIR] [--steps N]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sera_opt.exceptions import SeraOptError

from . import _harness

NAME = "device"
#: Each stage's time limit in seconds; together under 8 minutes.
TIME_LIMITS = {"gpu-tests": 210, "trl-bf16": 90, "trl-coverage-quick": 150}
TAIL_LINES = 25


def _require_cuda() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        raise SeraOptError("sera-opt bench device needs torch with CUDA; torch is not "
                           "installed (pip install 'sera_opt[trl]').") from None
    if not torch.cuda.is_available():
        raise SeraOptError(
            "no CUDA device is available (torch.cuda.is_available() is False), so there is "
            "nothing for this command to check; run it on a machine with an NVIDIA GPU and a "
            "CUDA build of torch. The CPU benchmarks (sera-opt bench trl-coverage, maze, "
            "arithmetic) run here.")
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpus": torch.cuda.device_count(), "cuda": torch.version.cuda,
            "torch": torch.__version__, "bf16_supported": bool(torch.cuda.is_bf16_supported())}


def _run(stage: str, argv: list[str], *, cwd: Path | None = None) -> dict[str, Any]:
    """Run one stage's command with its time limit; what it printed and how it ended."""
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                              timeout=TIME_LIMITS[stage])
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        output = ((exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes)
                  else exc.stdout or "")
        output += f"\nstopped after its time limit of {TIME_LIMITS[stage]} s"
    return {"passed": code == 0, "exit_status": code, "wall_s": time.perf_counter() - start,
            "command": " ".join(argv), "output_tail": output.splitlines()[-TAIL_LINES:]}


def _tests_folder() -> Path | None:
    # In a source checkout (an editable install), this file is benchmarks/device.py.
    folder = Path(__file__).resolve().parents[1] / "tests"
    return folder if (folder / "markers.py").is_file() else None


def trl_bf16_steps(out: Path, steps: int) -> dict[str, Any]:
    """Train SeraGRPOTrainer as shipped for ``steps`` optimizer steps in bf16 on CUDA."""
    import tempfile

    from sera_opt.integrations.trl_tiny import (
        build_tiny_model,
        build_tokenizer,
        copy_digit_reward,
        make_prompts,
        offline_transformers,
        prompt_dataset,
    )

    offline_transformers()
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig

    from sera_opt.integrations.trl import SeraGRPOTrainer

    tokenizer = build_tokenizer()
    dataset = prompt_dataset(make_prompts(32, seed=0))
    step_times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            step_times.append(time.perf_counter() - self.start)

    with tempfile.TemporaryDirectory(prefix="sera_bench_device_") as output_dir:
        config = GRPOConfig(output_dir=output_dir, bf16=True, report_to="none", seed=0,
                            num_generations=8, per_device_train_batch_size=64,
                            max_completion_length=8, max_steps=steps, learning_rate=3e-3,
                            logging_steps=1, save_strategy="no", disable_tqdm=True,
                            dataloader_num_workers=0)
        trainer = SeraGRPOTrainer(model=build_tiny_model(tokenizer, seed=0),
                                  reward_funcs=copy_digit_reward, args=config,
                                  train_dataset=dataset, processing_class=tokenizer,
                                  callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
        history = list(trainer.sera_history)
        device = str(next(trainer.model.parameters()).device)
        dtype = str(trainer.accelerator.mixed_precision)
    result = {"device": device, "mixed_precision": dtype, "rounds": trainer.sera_rounds,
              "step_s": step_times,
              "generation_calls": [len(r.get("round_counts", [None])) for r in history],
              "counts_match": all(r["allocated_counts"] == r["generated_counts"]
                                  for r in history),
              "steps": len(history)}
    if not result["device"].startswith("cuda") or result["mixed_precision"] != "bf16":
        raise SeraOptError(f"the trainer ran on {device} with mixed precision {dtype}, "
                           "not on CUDA in bf16.")
    if not result["counts_match"] or result["steps"] != steps:
        raise SeraOptError("the backend did not generate the planned counts in every step: "
                           f"{history}")
    _harness.write_json(out, "trl_bf16", result)
    return result


def main(argv=None) -> int:
    parser = _harness.common_parser(NAME, __doc__.splitlines()[0])
    parser.add_argument("--steps", type=_harness.at_least(2), default=4,
                        help="optimizer steps of the bf16 TRL stage (default 4)")
    parser.add_argument("--stage", choices=["trl-bf16"], default=None,
                        help="run one stage in this process (what the command runs in its "
                             "child processes)")
    args = parser.parse_args(argv)
    machine = _require_cuda()
    out = Path(args.out)
    if args.stage == "trl-bf16":
        print(json.dumps(trl_bf16_steps(out, args.steps)))
        return 0
    start = time.perf_counter()
    stages: dict[str, Any] = {}
    tests = _tests_folder()
    if tests is None:
        stages["gpu-tests"] = {"passed": None, "skipped": "no tests folder beside this package "
                                                         "(not a source checkout)"}
    else:
        stages["gpu-tests"] = _run("gpu-tests", [sys.executable, "-m", "pytest", "-m", "gpu",
                                                 "-q", "-p", "no:cacheprovider", str(tests)],
                                   cwd=tests.parent)
    stages["trl-bf16"] = _run("trl-bf16", [sys.executable, "-m", "sera_opt.benchmarks.device",
                                           "--stage", "trl-bf16", "--steps", str(args.steps),
                                           "--out", str(out / "trl_bf16")])
    if stages["trl-bf16"]["passed"]:
        stages["trl-bf16"]["result"] = json.loads((out / "trl_bf16" / "trl_bf16.json").read_text())
    stages["trl-coverage-quick"] = _run(
        "trl-coverage-quick", [sys.executable, "-m", "sera_opt.benchmarks.trl_coverage",
                               "--quick", "--no-progress", "--out", str(out / "trl_coverage")])
    if stages["trl-coverage-quick"]["passed"]:
        coverage = json.loads((out / "trl_coverage" / "trl_coverage.json").read_text())
        stages["trl-coverage-quick"]["cost"] = {
            arm: entry["cost"] for arm, entry in coverage["summary"]["arms"].items()}
    passed = all(stage["passed"] is not False for stage in stages.values())
    path = _harness.write_json(out, NAME, {"device": machine, "stages": stages,
                                           "passed": passed,
                                           "wall_time_s": time.perf_counter() - start,
                                           "time_limits_s": TIME_LIMITS})
    for name, stage in stages.items():
        state = "skipped" if stage["passed"] is None else ("passed" if stage["passed"]
                                                           else "FAILED")
        print(f"{name:<20s} {state:<8s} {stage.get('wall_s', 0.0):6.1f} s")
    print(f"{machine['gpu']}: {'every stage passed' if passed else 'a stage failed'}; "
          f"wrote {path}")
    return 0 if passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_harness.run_command(NAME, main))
