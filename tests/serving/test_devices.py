"""``--device`` (serving) and ``trl.device`` (training) checked against this machine before
anything is loaded: a device torch has no name for, and a GPU asked for where there is none (or
not that many), are refused in one line, never replaced by the CPU."""

from __future__ import annotations

import pytest

from astra_agent.errors import ConfigError
from serving import devices
from tests.conftest import run_module

NO_GPU = "torch sees no CUDA device here (a test double)"


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Make torch see ``n`` CUDA devices (0: none, for the reason ``NO_GPU``)."""

    def see(n: int) -> None:
        monkeypatch.setattr(devices, "_cuda_devices", lambda: (n, None if n else NO_GPU))

    return see


@pytest.mark.parametrize("n", [0, 2])
def test_cpu_and_auto_are_always_accepted(gpus, n: int) -> None:
    gpus(n)
    assert devices.check_device("cpu") == "cpu" and devices.check_device("auto") == "auto"
    assert devices.resolve_device("auto") == ("cuda" if n else "cpu")
    assert devices.resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:1"])
def test_a_gpu_asked_for_where_there_is_none_is_refused(gpus, value: str) -> None:
    gpus(0)
    with pytest.raises(ConfigError) as exc:
        devices.resolve_device(value)
    assert exc.value.message == (
        f"--device {value!r}: a GPU asked for, but {NO_GPU}; accepted here: auto, cpu"
    )
    assert "never replaced by the CPU" in (exc.value.hint or "")
    assert "(--device cpu)" in (exc.value.hint or "")


def test_a_gpu_index_past_the_devices_is_refused(gpus) -> None:
    gpus(2)
    assert devices.check_device("cuda") == "cuda" and devices.check_device("cuda:1") == "cuda:1"
    with pytest.raises(ConfigError) as exc:
        devices.check_device("cuda:2", "trl.device")
    assert exc.value.message == (
        "trl.device 'cuda:2': a GPU asked for, but this machine has 2 CUDA device(s), cuda:0 to "
        "cuda:1; accepted here: auto, cpu, cuda, cuda:0, cuda:1"
    )
    assert "(--set trl.device=cpu)" in (exc.value.hint or "")


@pytest.mark.parametrize("value", ["banana", "", "CUDA", "cuda:", "cuda:-1", "gpu", "mps", "cpu:0"])
def test_a_name_that_is_not_a_device_is_refused(gpus, value: str) -> None:
    gpus(2)
    with pytest.raises(ConfigError) as exc:
        devices.check_device(value)
    assert exc.value.message == (
        f"--device {value!r}: not a device; accepted here: auto, cpu, cuda, cuda:N "
        "(where torch sees a GPU)"
    )


def test_this_machines_own_answer() -> None:
    """Unpatched: what torch says here (a CPU machine in CI)."""
    import torch

    if torch.cuda.is_available():
        assert devices.check_device("cuda:0") == "cuda:0"
        n = torch.cuda.device_count()
        with pytest.raises(ConfigError, match=f"this machine has {n} CUDA device"):
            devices.check_device(f"cuda:{n}")
    else:
        with pytest.raises(ConfigError, match="a GPU asked for, but this torch"):
            devices.check_device("cuda")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("cuda", "error: --device 'cuda': a GPU asked for, but "),
        ("cuda:3", "error: --device 'cuda:3': a GPU asked for, but "),
        ("banana", "error: --device 'banana': not a device; accepted here: auto, cpu, cuda"),
    ],
)
def test_astra_serve_up_refuses_before_loading_anything(tmp_path, value: str, said: str) -> None:
    """As a user runs it, no GPU visible (CUDA_VISIBLE_DEVICES empty, so on a GPU machine too):
    exit 2, the error and its hint, no traceback; the model (a folder that is no checkpoint) is
    not even read, and nothing is started."""
    out = run_module(
        "serving", "up", "--engine", "hf", "--device", value, "--model", str(tmp_path),
        "--port", "1", timeout=120,
        env={"CUDA_VISIBLE_DEVICES": "", "ASTRA_HOME": str(tmp_path / "home"), "COLUMNS": "300"},
    )  # fmt: skip
    err = " ".join(out.stderr.split())
    assert out.returncode == 2, out.stdout + out.stderr
    assert err.startswith(said) and "hint:" in err and "Traceback" not in err, err
    assert not (tmp_path / "home").exists()
