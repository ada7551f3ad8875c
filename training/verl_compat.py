"""What verl 0.9.1 needs to run in this project's environment, on any device.

verl imports this module in every one of its processes, two ways, so that GPU runs get it as
CPU runs do:

* as a verl plugin: ``pyproject.toml`` declares it under the entry-point group
  ``verl.plugins``, which ``import verl`` loads (unless ``VERL_USE_EXTERNAL_PLUGINS=none``);
* by name: every launch line we write exports ``VERL_USE_EXTERNAL_MODULES`` with it first
  (``training.verl_job.launch_env``), for workers that find our packages on ``PYTHONPATH``
  without having them installed.

What it fixes: verl's ``apply_monkey_patch`` (run on every FSDP model build, actor and SFT
trainer alike) imports TRL's ``AutoModelForCausalLMWithValueHead`` whenever TRL is installed, to
patch its ``state_dict``. TRL 1.16 (our TRL backend's pin) has no such class any more, nor
``trl.experimental.ppo``, so every model build fails with ImportError. The probe verl calls
there, ``verl.utils.import_utils.is_trl_available``, becomes one that asks whether the class
exists: where it does not, there is nothing to patch (and verl's value-head critic, the probe's
other user, says TRL is missing instead of failing on the import). The modules that imported
the probe by name before this ran get it too. Importing this module costs nothing (no verl
module is imported that ``import verl`` has not imported), is idempotent and changes nothing
else of verl.
"""

from __future__ import annotations

import functools
import importlib


@functools.cache  # as verl's own probe is
def trl_has_value_head() -> bool:
    """TRL is installed and still has the value-head class verl wants to patch."""
    for where in ("trl.experimental.ppo", "trl"):
        try:
            module = importlib.import_module(where)
        except ImportError:
            continue
        if hasattr(module, "AutoModelForCausalLMWithValueHead"):
            return True
    return False


PROBE_USERS = (
    "verl.utils.import_utils",
    "verl.models.transformers.monkey_patch",
    "verl.utils.model",
)


def apply() -> None:
    """Make ``trl_has_value_head`` verl's ``is_trl_available``, where verl defines it and in
    the modules already imported that took it by name."""
    import sys

    importlib.import_module(PROBE_USERS[0])
    for name in PROBE_USERS:
        if (module := sys.modules.get(name)) is not None:
            module.is_trl_available = trl_has_value_head  # type: ignore[attr-defined]


apply()
