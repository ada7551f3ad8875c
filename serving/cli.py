"""``astra-serve``: tiny checkpoints, fp32 → bf16 conversion, the vLLM server, endpoint checks."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from astra_agent.console import cli_errors, console, err_console, setup_logging

app = typer.Typer(
    name="astra-serve",
    help="Serve ASTRA checkpoints through vLLM's OpenAI-compatible API.\n\n"
    "Example: astra-serve convert ./ASTRA-14B-fp32 ./ASTRA-14B-bf16 && "
    "astra-serve up --model ./ASTRA-14B-bf16 --profile astra-14b",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    setup_logging(verbose)


def _home() -> Path:
    return Path(os.environ.get("ASTRA_HOME", Path.home() / ".cache" / "astra"))


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


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _serve_config(model: Path | None, profile: str | None, config: Path | None, **flags: Any):
    from serving.server import load_serve_config

    if profile is None and config is None:
        profile = "tiny-cpu"
    return load_serve_config(profile, config, model=model, **flags)


@app.command()
@cli_errors
def up(
    model: Annotated[Path | None, typer.Option(help="Converted (bf16) checkpoint dir.")] = None,
    profile: Annotated[
        str | None, typer.Option(help="tiny-cpu (default), astra-14b or astra-32b.")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="A YAML/JSON serve config.")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    served_model_name: Annotated[str | None, typer.Option()] = None,
    max_model_len: Annotated[int | None, typer.Option()] = None,
    tensor_parallel_size: Annotated[str | None, typer.Option(help="N or auto.")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Required off loopback. Env: ASTRA_SERVE_API_KEY.")
    ] = None,
    startup_timeout: Annotated[float | None, typer.Option(help="Seconds.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the vLLM command and exit.")] = False,
) -> None:
    """Serve a checkpoint with vLLM (tool calls and reasoning parsed) until Ctrl-C.

    Example: astra-serve up --model ./ASTRA-14B-bf16 --profile astra-14b --port 8000
    """
    from serving.server import VLLMServer

    cfg = _serve_config(
        model,
        profile,
        config,
        host=host,
        port=port,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        api_key=api_key,
        startup_timeout_s=startup_timeout,
    )
    server = VLLMServer(cfg)
    if dry_run:
        console.print(" ".join(server.preflight()), soft_wrap=True, highlight=False)
        return
    signal.signal(signal.SIGTERM, _interrupt)
    with console.status(f"starting vLLM (log: {server.log_file})"):
        base_url = server.start()
    try:
        console.print(f"[green]ready[/] {base_url}  model={cfg.served_model_name}")
        console.print(f"try: astra-serve check --base-url {base_url}", highlight=False)
        code = server.wait()
        raise typer.Exit(1 if code else 0)
    except KeyboardInterrupt:
        err_console.print("stopping vLLM …")
        raise
    finally:
        server.stop()


@app.command()
@cli_errors
def check(
    base_url: Annotated[str, typer.Option(help="e.g. http://127.0.0.1:8000/v1")] = (
        "http://127.0.0.1:8000/v1"
    ),
    api_key: Annotated[str | None, typer.Option(envvar=["ASTRA_API_KEY", "OPENAI_API_KEY"])] = None,
    model: Annotated[str | None, typer.Option(help="Default: the first model listed.")] = None,
    strict: Annotated[
        bool, typer.Option(help="Also fail when no tool call or reasoning is observed.")
    ] = False,
) -> None:
    """Check that an endpoint returns tool calls and reasoning as structured fields.

    Example: astra-serve check --base-url https://my-vllm.example.com/v1 --api-key $KEY
    """
    from serving.endpoint_check import check_endpoint

    report = check_endpoint(base_url, api_key, model)
    table = Table(title=f"{base_url}  model={report.model}")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for c in report.checks:
        mark = {True: "[green]pass", False: "[red]FAIL", None: "[yellow]not seen"}[c.ok]
        table.add_row(c.name, mark, c.detail)
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
) -> None:
    """The main job: tiny checkpoint → bf16 → vLLM on CPU → `astra-agent run` with mcp-server-time.

    Example: astra-serve demo   (what `make demo` runs)
    """
    from serving.demo import run_demo

    run_demo(workdir or _home() / "demo", port)
