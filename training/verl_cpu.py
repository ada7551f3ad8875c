"""verl 0.9.1's SFT trainer on CPU — for CPU tests and CI only; never load it where GPUs are.

verl ships platforms for nvidia, huawei (npu) and amd only, and registers its FSDP training
engine for devices ``cuda``/``npu``; on a machine without accelerators its SFT trainer falls back
to the nvidia platform and fails (nccl, ``torch.cuda.set_device``, flash-attention). This module
is verl's own extension point for that: ``VERL_USE_EXTERNAL_MODULES=training.verl_cpu`` makes
``verl/__init__.py`` import it in every verl process, and ``VERL_PLATFORM=cpu`` selects what it
registers (:func:`cpu_env` gives both). With the platform selected, importing it

* registers :class:`PlatformCPU` as verl platform ``cpu``: device ``cpu``, ``torch.cpu`` as the
  device module (with the memory calls verl makes answered as zero/no-op), the ``gloo`` process
  group, no-op profiling, no IPC; Ray resource ``CPU`` (only verl's Ray trainers ask for one —
  the torchrun SFT trainer never does; their ``ResourcePoolManager`` counts GPUs only, so they
  would need more than this module);
* registers verl's ``FSDPEngineWithLMHead`` for device ``cpu`` too (verl picks the engine by the
  platform's device name);
* makes two small patches, each one module attribute, where registration cannot help:
  ``verl.utils.distributed.initialize_global_process_group`` (verl asks torch for the backend
  ``cpu:gloo,{device}:{backend}``, i.e. ``cpu:gloo,cpu:gloo``, which torch refuses) and the TRL
  probe of ``verl.models.transformers.monkey_patch`` (verl imports TRL's value-head class, gone
  from TRL 1.16, whenever TRL is installed — not a CPU matter: see :func:`_patch_trl_probe`).

The config changes verl needs on CPU (``trainer.device``, sdpa attention, fp32 compute, no
dataloader workers) are Hydra overrides: :func:`cpu_overrides`.

On a machine where ``torch.cuda.is_available()`` it refuses: selecting it there raises (and
logs) an error instead of quietly running a GPU job on the CPU. Importing it without
``VERL_PLATFORM=cpu`` (e.g. for :func:`cpu_overrides`) registers and patches nothing.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
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
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"


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
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> None:
    """Register the ``cpu`` platform and the FSDP engine for it, and apply the two patches.
    Raises RuntimeError on a machine with CUDA GPUs."""
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
    _patch_trl_probe()


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


def _init_gloo_process_group(timeout_second: int = 36000) -> tuple[int, int, int]:
    """verl's ``initialize_global_process_group`` with the backend ``gloo``."""
    torch.distributed.init_process_group(
        backend="gloo",
        timeout=timedelta(seconds=timeout_second),
        init_method=os.environ.get("DIST_INIT_METHOD"),
    )
    return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _patch_process_group_init() -> None:
    """Patch 1. verl's ``initialize_global_process_group`` asks torch for the backend
    ``cpu:gloo,{device}:{backend}`` = ``cpu:gloo,cpu:gloo``, and torch refuses a device named
    twice; no platform property avoids it. ``run_sft`` imports the function when it runs, so
    replacing the module attribute is enough."""
    import verl.utils.distributed as verl_distributed

    verl_distributed.initialize_global_process_group = _init_gloo_process_group


@functools.cache  # as verl's own probe is
def _trl_has_value_head() -> bool:
    for where in ("trl.experimental.ppo", "trl"):
        try:
            module = importlib.import_module(where)
        except ImportError:
            continue
        if hasattr(module, "AutoModelForCausalLMWithValueHead"):
            return True
    return False


def _patch_trl_probe() -> None:
    """Patch 2. verl's ``apply_monkey_patch`` (run on every FSDP model build) imports TRL's
    ``AutoModelForCausalLMWithValueHead`` whenever TRL is installed, to patch its
    ``state_dict``; TRL 1.16 has no such class any more (nor ``trl.experimental.ppo``), so the
    build fails with ImportError. The probe it calls, ``is_trl_available``, is swapped in that
    module only for one that asks whether the class exists: if not, there is nothing to patch.
    This is a verl 0.9.1 × TRL 1.16 clash, not a CPU one: a GPU run in the same environment
    meets it too."""
    import verl.models.transformers.monkey_patch as verl_monkey_patch

    verl_monkey_patch.is_trl_available = _trl_has_value_head


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM:
    register()
