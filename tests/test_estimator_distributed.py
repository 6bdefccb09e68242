"""Data-parallel MaxRL advantages: 2 gloo processes on CPU must reproduce one process.

One spawn runs every scenario (process start-up dominates the cost). Each
rank holds a random shard of the rollouts, so most prompts are split across
ranks; every rank also computes the single-process result on the whole batch
and compares its own positions bit for bit. Failures travel back as text.
"""

from __future__ import annotations

import datetime
import itertools
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
JOIN_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _batch(seed, m=23, max_count=7):
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, max_count + 1, (m,), generator=g)
    ids = torch.repeat_interleave(torch.arange(m), counts)
    probs = torch.rand(m, generator=g, dtype=torch.float64)
    rewards = torch.bernoulli(probs[ids], generator=g)
    owner = torch.randint(0, WORLD, (ids.numel(),), generator=g)  # random split
    return rewards, ids, counts, owner


def _colliding(count):
    """Distinct ids that share their first hashing round's bucket (see test_estimator)."""
    from sera_opt.estimator.hashing import _INVERSES

    out = []
    for low in range(count):
        value = (((12345 << 34) | (low * 7919 + 1)) * _INVERSES[0]) % (1 << 64)
        out.append(value - (1 << 64) if value >= 1 << 63 else value)
    return torch.tensor(out)


def _check(condition, message, failures):
    if not condition:
        failures.append(message)


def _scenarios(rank, failures):
    import sera_opt
    from sera_opt.exceptions import SeraOptError

    group = dist.group.WORLD
    rewards, ids, counts, owner = _batch(seed=5)
    mine = owner == rank
    keys = torch.randint(-(2**63), 2**63 - 1, (counts.numel(),),
                         generator=torch.Generator().manual_seed(3))
    id_maps = {
        "dense": (ids, counts.numel()),
        "offset range": (ids + 10_000, None),
        "wide (hashed)": (ids * 10**13 - 3, None),
        "random 64-bit (hashed)": (keys[ids], None),
        "colliding (hashed)": (_colliding(counts.numel())[ids], None),
    }
    from sera_opt.estimator import groups as _estimator_groups

    # The shards are small: run the sparse ids through the hashing and the sort.
    for hash_from, estimator, correction in itertools.product(
            (0, 1 << 62), sera_opt.ESTIMATORS, (True, False)):
        _estimator_groups._HASH_MIN_ROLLOUTS = hash_from
        for label, (prompt_ids, num_prompts) in id_maps.items():
            kwargs = dict(estimator=estimator, multiplicity_correction=correction,
                          num_prompts=num_prompts)
            full = sera_opt.maxrl_advantages(rewards, prompt_ids, **kwargs)
            shard = sera_opt.maxrl_advantages(rewards[mine], prompt_ids[mine],
                                              process_group=group, **kwargs)
            _check(torch.equal(shard, full[mine]),
                   f"{estimator}, correction={correction}, {label}: shard differs by "
                   f"{(shard - full[mine]).abs().max().item()}", failures)
            if num_prompts is not None:
                fast = sera_opt.maxrl_advantages(rewards[mine], prompt_ids[mine],
                                                 process_group=group, validate=False,
                                                 **kwargs)
                _check(torch.equal(fast, full[mine]), f"{label}: validate=False differs",
                       failures)
            stats = sera_opt.group_statistics(rewards[mine], prompt_ids[mine],
                                              process_group=group, num_prompts=num_prompts)
            full_stats = sera_opt.group_statistics(rewards, prompt_ids,
                                                   num_prompts=num_prompts)
            for field in ("prompt_ids", "counts", "successes"):
                _check(torch.equal(getattr(stats, field), getattr(full_stats, field)),
                       f"{label}, hash_from={hash_from}: global {field} differ", failures)
            _check(torch.equal(stats.prompt_ids[stats.slot_index], prompt_ids[mine]),
                   f"{label}, hash_from={hash_from}: slot_index does not name the ids",
                   failures)
    _estimator_groups._HASH_MIN_ROLLOUTS = 0

    # All rollouts on rank 0, none on rank 1 (an empty shard still joins the collectives).
    for label, (prompt_ids, num_prompts) in id_maps.items():
        mine_all = torch.full_like(owner, 0) == rank
        full = sera_opt.maxrl_advantages(rewards, prompt_ids, num_prompts=num_prompts)
        shard = sera_opt.maxrl_advantages(rewards[mine_all], prompt_ids[mine_all],
                                          num_prompts=num_prompts, process_group=group)
        _check(torch.equal(shard, full[mine_all]), f"empty shard ({label}) differs", failures)

    # Group statistics and diagnostics are global.
    stats = sera_opt.group_statistics(rewards[mine], ids[mine], process_group=group)
    _check(torch.equal(stats.counts, counts), "global counts differ", failures)
    _check(int(stats.num_rollouts) == ids.numel(), "global N differs", failures)
    probs = torch.rand(counts.numel(), generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)[ids]
    for kwargs in (dict(), dict(success_probs=probs), dict(multiplicity_correction=False)):
        sharded = dict(kwargs)
        if "success_probs" in sharded:
            sharded["success_probs"] = probs[mine]
        full = sera_opt.advantage_diagnostics(rewards, ids, **kwargs)
        shard = sera_opt.advantage_diagnostics(rewards[mine], ids[mine], process_group=group,
                                               **sharded)
        for key, value in full.items():
            _check(abs(shard[key] - value) <= 1e-12 * max(1.0, abs(value)),
                   f"diagnostic {key} ({sorted(kwargs)}): {shard[key]} != {value}", failures)

    # Losses: averaging the ranks' gradients (as DDP does) gives the full-batch gradient.
    torch.manual_seed(0)
    weight = torch.randn(5, dtype=torch.float64, requires_grad=True)
    features = torch.randn(ids.numel(), 9, 5, dtype=torch.float64)
    mask = torch.rand(ids.numel(), 9, generator=torch.Generator().manual_seed(2)) < 0.6
    for mode in sera_opt.LOSS_MODES:
        adv = sera_opt.maxrl_advantages(rewards, ids)
        logp = torch.nn.functional.logsigmoid(features @ weight)
        (full_grad,) = torch.autograd.grad(sera_opt.policy_gradient_loss(logp, adv, mask, mode),
                                           weight)
        shard_adv = sera_opt.maxrl_advantages(rewards[mine], ids[mine], process_group=group)
        shard_logp = torch.nn.functional.logsigmoid(features[mine] @ weight)
        loss = sera_opt.policy_gradient_loss(shard_logp, shard_adv, mask[mine], mode,
                                             process_group=group)
        (grad,) = torch.autograd.grad(loss, weight)
        dist.all_reduce(grad)
        grad /= WORLD
        _check(torch.allclose(grad, full_grad, rtol=1e-12, atol=1e-14),
               f"loss mode {mode}: averaged gradient {grad} != {full_grad}", failures)
        value = loss.detach().clone()
        dist.all_reduce(value)
        full_value = sera_opt.policy_gradient_loss(logp, adv, mask, mode).detach()
        _check(torch.allclose(value / WORLD, full_value, rtol=1e-12),
               f"loss mode {mode}: mean of rank losses {value / WORLD} != {full_value}", failures)

    # Invalid loss inputs on one rank: every rank raises (also in "token-sum" mode,
    # which needs no collective of its own), the faulty one says what is wrong.
    shard_adv = sera_opt.maxrl_advantages(rewards[mine], ids[mine], process_group=group)
    shard_logp = torch.nn.functional.logsigmoid(features[mine] @ weight).detach()
    shard_mask = mask[mine].double()
    bad_mask = torch.full_like(shard_mask, -1.0) if rank == 1 else shard_mask
    bad_adv = torch.full_like(shard_adv, float("nan")) if rank == 1 else shard_adv
    bad_logp = torch.full_like(shard_logp, float("inf")) if rank == 1 else shard_logp
    pg, agg = sera_opt.policy_gradient_loss, sera_opt.aggregate_loss
    for mode in sera_opt.LOSS_MODES:
        calls = {
            ("policy_gradient_loss", "mask"): (pg, (shard_logp, shard_adv, bad_mask)),
            ("policy_gradient_loss", "advantages"): (pg, (shard_logp, bad_adv, shard_mask)),
            ("policy_gradient_loss", "token_logprobs"): (pg, (bad_logp, shard_adv, shard_mask)),
            ("aggregate_loss", "mask"): (agg, (shard_logp, bad_mask)),
            ("aggregate_loss", "per_token_loss"): (agg, (bad_logp, shard_mask)),
        }
        for (name, culprit), (func, args) in calls.items():
            try:
                func(*args, mode=mode, process_group=group)
                failures.append(f"rank {rank}: {name}, {mode}, bad {culprit}: no error")
            except SeraOptError as exc:
                text = str(exc)
                ok = (text.startswith(f"{culprit} contains") if rank == 1
                      else "another rank" in text and culprit in text)
                _check(ok, f"rank {rank}: {name}, {mode}, bad {culprit}: {text}", failures)

    # Invalid input on one rank: every rank raises, nobody hangs in a collective.
    bad = rewards[mine].clone()
    if rank == 1:
        bad[0] = 0.5
    for num_prompts in (None, counts.numel()):
        try:
            sera_opt.maxrl_advantages(bad, ids[mine], num_prompts=num_prompts,
                                      process_group=group)
            failures.append(f"rank {rank}: no error for a non-binary reward on rank 1")
        except SeraOptError as exc:
            expected = "binary" if rank == 1 else "another rank"
            _check(expected in str(exc), f"rank {rank}: unexpected message {exc}", failures)


def _worker(rank, port, out_dir):
    failures: list[str] = []
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=60))
        try:
            _scenarios(rank, failures)
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except Exception:
        failures.append(traceback.format_exc())
    with open(f"{out_dir}/rank{rank}.txt", "w") as fh:
        fh.write("\n".join(failures) if failures else "OK")


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
def test_two_gloo_ranks_reproduce_single_process(tmp_path):
    context = mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"distributed workers did not finish in {JOIN_TIMEOUT_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
    for rank in range(WORLD):
        report = (tmp_path / f"rank{rank}.txt").read_text()
        assert report == "OK", f"rank {rank}:\n{report}"
