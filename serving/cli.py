"""``astra-serve``: tiny checkpoints, fp32 → bf16 conversion, GGUF import, the model server,
endpoint checks.

Commands, in the order a user runs them: ``tiny`` (build a tiny checkpoint), ``convert``
(float32 → bf16), ``import-gguf`` (a GGUF file as a checkpoint), ``up`` (serve a checkpoint
with ASTRA's parsers: vLLM, or ``--engine hf`` where vLLM is not installed; ``profiles`` lists
the shipped settings), ``check`` (probe any OpenAI-compatible endpoint), ``demo`` (all of it,
then ``astra-agent run``). Each command parses flags and shows progress; the work is in the
module the :mod:`serving` package docstring names for it.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import deque
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from astra_agent.config import astra_home, check_writable, deep_merge, load_config
from astra_agent.console import cli_errors, console, err_console
from astra_agent.errors import ServerError
from astra_agent.model import ModelConfig
from astra_agent.options import (
    ApiKeyOpt,
    BaseUrlOpt,
    ModelOpt,
    common_callback,
    config_flags,
    model_overrides,
)
from serving.server import ServeConfig

if TYPE_CHECKING:
    from serving.server import ModelServer

app = typer.Typer(
    name="astra-serve",
    help="Serve ASTRA checkpoints through vLLM's OpenAI-compatible API.\n\n"
    "Example: astra-serve convert ./ASTRA-14B-fp32 ./ASTRA-14B-bf16 && "
    "astra-serve up --model ./ASTRA-14B-bf16 --profile astra-14b",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


common_callback(app, "astra-serve")


@app.command()
@cli_errors
def tiny(
    out: Annotated[Path, typer.Argument(help="Directory to create.")],
    seed: Annotated[int, typer.Option(help="Seed: same seed, same checkpoint.")] = 0,
    random_weights: Annotated[
        bool, typer.Option("--random", help="Plain random weights instead of the scripted ones.")
    ] = False,
    layout: Annotated[str, typer.Option(help="'hf' (as verl's merger writes) or 'verl'.")] = "hf",
    tool_name: Annotated[str, typer.Option(help="Tool the scripted model calls.")] = (
        "get_current_time"
    ),
    arguments: Annotated[str, typer.Option(help="JSON arguments of that call.")] = (
        '{"timezone": "UTC"}'
    ),
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
) -> None:
    """Build a tiny float32 Qwen3 checkpoint locally (no download).

    The default, scripted one answers every prompt with <think>…</think> and a <tool_call>,
    and after a tool response with a short answer, so tool-call and reasoning parsing can be
    tested end to end. Example: astra-serve tiny ./tiny-fp32 && astra-serve convert ./tiny-fp32
    ./tiny-bf16
    """
    from serving.tiny import Script, TinySpec, build_tiny_checkpoint

    check_writable(out, "OUT", kind="dir")
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"--arguments is not JSON: {exc}") from None
    spec = TinySpec(
        seed=seed,
        behavior="random" if random_weights else "scripted",
        script=Script(tool_name=tool_name, arguments=args),
    )
    path = build_tiny_checkpoint(out, spec, layout=layout, overwrite=overwrite)
    console.print(f"tiny {spec.behavior} checkpoint (float32, {layout} layout) written to {path}")


@app.command()
@cli_errors
def convert(
    src: Annotated[Path, typer.Argument(help="float32 checkpoint: HF dir or verl global_step_N")],
    dst: Annotated[Path, typer.Argument(help="Output directory (must not exist).")],
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16.")] = "bfloat16",
    max_shard_size: Annotated[str, typer.Option(help="Largest output shard.")] = "5GB",
    overwrite: Annotated[bool, typer.Option(help="Replace DST if it exists.")] = False,
) -> None:
    """Convert a float32 checkpoint to bf16 safetensors, streaming, atomically, verified.

    SRC is a Hugging Face directory (sharded safetensors or pytorch_model*.bin) or a verl FSDP
    checkpoint (global_step_N/actor, or its parent: merged with verl's own model merger first).
    Memory stays at one 64 MiB chunk whatever the model size.

    Example: astra-serve convert ./ASTRA-14B-Thinking-v1 ./ASTRA-14B-Thinking-v1-bf16
    """
    from serving.convert import convert_checkpoint

    with Progress(
        TextColumn("[bold]converting"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[what]}"),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("convert", total=None, what="")

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, what=what[-48:])

        result = convert_checkpoint(
            src,
            dst,
            dtype=dtype,
            max_shard_size=max_shard_size,
            overwrite=overwrite,
            progress=progress,
        )
    console.print(
        f"wrote {result.dst}: {result.tensors} tensors in {result.shards} shard(s), "
        f"{result.bytes_written / 1e9:.2f} GB {dtype} (from {result.source_kind}), verified"
    )


@app.command("import-gguf")
@cli_errors
def import_gguf(
    src: Annotated[
        str, typer.Argument(help="A .gguf file, or `smollm2` (the model set-up unpacked).")
    ],
    dst: Annotated[Path, typer.Argument(help="Output directory (must not exist).")],
    dtype: Annotated[str, typer.Option(help="bfloat16 or float32.")] = "bfloat16",
    chat_template: Annotated[
        str,
        typer.Option(
            help="auto (the model's own if it renders tools, else the harness's), harness, own."
        ),
    ] = "auto",
    max_shard_size: Annotated[str, typer.Option(help="Largest output shard.")] = "5GB",
    overwrite: Annotated[bool, typer.Option(help="Replace DST if it exists.")] = False,
) -> None:
    """Turn a GGUF checkpoint into a Hugging Face directory every command takes, verified.

    Dequantizes the weights (llama, qwen2, qwen3, mistral … as transformers reads them), sets
    the end of a turn (<|im_end|>) as eos in the tokenizer, config and generation config, and
    gives a model whose template cannot render tools the harness's. Serve a model that does
    not think with --profile instruct-cpu.

    Example: astra-serve import-gguf smollm2 ./smollm2 && astra-serve up --model ./smollm2
    --profile instruct-cpu
    """
    from serving.gguf import import_gguf as run_import

    with err_console.status("importing") as status:
        result = run_import(
            src,
            dst,
            dtype=dtype,
            chat_template=chat_template,
            max_shard_size=max_shard_size,
            overwrite=overwrite,
            progress=lambda what: status.update(what),
        )
    info = result.info
    console.print(
        f"wrote {result.dst}: {info.name} ({info.architecture}, {info.parameters / 1e6:.1f} M "
        f"parameters), {result.bytes_written / 1e9:.2f} GB {result.dtype}, eos "
        f"{result.eos_token}, {result.template} chat template, verified",
        highlight=False,
    )


class StopRequested(KeyboardInterrupt):
    """A signal asked `astra-serve up` to stop (a stop asked for: exit 0)."""


def _stop_on_signals(server: ModelServer) -> None:
    """SIGINT and SIGTERM both stop the server. Installed explicitly, since a shell starts a
    background job (`astra-serve up &`) with SIGINT ignored. SIGHUP (the terminal closed) stops
    it too, unless ignored (`nohup`): vLLM runs in its own session and would not get it. The
    first signal unwinds `up`; a later one, during the stop, skips vLLM's grace period."""
    asked: list[str] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        if asked:
            server.stop_now.set()
            return
        asked.append(signal.Signals(signum).name)
        raise StopRequested(asked[0])

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, handler)


def _start_showing_log(server: ModelServer) -> str:
    """Start vLLM, showing its log as it starts: a live tail of the last lines on a terminal,
    every line (prefixed) otherwise."""
    if not err_console.is_terminal:
        return server.start(lambda line: err_console.print(f"vllm| {line}", markup=False))
    lines: deque[str] = deque(maxlen=8)
    spinner = Spinner("dots", text=f"starting vLLM (log: {server.log_file})")

    def view() -> Group:
        return Group(
            spinner,
            *(Text(f"  {ln}", style="dim", no_wrap=True, overflow="ellipsis") for ln in lines),
        )

    with Live(view(), console=err_console, transient=True, refresh_per_second=8) as live:

        def on_log(line: str) -> None:
            lines.append(line)
            live.update(view())

        return server.start(on_log)


def _serve_config(model: Path | None, profile: str | None, config: Path | None, **flags: Any):
    from serving.server import load_serve_config

    if profile is None and config is None:
        profile = "tiny-cpu"
    return load_serve_config(profile, config, model=model, **flags)


@app.command()
@cli_errors
@config_flags(
    ServeConfig,
    (
        "engine",
        "device",
        "host",
        "port",
        "served_model_name",
        "max_model_len",
        "dtype",
        "startup_timeout_s",
        "trust_request_chat_template",
    ),
    flags={"startup_timeout_s": "startup_timeout"},
)
def up(
    model: Annotated[
        Path | None, typer.Option("--model", "-m", help="Converted (bf16) checkpoint dir.")
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="tiny-cpu (default), astra-14b or astra-32b.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="A YAML/JSON serve config.")] = None,
    tensor_parallel_size: Annotated[str | None, typer.Option(help="N or auto.")] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", "-k", help="Required off loopback. Env: ASTRA_SERVE_API_KEY."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Print the vLLM command line (with its environment) and exit.")
    ] = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """Serve a checkpoint with vLLM (tool calls and reasoning parsed) until Ctrl-C or SIGTERM.

    The profile (or --config), ASTRA_SERVE_* variables, --set and the flags, in that order (a
    default shown applies where the profile sets nothing). Stops vLLM's whole process tree on
    SIGINT or SIGTERM and exits 0. Example:
    astra-serve up --model ./ASTRA-14B-bf16 --profile astra-14b --port 8000

    Where vLLM is not installed, --engine hf serves the same API from transformers (loopback,
    slower): astra-serve up --model DIR --profile instruct-cpu --engine hf --device cuda
    """
    from serving.devices import check_device
    from serving.server import ModelServer

    flags = {"tensor_parallel_size": tensor_parallel_size, "api_key": api_key}
    cfg = _serve_config(model, profile, config, **deep_merge(overrides, flags))
    check_device(cfg.device)  # a GPU absent or a device torch has no name for: before loading
    server = ModelServer(cfg)
    if dry_run:
        line = server.shell_command()
        for warning in server.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(warning)}")
        sys.stdout.write(line + "\n")
        return
    _serve(server)


def _serve(server: ModelServer) -> None:
    _stop_on_signals(server)
    try:
        server.preflight()  # its errors and warnings before the start-up display
        for warning in server.warnings:
            err_console.print(f"[yellow]warning:[/] {escape(warning)}")
        base_url = _start_showing_log(server)
        console.print(f"[green]ready[/] {base_url}  model={server.cfg.served_model_name}")
        console.print(f"try: astra-serve check --base-url {base_url}", highlight=False)
        code = server.wait()
        raise ServerError(f"vLLM exited by itself with code {code}; log: {server.log_file}")
    except StopRequested as asked:
        err_console.print(f"{asked}: stopping vLLM …", highlight=False)
        server.stop()
        err_console.print("vLLM stopped")
        raise typer.Exit(0) from None
    finally:
        server.stop()


@app.command()
@cli_errors
def check(
    base_url: BaseUrlOpt = None,
    model: ModelOpt = None,
    api_key: ApiKeyOpt = None,
    strict: Annotated[
        bool, typer.Option(help="Also fail when no tool call or reasoning is observed.")
    ] = False,
) -> None:
    """Check that an endpoint returns tool calls and reasoning as structured fields.

    Example: astra-serve check --base-url https://my-vllm.example.com/v1 --api-key $KEY
    """
    from serving.endpoint_check import check_endpoint

    cfg = load_config(ModelConfig, None, model_overrides(base_url, model, api_key), environ={})
    report = check_endpoint(cfg.base_url, cfg.api_key, cfg.model, sampling=cfg)
    table = Table(title=f"{cfg.base_url}  model={report.model}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for c in report.checks:
        mark = {True: "[green]pass", False: "[red]FAIL", None: "[yellow]not seen"}[c.ok]
        table.add_row(c.name, mark, escape(c.detail))
    console.print(table)
    if not report.passed(strict):
        raise typer.Exit(1)


@app.command()
@cli_errors
def profiles() -> None:
    """List the shipped serve profiles."""
    from serving.server import PROFILES_DIR, profile_names

    for name in profile_names():
        first = (PROFILES_DIR / f"{name}.yaml").read_text().splitlines()[0].lstrip("# ")
        console.print(f"[bold]{name}[/]  {first}")


@app.command()
@cli_errors
def demo(
    workdir: Annotated[Path | None, typer.Option(help="Default: $ASTRA_HOME/demo.")] = None,
    port: Annotated[int, typer.Option()] = 8011,
    real: Annotated[
        bool,
        typer.Option(
            "--real",
            help="A real model instead of the canned tiny one: SmolLM2-135M-Instruct, imported "
            "from the GGUF file `make setup` unpacked, served with --profile instruct-cpu.",
        ),
    ] = False,
) -> None:
    """The main job: tiny checkpoint → bf16 → vLLM on CPU → `astra-agent run` with mcp-server-time.

    The tiny checkpoint's answers are canned (deterministic); --real runs the same path with a
    real 135M chat model, whose answers are its own.

    Example: astra-serve demo   (what `make demo` runs); astra-serve demo --real (make demo-real)
    """
    from serving.demo import run_demo

    run_demo(workdir or astra_home() / "demo", port, real=real)
