"""verl × TRL in one environment, on any device: ``training.verl_compat`` reaches every verl
process (as a verl plugin, and by name from our launch lines), and each launch gets its own
metrics file outside the job directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from training.run import VERL_METRICS
from training.verl_job import launch_env, launch_metrics_file

# What verl's FSDP model build runs (actor and SFT trainer): with TRL 1.16 installed and verl's
# own probe, it imports a TRL class that TRL no longer has.
BUILD = """
import sys
import verl  # loads verl's plugins
from transformers import AutoModelForCausalLM
from verl.models.transformers.monkey_patch import apply_monkey_patch
from verl.utils import import_utils
apply_monkey_patch(AutoModelForCausalLM.from_pretrained(sys.argv[1]))
print("built; probe from", import_utils.is_trl_available.__module__)
"""


@pytest.mark.integration  # processes that import verl and transformers
@pytest.mark.parametrize(
    "env,fixed",
    [
        ({}, True),  # the entry point: `import verl` loads it, GPU runs included
        ({"VERL_USE_EXTERNAL_PLUGINS": "none"}, False),  # verl as shipped: the clash
        (  # plugins off, named by the launch line (our packages on PYTHONPATH only)
            {
                "VERL_USE_EXTERNAL_PLUGINS": "none",
                "VERL_USE_EXTERNAL_MODULES": "training.verl_compat",
            },
            True,
        ),
    ],
    ids=["plugin", "without", "by-name"],
)
def test_a_model_build_survives_trl_without_the_value_head(
    tiny_fp32: Path, env: dict[str, str], fixed: bool
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, str(tiny_fp32)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, **env},
    )
    if fixed:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "built; probe from training.verl_compat" in proc.stdout
    else:
        assert proc.returncode != 0
        assert "cannot import name 'AutoModelForCausalLMWithValueHead'" in proc.stderr


def test_every_launch_names_the_compat_module_and_cpu_adds_its_platform(tmp_path: Path) -> None:
    gpu = launch_env(tmp_path, "cuda", EXTRA="1")
    assert gpu["VERL_USE_EXTERNAL_MODULES"] == "training.verl_compat" and gpu["EXTRA"] == "1"
    assert "VERL_PLATFORM" not in gpu
    assert Path(gpu["PYTHONPATH"], "training", "verl_compat.py").is_file()
    cpu = launch_env(tmp_path, "cpu")
    assert cpu["VERL_USE_EXTERNAL_MODULES"] == "training.verl_compat,training.verl_cpu"
    assert cpu["VERL_PLATFORM"] == "cpu"


def test_launches_in_one_second_get_files_in_launch_order(tmp_path: Path) -> None:
    first = launch_metrics_file(tmp_path)
    first.write_text('{"step": 1, "data": {}}\n')  # what verl's logger does once it starts
    second = launch_metrics_file(tmp_path)
    assert first.parent == second.parent == tmp_path.absolute() / VERL_METRICS
    assert first != second and not second.exists()
    if first.name[:16] == second.name[:16]:  # the same second
        assert sorted([second.name, first.name]) == [first.name, second.name]
