"""verl on CPU: a whole verl 0.9.1 training run (GRPO, MaxRL, the ``sera_*`` modes) without a GPU.

verl 0.9.1 runs on CPU once nine things it assumes about the machine are met; none
needs a change inside verl. Importing this module meets them from outside, by
registration, by patching a name verl imported, or by configuration
(:func:`cpu_overrides`), in the order a run meets them:

1. **A "cpu" platform** (:class:`PlatformCPU`). verl's platform manager falls back to
   "nvidia" when it detects no accelerator; ``VERL_PLATFORM=cpu`` selects this one.
   Its device module (:data:`cpu_device`) is ``torch.cpu`` plus what verl calls on a
   ``torch.cuda``-like module and ``torch.cpu`` lacks (``empty_cache``,
   ``max_memory_allocated``, ``mem_get_info``, ``get_device_name``, ...).
2. **The FSDP engines for the "cpu" device** (:func:`register_engines`): verl registers
   them for "cuda" and "npu" only.
3. **A gloo process group** (:func:`_patch_process_group`): verl builds the backend
   string ``"cpu:gloo,<device>:<backend>"``, which for the "cpu" device names the CPU
   twice and torch refuses.
4. **verl beside trl 1.16**: :mod:`sera_opt.integrations._verl_compat`, applied by
   :mod:`sera_opt.integrations.verl` (imported here).
5. **Logical GPUs for Ray**: verl's resource pools ask Ray for one "GPU" per rank, so
   the local Ray is started with ``num_gpus`` equal to the ranks and enough logical
   CPUs (:data:`RAY_NUM_CPUS`) for every actor verl starts (:func:`cpu_overrides`).
6. **One TransferQueue storage unit** instead of 8 (:func:`cpu_overrides`), so that
   the queue's actors fit the logical CPUs; an actor or placement group that Ray
   cannot start ends the run with a message naming it instead of waiting forever
   (:func:`run`'s watchdog).
7. **A transformers rollout** registered under the name ``"hf"`` in both of verl's
   rollout registries: the replica (:class:`HFRolloutReplica`), whose server is a
   Ray actor (:class:`HFRolloutServer`) with verl's token-in-token-out ``generate``
   and the control methods, and the adapter inside the hybrid worker
   (:class:`HFServerAdapter`) that hands the trained weights to it.
8. **Weight sync without NCCL**: verl's synchronous V1 trainer uses its "naive"
   checkpoint engine, which hands ``(name, tensor)`` pairs to the adapter's
   ``update_weights``; the adapter sends them to its server.
9. **Model and precision**: a Llama config (:func:`build_tiny_model`; a qwen2 model
   type selects a token builder that needs chat tokens), ``attn_implementation=sdpa``,
   fp32 and ``use_remove_padding=false`` (:func:`cpu_overrides`).

Every Ray process of a run imports this module through verl's
``VERL_USE_EXTERNAL_MODULES`` hook (:func:`run` sets it, with ``VERL_PLATFORM=cpu``).
One call runs a job::

    from sera_opt.integrations import verl_cpu

    workdir = verl_cpu.build_tiny_setup("/tmp/verl_cpu")   # model, tokenizer, data
    verl_cpu.run(verl_cpu.cpu_overrides(workdir) + ["trainer.total_training_steps=2"])

or from the shell: ``python -m sera_opt.integrations.verl_cpu /tmp/verl_cpu <hydra overrides>``.

verl releases other than 0.9.1 are refused on import unless
``SERA_OPT_ALLOW_UNTESTED_VERSIONS=1`` is set: each workaround answers a line of
0.9.1's code, named in its comment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sera_opt.exceptions import MissingDependencyError, SeraOptError

try:
    import ray
    import torch
    import verl
    from verl.plugin.platform import PlatformBase, PlatformRegistry
except ImportError as _error:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        "sera_opt.integrations.verl_cpu needs verl 0.9.1 and its dependencies; see "
        "docs/integrations/verl.md for the install lines (pip install 'sera_opt[verl]')."
    ) from _error

from sera_opt.integrations import _common

__all__ = [
    "DATA_SOURCE",
    "PLATFORM_NAME",
    "RAY_NUM_CPUS",
    "ROLLOUT_NAME",
    "SUPPORTED_VERL_VERSIONS",
    "WORKER_MODULE",
    "HFRolloutReplica",
    "HFRolloutServer",
    "HFServerAdapter",
    "PlatformCPU",
    "apply",
    "build_tiny_model",
    "build_tiny_setup",
    "compute_score",
    "cpu_device",
    "cpu_overrides",
    "main",
    "ray_cpus",
    "register_engines",
    "register_rollout",
    "run",
]

logger = logging.getLogger("sera_opt.integrations.verl_cpu")

#: verl releases this module was written and tested against. Each workaround answers
#: a line of 0.9.1's code, so a later release is refused until it is checked.
SUPPORTED_VERL_VERSIONS = ("0.9.1",)

#: The platform name (``VERL_PLATFORM``) and device name this module registers.
PLATFORM_NAME = "cpu"

#: The rollout name (``actor_rollout_ref.rollout.name``) of the transformers rollout.
ROLLOUT_NAME = "hf"

#: The module every Ray process of a CPU run imports (``VERL_USE_EXTERNAL_MODULES``).
WORKER_MODULE = "sera_opt.integrations.verl_cpu"

#: Logical CPUs of the local Ray of a one-rank CPU run (:func:`ray_cpus`). verl starts,
#: at one CPU each, the task runner, the TransferQueue controller and storage unit,
#: the reward and agent-loop workers, and one hybrid worker per rank whose placement
#: bundle reserves three. These are scheduling tokens, not cores; the count is kept
#: tight so that TransferQueue's default of 8 storage units cannot fit (barrier 6
#: then fails loudly instead of passing unnoticed).
RAY_NUM_CPUS = 8


def ray_cpus(ranks: int = 1) -> int:
    """Logical CPUs for a CPU run with ``ranks`` FSDP ranks (three more per rank)."""
    return RAY_NUM_CPUS + 3 * (int(ranks) - 1)

#: ``data_source`` of the digit-addition data set of :func:`build_tiny_setup`.
DATA_SOURCE = "sera_opt_cpu_addition"


def _release_supported(version: str) -> bool:
    """``version`` is one of :data:`SUPPORTED_VERL_VERSIONS` (a local or post suffix allowed,
    so 0.9.1 and 0.9.1.post1 pass but 0.9.10 does not)."""
    return any(
        version == release or version[len(release):len(release) + 1] in (".", "+")
        and version.startswith(release)
        for release in SUPPORTED_VERL_VERSIONS
    )


def _check_verl_version() -> None:
    version = str(getattr(verl, "__version__", "unknown"))
    # _common.check_version matches release prefixes ("0.9." for the adapter); this module
    # answers lines of one release, so a prefix that is not followed by "." or "+" is
    # another release (0.9.10 is not 0.9.1).
    _common.check_version(
        "verl",
        version if _release_supported(version) else f"release {version}",
        SUPPORTED_VERL_VERSIONS,
        adapter="sera_opt.integrations.verl_cpu",
        reason=(
            "Its CPU platform, engine registration, process-group patch and rollout answer "
            "specific lines of that release (named in the module's comments)."
        ),
        stacklevel=3,
    )


# --------------------------------------------------------------------------- 1. platform


class _CPUDevice(types.ModuleType):
    """``torch.cpu`` with the ``torch.cuda``-like functions verl calls on a device module.

    verl calls ``get_torch_device().empty_cache()`` and ``.synchronize()`` throughout,
    ``max_memory_allocated`` / ``max_memory_reserved`` when it logs a step
    (``workers/engine_workers.py`` 219-220), ``mem_get_info`` when it logs memory
    (``utils/memory_utils.py``) and ``get_device_name`` when it estimates FLOPs for a
    device module that is not ``torch.cpu`` itself (``utils/flops_counter.py`` 80).
    On CPU there is no cache to empty and no device memory to report.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


#: The device module of :class:`PlatformCPU` (``get_torch_device()`` on CPU).
cpu_device = _CPUDevice("sera_opt.integrations.verl_cpu.cpu_device")


class PlatformCPU(PlatformBase):
    """verl's platform interface for the CPU (``VERL_PLATFORM=cpu``).

    Registered under :data:`PLATFORM_NAME`. It never claims a machine by itself
    (``is_platform_available`` is False), so importing this module leaves verl's
    detection of a GPU machine as it was; only ``VERL_PLATFORM=cpu`` selects it.

    verl 0.9.1's ``plugin/platform/platform_manager.py`` (``_detect_platform_name``)
    falls back to "nvidia" when nothing is detected, so without this class every
    process believes it drives a CUDA device.
    """

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return cpu_device

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False

    def current_device(self) -> str:
        # verl moves tensors with `.to(get_device_id())` and builds
        # `torch.device(get_device_id())` (workers/engine/fsdp/transformer_impl.py 1028,
        # 1052; utils/fsdp_utils.py); an integer would mean a CUDA device there.
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets this one for actors holding (logical) GPUs; nothing on CPU reads it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's resource pools put one of this resource in every rank's bundle
        # (single_controller/ray/base.py 146-148); the local Ray is started with that
        # many logical GPUs (barrier 5), so "GPU" is what can be granted.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register_platform() -> type[PlatformBase]:
    """Register :class:`PlatformCPU` as ``"cpu"`` with verl's ``PlatformRegistry`` (idempotent)."""
    existing = PlatformRegistry.get(PLATFORM_NAME)
    if existing is not None and existing.__qualname__ == PlatformCPU.__qualname__:
        return existing
    return PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


@contextmanager
def cpu_platform() -> Iterator[PlatformBase]:
    """Make this process's verl platform the CPU one for the block, then restore it.

    The launching process may have resolved verl's platform before (to "nvidia",
    verl's fallback); verl's ``auto_set_device`` and config checks read it.
    """
    from verl.plugin.platform import platform_manager

    previous = platform_manager._current_platform
    platform_manager.set_platform(PlatformCPU())
    try:
        yield platform_manager.get_platform()
    finally:
        platform_manager._current_platform = previous


# --------------------------------------------------------------------------- 2. engines


def register_engines() -> None:
    """Register verl's FSDP engines for the "cpu" device (idempotent).

    verl 0.9.1 registers ``FSDPEngineWithLMHead`` and ``FSDPEngineWithValueHead`` for
    ``device=["cuda", "npu"]`` only (``workers/engine/fsdp/transformer_impl.py`` 1143,
    1594), and ``EngineRegistry.get_engine_cls`` raises for any other device
    (``workers/engine/base.py`` 399). The same classes serve the CPU: FSDP2 runs on a
    gloo process group.
    """
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import (
        FSDPEngineWithLMHead,
        FSDPEngineWithValueHead,
    )

    for model_type, engine in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            table = EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {})
            if PLATFORM_NAME not in table:
                EngineRegistry.register(model_type=model_type, backend=backend,
                                        device=PLATFORM_NAME)(engine)


# --------------------------------------------------------------------------- 3. process group


def _gloo_process_group(timeout_second=None, backend=None):
    """verl's ``initialize_global_process_group_ray`` with a backend torch accepts on CPU.

    verl 0.9.1 builds ``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"``
    (``utils/distributed.py`` 89), which for the "cpu" device is
    ``"cpu:gloo,cpu:gloo"``; torch refuses a device named twice. On CPU the one
    backend is gloo.
    """
    from verl.utils import distributed

    if backend is None:
        from verl.utils.device import get_device_name

        if get_device_name() == PLATFORM_NAME:
            backend = "gloo"
    return distributed.initialize_global_process_group_ray(
        timeout_second=timeout_second, backend=backend
    )


_gloo_process_group.sera_opt_verl_cpu = True


def _patch_process_group() -> None:
    # workers/engine_workers.py 38 imports the function by name and calls it at 89, so
    # the name inside engine_workers is the one to replace.
    from verl.workers import engine_workers

    if not getattr(engine_workers.initialize_global_process_group_ray, "sera_opt_verl_cpu", False):
        engine_workers.initialize_global_process_group_ray = _gloo_process_group


# --------------------------------------------------------------------------- 5, 6. resources

#: Seconds an actor or placement group of a run may wait for Ray to start it before
#: the run fails with a message naming what it waits for (:class:`_Watchdog`).
HANG_TIMEOUT_ENV = "SERA_OPT_VERL_HANG_TIMEOUT"
_DEFAULT_HANG_TIMEOUT = 120.0


def _hang_timeout(value: float | None) -> float:
    if value is None:
        value = os.environ.get(HANG_TIMEOUT_ENV) or _DEFAULT_HANG_TIMEOUT
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise SeraOptError(f"{HANG_TIMEOUT_ENV} must be a number of seconds, got {value!r}.") from exc
    if not value > 0:
        raise SeraOptError(f"the hang timeout must be positive, got {value!r} seconds.")
    return value


class _Launcher:
    """Stands in for the task runner class given to verl's ``run_ppo``, keeping the handle.

    ``run_ppo`` calls ``task_runner_class.remote()`` (``trainer/main_ppo.py`` 92) and
    waits on the runner; the handle lets :class:`_Watchdog` end a run that hangs.
    """

    def __init__(self, actor_class):
        self.actor_class = actor_class
        self.handle = None

    def options(self, **options):
        launcher = _Launcher(self.actor_class.options(**options))
        launcher.remote = self._remember(launcher.actor_class.remote)
        return launcher

    def _remember(self, start):
        def remote(*args, **kwargs):
            self.handle = start(*args, **kwargs)
            return self.handle

        return remote

    def remote(self, *args, **kwargs):
        self.handle = self.actor_class.remote(*args, **kwargs)
        return self.handle


class _Watchdog:
    """Ends a run whose actors or placement groups Ray cannot start, naming them.

    Ray waits for resources without a word: verl's placement groups wait with
    ``ray.get([pg.ready() ...])`` and no timeout (``single_controller/ray/base.py``
    158), TransferQueue's storage units and controller ask for one CPU each, and a
    logical resource too few leaves the run hanging forever (barriers 5 and 6). The
    watchdog polls Ray's actor and placement-group tables; whatever stays pending
    longer than the timeout ends the run with an error that names it, the resources
    it asks for and those the cluster has free.
    """

    def __init__(self, launcher: _Launcher, timeout: float, poll: float = 0.5):
        import threading

        self.launcher = launcher
        self.timeout = timeout
        self.poll = poll
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sera-verl-watchdog",
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join(timeout=10)
        return False

    def _watch(self) -> None:
        pending: dict[str, float] = {}
        while not self._stop.wait(self.poll):
            if not ray.is_initialized():
                continue
            try:
                message = self._check(pending)
            except Exception:  # the cluster is going down with the run
                continue
            if message is not None:
                self.message = message
                if self.launcher.handle is not None:
                    with contextlib.suppress(Exception):
                        ray.kill(self.launcher.handle, no_restart=True)
                return

    def _check(self, pending: dict[str, float]) -> str | None:
        from ray._private import state

        now = time.monotonic()
        free = ray.available_resources()
        waiting = {}
        # An actor's table entry does not say what it asks for; verl's and
        # TransferQueue's actors ask for a CPU each. One pending while a CPU is free is
        # still starting (a process importing torch on a busy machine), not starved.
        starved = free.get("CPU", 0.0) < 1.0
        for actor_id, actor in state.actors().items():
            if starved and actor.get("State") == "PENDING_CREATION":
                name = actor.get("Name") or ""
                label = f"actor {actor.get('ActorClassName')}" + (f" ({name})" if name else "")
                waiting[actor_id] = label
        for group_id, group in ray.util.placement_group_table().items():
            if group.get("state") == "PENDING":
                bundles = list(group.get("bundles", {}).values())
                need: dict[str, float] = {}
                for bundle in bundles:
                    for resource, amount in bundle.items():
                        need[resource] = need.get(resource, 0.0) + float(amount)
                if all(free.get(resource, 0.0) >= amount for resource, amount in need.items()):
                    continue  # Ray has what it asks for and is placing it
                wants = ", ".join(f"{amount:g} {resource}" for resource, amount in need.items())
                waiting[group_id] = (
                    f"placement group {group.get('name') or group_id} ({len(bundles)} bundles, "
                    f"{wants} in all)"
                )
        for key in list(pending):
            if key not in waiting:
                del pending[key]
        for key, label in waiting.items():
            first = pending.setdefault(key, now)
            if now - first > self.timeout:
                total = ray.cluster_resources()
                have = ", ".join(
                    f"{free.get(resource, 0.0):g} of {total.get(resource, 0.0):g} {resource}"
                    for resource in ("CPU", "GPU")
                )
                return (
                    f"Ray has not started verl's {label} in {self.timeout:g} s; the cluster has "
                    f"{have} free. Ray waits for resources without an error, so the run was "
                    f"stopped. On CPU, start Ray with enough logical resources "
                    f"(ray_kwargs.ray_init.num_cpus, +ray_kwargs.ray_init.num_gpus=<ranks>; "
                    f"sera_opt.integrations.verl_cpu.cpu_overrides sets both) and keep "
                    f"transfer_queue.backend.SimpleStorage.num_data_storage_units=1; "
                    f"{HANG_TIMEOUT_ENV} sets the timeout."
                )
        return None


# --------------------------------------------------------------------------- 7. rollout


class HFRolloutServer:
    """The rollout server of one replica: a transformers model behind verl's server API.

    A Ray actor (verl's rollout servers are actors, not HTTP servers: the agent loop
    calls ``generate`` on the handle the replica gives it). It samples token by token
    from its own copy of the model, whose weights the hybrid worker's
    :class:`HFServerAdapter` replaces after every update.

    Parameters
    ----------
    config : RolloutConfig
        ``actor_rollout_ref.rollout``; ``response_length`` bounds each response
        (verl's ``sampling_params`` carry no ``max_tokens``).
    model_config : HFModelConfig
        ``actor_rollout_ref.model``: the model is loaded from its ``local_path``.
    replica_rank : int
    """

    def __init__(self, config, model_config, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM
        from verl.utils.config import omega_conf_to_dataclass

        self.config = omega_conf_to_dataclass(config)
        self.model_config = model_config
        self.replica_rank = replica_rank
        path = getattr(model_config, "local_path", None) or model_config.path
        self.model = AutoModelForCausalLM.from_pretrained(
            path, torch_dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.eval()
        generation = getattr(self.model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None) or self.model.config.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}
        self.global_steps = None
        self.weight_version = 0
        self.generator = torch.Generator().manual_seed(int(self.config.seed) + replica_rank)
        self.lock = asyncio.Lock()
        self.requests = 0
        self.failures: list[str] = []

    async def _generate(self, prompt_ids, sampling_params, request_id, image_data=None,
                        video_data=None, **kwargs):
        if image_data is not None or video_data is not None:
            raise SeraOptError("the CPU rollout generates from text prompts only.")
        _check_sampling_params(sampling_params)
        temperature = float(sampling_params.get("temperature", self.config.temperature) or 0.0)
        top_k = int(sampling_params.get("top_k", -1) or -1)
        limit = int(sampling_params.get("max_tokens") or self.config.response_length)
        if self.config.max_model_len:
            room = int(self.config.max_model_len) - len(prompt_ids)
            if room < 1:
                raise SeraOptError(
                    f"a prompt of {len(prompt_ids)} tokens leaves no room to generate within "
                    f"actor_rollout_ref.rollout.max_model_len={self.config.max_model_len}; raise "
                    "it to at least data.max_prompt_length + data.max_response_length."
                )
            limit = min(limit, room)
        async with self.lock:  # one sequence at a time: the model is small, the cores few
            self.requests += 1
            tokens, log_probs, stop = self._sample(list(prompt_ids), limit, temperature, top_k)
        return self._output(tokens, log_probs, stop)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any],
                       request_id: str, image_data: Any = None, video_data: Any = None,
                       **kwargs: Any):
        """verl's token-in-token-out generation (``workers/rollout/llm_server.py`` 150).

        verl's agent loop logs a failed session in its own worker and the trainer then
        reports only that a group had no trajectories; the server therefore keeps the
        traceback of every failure (:meth:`errors`), which :func:`run` raises with.

        Returns
        -------
        verl.workers.rollout.replica.TokenOutput
            The response tokens, their log-probabilities under the sampling
            distribution (after temperature), and ``stop_reason`` "completed" (an
            end-of-sequence token) or "length".
        """
        try:
            return await self._generate(prompt_ids, sampling_params, request_id, image_data,
                                        video_data, **kwargs)
        except Exception:
            import traceback

            if len(self.failures) < 8:
                self.failures.append(traceback.format_exc())
            raise

    async def errors(self) -> list[str]:
        """The tracebacks of the failed ``generate`` calls (the first 8)."""
        return list(self.failures)

    def _output(self, tokens, log_probs, stop):
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason=stop,
            extra_fields={"global_steps": self.global_steps},
        )

    @torch.no_grad()
    def _sample(self, prompt_ids, limit, temperature, top_k):
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        tokens, log_probs = [], []
        past = None
        step_input = ids
        for _ in range(max(limit, 0)):
            output = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
            past = output.past_key_values
            logits = output.logits[0, -1].float()
            if temperature > 0:
                logits = logits / temperature
                if top_k > 0:
                    kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                distribution = torch.log_softmax(logits, dim=-1)
                token = int(torch.multinomial(distribution.exp(), 1, generator=self.generator))
            else:
                distribution = torch.log_softmax(logits, dim=-1)
                token = int(torch.argmax(distribution))
            tokens.append(token)
            log_probs.append(float(distribution[token]))
            if token in self.eos_token_ids:
                return tokens, log_probs, "completed"
            step_input = torch.tensor([[token]], dtype=torch.long)
        return tokens, log_probs, "length"

    async def update_weights(self, weights: dict[str, torch.Tensor],
                             global_steps: int | None = None) -> int:
        """Load the trained weights (HF names) into the server's model; returns the count."""
        state = self.model.state_dict()
        unknown = sorted(set(weights) - set(state))
        if unknown:
            raise SeraOptError(
                f"the CPU rollout received weights its model does not have: {unknown[:5]}; the "
                "actor and the rollout must load the same model (actor_rollout_ref.model.path)."
            )
        async with self.lock:
            with torch.no_grad():
                for name, tensor in weights.items():
                    state[name].copy_(tensor.to(state[name].dtype))
            self.weight_version += 1
            if global_steps is not None:
                self.global_steps = global_steps
        return len(weights)

    async def get_state(self) -> dict[str, Any]:
        """What the server has done: requests served, weight updates, the step it serves."""
        return {
            "requests": self.requests,
            "weight_version": self.weight_version,
            "global_steps": self.global_steps,
        }

    # The control methods verl's replica and checkpoint manager call
    # (workers/rollout/replica.py 265-310). There is no KV cache kept between requests
    # and no device memory to free, so they have nothing to do.

    async def wake_up(self, tags: list[str] | None = None):
        return None

    async def sleep(self):
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True,
                                 reject_request: bool = False) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True):
        return {"aborted": False, "request_id": request_id}

    async def resume_generation(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def wait_for_requests_to_drain(self):
        async with self.lock:
            return None


def _check_sampling_params(sampling_params: dict[str, Any]) -> None:
    """Refuse sampling options the CPU rollout does not implement, instead of ignoring them."""
    top_p = float(sampling_params.get("top_p", 1.0) if sampling_params.get("top_p") is not None
                  else 1.0)
    penalty = sampling_params.get("repetition_penalty")
    if top_p < 1.0:
        raise SeraOptError(
            f"the CPU rollout samples with temperature and top_k only, not top_p={top_p:g}; set "
            "actor_rollout_ref.rollout.top_p=1 (and val_kwargs.top_p=1)."
        )
    if penalty is not None and float(penalty) != 1.0:
        raise SeraOptError(
            f"the CPU rollout has no repetition penalty (got {penalty}); leave "
            "repetition_penalty at 1.0."
        )


def _server_name(replica_rank: int) -> str:
    return f"sera_opt_hf_server_{replica_rank}"


def _replica_class():
    from verl.workers.rollout.replica import RolloutReplica

    class HFRolloutReplica(RolloutReplica):
        """verl's rollout replica for :class:`HFRolloutServer` (registered as ``"hf"``).

        In verl's hybrid mode the replica's workers are the trainer's own ranks; the
        server is one more Ray actor, named so that the rank's
        :class:`HFServerAdapter` finds it.
        """

        def rollout_worker_use_gpu(self) -> bool:
            return False

        async def launch_servers(self):
            server_class = ray.remote(HFRolloutServer)
            server = server_class.options(
                name=_server_name(self.replica_rank),
                num_cpus=0,  # a scheduling token would only shrink what verl's pools get
                max_concurrency=self.max_concurrency,
            ).remote(
                config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
            )
            await server.get_state.remote()  # surfaces a failed start here, with its traceback
            self.servers = [server]
            self._server_handle = server
            self._server_address = _server_name(self.replica_rank)

    HFRolloutReplica.__module__ = __name__
    return HFRolloutReplica


def _load_replica():
    return HFRolloutReplica


def _adapter_class():
    from verl.workers.rollout.base import BaseRollout

    class HFServerAdapter(BaseRollout):
        """The rollout inside verl's hybrid worker: hands the trained weights to the server.

        verl's naive checkpoint engine (``trainer/ppo/v1/trainer_base.py`` 382 forces
        it for the V1 trainer) calls ``update_weights`` with ``(name, tensor)`` pairs
        on every rank (``workers/engine_workers.py`` 804). Gathering FSDP's full
        tensors is collective, so every rank consumes the pairs; the first rank of
        each replica sends them to its server.
        """

        def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
            super().__init__(config, model_config, device_mesh)
            rank = int(os.environ.get("RANK", "0"))
            world = (
                self.config.tensor_model_parallel_size
                * self.config.data_parallel_size
                * self.config.pipeline_model_parallel_size
            )
            self.replica_rank = rank // world if replica_rank == -1 else replica_rank
            self.has_server = rank % world == 0
            self.server = None

        def _server(self):
            if self.server is None:
                self.server = ray.get_actor(_server_name(self.replica_rank))
            return self.server

        async def resume(self, tags: list[str]):
            return None

        async def release(self):
            return None

        async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
            if wire_format != "named_tensors":
                raise SeraOptError(
                    f"the CPU rollout takes full named tensors, not {wire_format!r}; use the "
                    "naive checkpoint engine (verl's V1 synchronous trainer does)."
                )
            state = {}
            for name, tensor in weights:
                if self.has_server:
                    tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
                    state[name] = tensor.detach().to("cpu", copy=True)
            if self.has_server:
                await self._server().update_weights.remote(state, kwargs.get("global_steps"))

    HFServerAdapter.__module__ = __name__
    return HFServerAdapter


def register_rollout() -> None:
    """Register the ``"hf"`` rollout in verl's two rollout registries (idempotent).

    ``workers/rollout/replica.py``'s ``RolloutReplicaRegistry.register(name, loader)``
    gives the trainer the replica that launches the server, and
    ``workers/rollout/base.py``'s ``_ROLLOUT_REGISTRY`` gives the hybrid worker its
    adapter by module path (``workers/engine_workers.py`` 667). verl's own
    ``hf_rollout.py`` is in neither and cannot be built (its line 39).
    """
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"


# --------------------------------------------------------------------------- apply


def apply() -> None:
    """Register everything verl needs to run on CPU in this process (idempotent).

    Importing this module calls it; verl's ``VERL_USE_EXTERNAL_MODULES`` hook imports
    the module in every Ray process of a run started by :func:`run`.
    """
    register_platform()
    register_engines()
    _patch_process_group()
    register_rollout()


# --------------------------------------------------------------------------- tiny setup

#: Characters of the tokenizer of :func:`build_tiny_model`, after its special tokens.
CHARACTERS = "0123456789+= "
_SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
)


def build_tiny_model(folder: str | os.PathLike, *, seed: int = 0, hidden_size: int = 32,
                     num_layers: int = 2) -> str:
    """Write a tiny Llama and a character tokenizer to ``folder`` (nothing is downloaded).

    The tokenizer knows :data:`CHARACTERS`, one token each, and a chat template that
    joins the messages' contents. A Llama config, not qwen2: verl picks its token
    builder by model type, and qwen2's needs chat tokens such as ``<|im_end|>``
    (``utils/tokenizer/continuous_token.py`` 558).

    Returns
    -------
    str
        The folder, for ``actor_rollout_ref.model.path``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    vocab = {token: index for index, token in enumerate(_SPECIAL + tuple(CHARACTERS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return folder


def _addition_rows(count: int, seed: int) -> list[dict[str, Any]]:
    import random

    generator = random.Random(seed)
    rows = []
    for index in range(count):
        a, b = generator.randrange(10), generator.randrange(10)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": index},
            }
        )
    return rows


def build_tiny_setup(folder: str | os.PathLike, *, num_prompts: int = 4, seed: int = 0) -> str:
    """Write a tiny model (:func:`build_tiny_model`) and a digit-addition data set.

    ``<folder>/model`` holds the model and tokenizer; ``<folder>/train.parquet`` and
    ``<folder>/val.parquet`` hold ``num_prompts`` prompts ``"a+b="`` with the sum as
    ground truth and a distinct ``extra_info.index`` each, scored by
    :func:`compute_score`.

    Returns
    -------
    str
        ``folder``, for :func:`cpu_overrides`.
    """
    import pandas as pd

    folder = os.fspath(folder)
    build_tiny_model(os.path.join(folder, "model"), seed=seed)
    frame = pd.DataFrame(_addition_rows(num_prompts, seed))
    frame.to_parquet(os.path.join(folder, "train.parquet"))
    frame.to_parquet(os.path.join(folder, "val.parquet"))
    return folder


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None, **kwargs: Any) -> float:
    """1.0 when the response contains the last digit of the sum, else 0.0.

    verl's custom reward signature. A lenient rule, so that an untrained tiny model
    succeeds on some prompts and rollouts and not on others, and the outcomes of a
    few steps already differ between prompts.
    """
    return 1.0 if str(ground_truth)[-1:] in str(solution_str) else 0.0


def cpu_overrides(folder: str | os.PathLike, *, ranks: int = 1, mode: str = "sync",
                  rollout_n: int = 4, batch_size: int = 4, response_length: int = 8,
                  steps: int = 2) -> list[str]:
    """verl Hydra overrides for a CPU run on the setup of :func:`build_tiny_setup`.

    The barriers these answer are named in :mod:`sera_opt.integrations.verl_cpu`; the
    rest makes the run small (a batch of ``batch_size`` prompts, ``rollout_n``
    rollouts each, ``response_length`` tokens, ``steps`` steps, no validation).

    Parameters
    ----------
    folder : path
        The folder :func:`build_tiny_setup` wrote.
    ranks : int
        FSDP ranks (each a Ray actor with one logical GPU).
    mode : str
        ``trainer.v1.trainer_mode`` (``sync``, or ``sera_sync``).
    """
    folder = os.path.abspath(os.fspath(folder))
    model = os.path.join(folder, "model")
    return [
        "trainer.use_v1=true",
        "algorithm.adv_estimator=grpo",
        f"trainer.v1.trainer_mode={mode}",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={ranks}",
        "trainer.nnodes=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000",
        f"trainer.default_local_dir={os.path.join(folder, 'checkpoints')}",
        "trainer.project_name=sera_opt_cpu",
        "trainer.experiment_name=tiny",
        f"data.train_files={os.path.join(folder, 'train.parquet')}",
        f"data.val_files={os.path.join(folder, 'val.parquet')}",
        f"data.train_batch_size={batch_size}",
        "data.max_prompt_length=16",
        f"data.max_response_length={response_length}",
        "data.shuffle=false",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}",
        # Barrier 9: no flash attention or remove-padding kernels on CPU.
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        # Barrier 7: the transformers rollout of this module.
        f"actor_rollout_ref.rollout.name={ROLLOUT_NAME}",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={rollout_n}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        "actor_rollout_ref.rollout.prompt_length=16",
        "actor_rollout_ref.rollout.max_model_len=64",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={os.path.abspath(__file__)}",
        "reward.custom_reward_function.name=compute_score",
        # Barrier 6: one storage unit, so TransferQueue's actors fit the logical CPUs.
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        # Barrier 5: logical GPUs and CPUs for verl's placement groups and actors.
        f"ray_kwargs.ray_init.num_cpus={ray_cpus(ranks)}",
        f"+ray_kwargs.ray_init.num_gpus={ranks}",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


# --------------------------------------------------------------------------- run


def _runtime_env_overrides(config) -> None:
    """Make every Ray process of the job import this module and select the CPU platform."""
    from omegaconf import OmegaConf, open_dict

    from sera_opt.integrations import _verl_trainer

    key = f"ray_kwargs.ray_init.runtime_env.env_vars.{_verl_trainer.WORKER_MODULES_ENV}"
    given = OmegaConf.select(config, key, default=None) or os.environ.get(
        _verl_trainer.WORKER_MODULES_ENV, ""
    )
    modules = [name.strip() for name in str(given).split(",") if name.strip()]
    for module in (WORKER_MODULE, "sera_opt.integrations.verl"):
        if module not in modules:
            modules.append(module)
    with open_dict(config):
        OmegaConf.update(config, key, ",".join(modules), force_add=True)
        OmegaConf.update(
            config, "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM", PLATFORM_NAME,
            force_add=True,
        )


def compose(overrides: Sequence[str] = ()):
    """verl's ``ppo_trainer`` config with ``overrides``, prepared for a CPU run.

    The same composition as ``python -m verl.trainer.main_ppo`` (checked for the
    ``sera_*`` modes by :func:`sera_opt.integrations._verl_trainer.compose_config`),
    then verl's ``validate_config`` with the CPU platform in place, and the Ray
    runtime environment that makes every process import this module.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from sera_opt.integrations import _verl_trainer

    config = _verl_trainer.compose_config(list(overrides))
    if str(config.trainer.device) != PLATFORM_NAME:
        raise SeraOptError(
            f"sera_opt.integrations.verl_cpu runs on the CPU: set trainer.device=cpu (got "
            f"{config.trainer.device!r}); cpu_overrides() gives the whole CPU configuration."
        )
    if not config.trainer.use_v1:
        raise SeraOptError("the CPU run uses verl's V1 trainer: set trainer.use_v1=true.")
    with cpu_platform():
        validate_config(
            config=config,
            use_reference_policy=need_reference_policy(config),
            use_critic=need_critic(config),
        )
    _runtime_env_overrides(config)
    return config


def run(overrides: Sequence[str] = (), *, record_dir: str | os.PathLike | None = None,
        hang_timeout: float | None = None) -> None:
    """Run a verl training job on CPU: verl's ``run_ppo`` with a CPU task runner.

    Starts a local Ray with the logical resources of the config (unless Ray is
    already running) and shuts it down at the end when it started it.

    Parameters
    ----------
    overrides : sequence of str
        verl's Hydra overrides (:func:`cpu_overrides` gives a complete CPU set).
    record_dir : path, optional
        Write every step's metrics (``metrics.jsonl``: verl's timing, the ``sera/``
        diagnostics) and advantage batch (``step_<n>.pt``: each row's uid key, summed
        reward, response mask and advantages, as verl's trainer holds them) there.
    hang_timeout : float, optional
        Seconds an actor or placement group may wait for Ray to start it before the
        run stops with an error naming it (default: ``SERA_OPT_VERL_HANG_TIMEOUT`` or
        120).

    Raises
    ------
    SeraOptError
        When Ray could not start part of the run within ``hang_timeout``.
    """
    from verl.trainer import main_ppo

    config = compose(overrides)
    if record_dir is not None:
        from omegaconf import OmegaConf, open_dict

        record_dir = os.path.abspath(os.fspath(record_dir))
        os.makedirs(record_dir, exist_ok=True)
        with open_dict(config):
            OmegaConf.update(
                config, f"ray_kwargs.ray_init.runtime_env.env_vars.{RECORD_DIR_ENV}",
                record_dir, force_add=True,
            )
    launcher = _Launcher(_task_runner_class())
    watchdog = _Watchdog(launcher, _hang_timeout(hang_timeout))
    started = not ray.is_initialized()
    try:
        with cpu_platform(), watchdog:
            main_ppo.run_ppo(config, task_runner_class=launcher)
    except Exception as exc:
        if watchdog.message is not None:
            raise SeraOptError(watchdog.message) from exc
        failures = _rollout_failures(config)
        if failures:
            raise SeraOptError(
                f"the rollout failed ({len(failures)} recorded failure(s) of generate; verl "
                f"reported: {type(exc).__name__}). The first, from the rollout server:\n"
                f"{failures[0]}"
            ) from exc
        raise
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


def _rollout_failures(config) -> list[str]:
    """The tracebacks the run's rollout servers kept, while the failed run's actors live."""
    if not ray.is_initialized() or config.actor_rollout_ref.rollout.name != ROLLOUT_NAME:
        return []
    failures: list[str] = []
    ranks = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    for replica_rank in range(ranks):
        try:
            server = ray.get_actor(_server_name(replica_rank))
            failures.extend(ray.get(server.errors.remote(), timeout=30))
        except Exception:  # no such replica, or it died with the run
            continue
    return failures


#: Where the task runner records each step (set by :func:`run`'s ``record_dir``).
RECORD_DIR_ENV = "SERA_OPT_VERL_RECORD_DIR"


def _task_runner_class():
    from sera_opt.integrations import _verl_trainer

    base = _verl_trainer._task_runner_class().__ray_actor_class__

    class CPUTaskRunner(base):
        """verl's V1 task runner with the sera modes, recording steps when asked to."""

        def init_agent_loop_manager(self):
            super().init_agent_loop_manager()
            folder = os.environ.get(RECORD_DIR_ENV)
            if folder:
                _StepRecorder(folder).attach(self.trainer)

    return ray.remote(num_cpus=1)(CPUTaskRunner)


#: The ``sera_timing_s/<name>`` entries :func:`run`'s ``record_dir`` adds to each step:
#: sera_opt's own work inside verl's step (planning the counts, feeding outcomes to the
#: planner, the advantage estimator verl calls).
SERA_TIMERS = ("plan", "observe", "estimator")


class _StepRecorder:
    """Writes each step's advantage batch and metrics from inside verl's trainer.

    Beside verl's metrics, each step's record holds the wall time of sera_opt's own
    work (:data:`SERA_TIMERS`), measured around the trainer's planning and observing
    and an advantage estimator verl looks up in its registry at each call (``sera_maxrl``;
    verl computes stock GRPO's advantages in its own branch, timed only by its ``adv``).
    """

    def __init__(self, folder: str):
        self.folder = folder
        self.timers = dict.fromkeys(SERA_TIMERS, 0.0)

    def _timed(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.timers[name] += time.perf_counter() - start

        return timed

    def attach(self, trainer) -> None:
        from verl.trainer.ppo import core_algos

        for name, method in (("plan", "_sera_plan"), ("observe", "_sera_observe")):
            if hasattr(trainer, method):
                setattr(trainer, method, self._timed(name, getattr(trainer, method)))
        estimator = str(trainer.config.algorithm.adv_estimator)
        if estimator in core_algos.ADV_ESTIMATOR_REGISTRY:  # looked up at every call
            core_algos.ADV_ESTIMATOR_REGISTRY[estimator] = self._timed(
                "estimator", core_algos.ADV_ESTIMATOR_REGISTRY[estimator]
            )
        compute_advantage = trainer._compute_advantage
        recorder = self

        def recorded_compute_advantage(batch, metrics):
            batch = compute_advantage(batch, metrics)
            recorder.record_batch(trainer.global_steps, batch)
            return batch

        trainer._compute_advantage = recorded_compute_advantage
        # verl builds its logger in fit(); wrap the tracking class's log once it exists.
        from verl.utils import tracking

        original_log = tracking.Tracking.log

        def log(tracker, data, step, *args, **kwargs):
            recorder.record_metrics(step, data)
            return original_log(tracker, data, step, *args, **kwargs)

        tracking.Tracking.log = log

    def record_batch(self, step: int, batch) -> None:
        import transfer_queue as tq

        fields = ["uid", "rm_scores", "response_mask", "advantages", "index"]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=fields)
        mask = data["response_mask"]
        index = data["index"] if "index" in data.keys() else None
        if isinstance(index, torch.Tensor):
            index = index.tolist()
        record = {
            # The dataset's extra_info.index of each row's prompt (verl's "index").
            "prompt_ids": None if index is None else [
                value.item() if hasattr(value, "item") else value for value in index
            ],
            "keys": list(batch.keys),
            "uids": list(data["uid"].tolist()) if hasattr(data["uid"], "tolist")
            else list(data["uid"]),
            "scores": torch.stack([row.sum() for row in data["rm_scores"].unbind()]),
            "response_mask": [row.clone() for row in mask.unbind()],
            "advantages": [row.clone() for row in data["advantages"].unbind()],
        }
        torch.save(record, os.path.join(self.folder, f"step_{step}.pt"))

    def record_metrics(self, step: int, data: dict) -> None:
        plain = {f"sera_timing_s/{name}": value for name, value in self.timers.items()}
        self.timers = dict.fromkeys(SERA_TIMERS, 0.0)
        for name, value in data.items():
            with contextlib.suppress(TypeError, ValueError):
                plain[name] = float(value)
        with open(os.path.join(self.folder, "metrics.jsonl"), "a") as handle:
            handle.write(json.dumps({"step": step, "data": plain}) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sera_opt.integrations.verl_cpu FOLDER [overrides]``: a CPU run.

    FOLDER holds a setup of :func:`build_tiny_setup` (written there first when it has
    no ``model`` folder); the run takes :func:`cpu_overrides` of it, then the given
    Hydra overrides (``trainer.v1.trainer_mode=sera_sync``, another model's path, ...).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or "=" in argv[0]:
        raise SeraOptError(
            "usage: python -m sera_opt.integrations.verl_cpu FOLDER [hydra overrides]; FOLDER "
            "gets a tiny model and data set when it has none."
        )
    folder, overrides = argv[0], argv[1:]
    if not os.path.isdir(os.path.join(folder, "model")):
        build_tiny_setup(folder)
    run(cpu_overrides(folder) + overrides)


if __name__ == "__main__":  # pragma: no cover - a command
    from sera_opt.integrations.verl_cpu import main as _main

    _main()
else:
    _check_verl_version()
    # The platform first: importing the rest of verl's trainer code resolves it.
    register_platform()
    from sera_opt.integrations import verl as _sera_verl  # noqa: F401 - estimator, trl fix

    apply()
    HFRolloutReplica = _replica_class()
    HFServerAdapter = _adapter_class()
