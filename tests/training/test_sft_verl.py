"""``backend: verl``: the generated config against verl's own schema, the launch lines, and the
data path through verl's own dataset machinery.

verl 0.9.1's SFT trainer cannot run here (its engine is registered for cuda/npu only; it uses
nccl), so what is tested on CPU is everything around it: the overrides compose with verl's Hydra
defaults in struct mode (every key known), launch.sh passes them verbatim, verl's
``create_sft_dataset`` + ``SFTTensorCollator`` yield exactly our ids and mask, and where verl's
own ``MultiTurnSFTDataset`` can read our data at all it agrees with us up to one documented
difference.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from astra_agent.config import load_config
from astra_agent.errors import AstraError, ConfigError
from tests.training.conftest import RECIPES, check_verl_resume, check_verl_run_file
from training.sft.config import SFTConfig
from training.sft.verl import (
    compose_verl_config,
    prepare_verl,
    run_verl,
    verl_overrides,
)
from training.sft.verl_dataset import AstraSFTDataset
from training.template import load_tokenizer, tokenize

VERL_RECIPES = sorted(RECIPES.glob("sft-astra-*.yaml"))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Current time in a zone.",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "add", "parameters": {"type": "object", "properties": {}}},
    },
]


def _call(name: str, args: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": args}}


def conversation(*, reasoning: bool = True, parallel: bool = True) -> list[dict[str, Any]]:
    """One user query, a tool loop (parallel calls, an error result), a final answer."""
    calls = [_call("get_time", '{"tz": "UTC"}')]
    if parallel:
        calls.append(_call("get_time", '{"tz": "CET"}'))
    first: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
    last: dict[str, Any] = {"role": "assistant", "content": "It is 12:00 UTC."}
    if reasoning:
        first["reasoning_content"] = "I need the time."
        last["reasoning_content"] = "Both answered."
    results = [{"role": "tool", "content": "12:00"}]
    if parallel:
        results.append({"role": "tool", "content": "error: unknown zone CET"})
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What time is it?"},
        first,
        *results,
        last,
    ]


def write_ours(path: Path, rows: list[tuple[list[dict[str, Any]], Any]], tok: Any) -> Path:
    """A parquet in the layout of `astra-train data sft` (JSON strings for messages/tools)."""
    records = []
    for i, (messages, tools) in enumerate(rows):
        t = tokenize(tok, messages, tools)
        records.append(
            {
                "id": f"r{i}",
                "source": "test",
                "messages": json.dumps(messages),
                "tools": json.dumps(tools),
                "provenance": json.dumps({"file": "test", "line": i}),
                "num_tokens": t.num_tokens,
                "num_trained_tokens": t.num_trained,
            }
        )
    pd.DataFrame(records).to_parquet(path)
    return path


def make_cfg(tmp_path: Path, **kw: Any) -> SFTConfig:
    base: dict[str, Any] = {
        "backend": "verl",
        "model": tmp_path / "no-such-model",
        "train_files": [tmp_path / "train.parquet"],
        "output_dir": tmp_path / "out",
    }
    verl = {"gpus_per_node": 8, **kw.pop("verl", {})}
    return SFTConfig.model_validate({**base, **kw, "verl": verl})


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> Any:
    return load_tokenizer(tiny_tokenizer_dir)


# --------------------------------------------------------------------------- the data path


def test_verl_builds_our_dataset_and_collates_our_exact_tokens(
    tmp_path: Path, tiny_tokenizer_dir: Path, tok: Any
) -> None:
    from verl.trainer.sft_trainer import create_sft_dataset
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.dataset_utils import SFTTensorCollator

    rows = [
        (conversation(), TOOLS),
        (conversation(reasoning=False, parallel=False), TOOLS[:1]),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}], []),
    ]
    parquet = write_ours(tmp_path / "train.parquet", rows, tok)
    cfg = make_cfg(tmp_path, model=tiny_tokenizer_dir, train_files=[parquet], max_length=4096)
    composed = compose_verl_config(verl_overrides(cfg))  # model checked: tiny dir
    model = omega_conf_to_dataclass(composed.model)  # what verl's trainer builds first
    ds = create_sft_dataset(composed.data.train_files, composed.data, model.tokenizer, None)
    assert isinstance(ds, AstraSFTDataset) and len(ds) == 3
    batch: dict[str, Any] = SFTTensorCollator(composed.data.pad_mode)([ds[i] for i in range(3)])
    assert all(batch[k].is_nested for k in ("input_ids", "position_ids", "loss_mask"))
    for i, (messages, tools) in enumerate(rows):
        ours = tokenize(tok, messages, tools)
        assert batch["input_ids"][i].tolist() == ours.input_ids
        assert batch["loss_mask"][i].tolist() == ours.loss_mask
        assert batch["position_ids"][i].tolist() == list(range(ours.num_tokens))
        assert ours.input_ids == list(
            tok.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )  # what vLLM prompts with


def test_dataset_refuses_long_rows_up_front_and_cuts_when_told(tmp_path: Path, tok: Any) -> None:
    parquet = write_ours(tmp_path / "t.parquet", [(conversation(), TOOLS)], tok)
    ours = tokenize(tok, conversation(), TOOLS)
    short = ours.num_tokens - 10
    with pytest.raises(ConfigError, match=r"1 conversation\(s\) exceed data.max_length"):
        AstraSFTDataset(str(parquet), tok, {"max_length": short, "truncation": "error"})
    right = AstraSFTDataset([str(parquet)], tok, {"max_length": short, "truncation": "right"})[0]
    assert right["input_ids"].tolist() == ours.input_ids[:short]
    assert right["loss_mask"].tolist() == ours.loss_mask[:short]
    left = AstraSFTDataset([str(parquet)], tok, {"max_length": short, "truncation": "left"})[0]
    assert left["input_ids"].tolist() == ours.input_ids[-short:]
    assert left["position_ids"].tolist() == list(range(short))
    # without the num_tokens column the check happens per item, as verl's own dataset does it
    pd.read_parquet(parquet).drop(columns=["num_tokens"]).to_parquet(tmp_path / "n.parquet")
    lazy = AstraSFTDataset(str(tmp_path / "n.parquet"), tok, {"max_length": short})
    with pytest.raises(ValueError, match=r"data\.max_length"):
        lazy[0]
    with pytest.raises(ConfigError, match="no_padding"):
        AstraSFTDataset(str(parquet), tok, {"pad_mode": "right"})


VERL_ONLY_REASONING = "{%- if loop.index0 > ns.last_query and reasoning %}"


def _merge_tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive tool results as one user message, as the serving template renders them."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] != "tool":
            out.append(m)
            continue
        piece = f"<tool_response>\n{m['content']}\n</tool_response>"
        if (
            out
            and out[-1].get("role") == "user"
            and out[-1]["content"].endswith("</tool_response>")
        ):
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + piece}
        else:
            out.append({"role": "user", "content": piece})
    return out


def _verl_own(parquet: Path, tok: Any, **extra: Any) -> dict[str, torch.Tensor]:
    from omegaconf import OmegaConf
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    cfg = OmegaConf.create({"max_length": 8192, "pad_mode": "no_padding", **extra})
    row: dict[str, torch.Tensor] = MultiTurnSFTDataset(str(parquet), tok, cfg)[0]
    return row


def test_verl_own_dataset_fails_on_our_template_so_run_verl_uses_custom_cls(
    tmp_path: Path, tok: Any
) -> None:
    """verl renders each message alone: alone, an assistant message has no user query before
    it, so the serving template drops its reasoning and verl's whole-conversation check fails;
    told to ignore that, it silently trains on ids with no reasoning in them."""
    msgs = _merge_tool_messages(conversation())
    pd.DataFrame([{"messages": msgs, "tools": TOOLS}]).to_parquet(tmp_path / "v.parquet")
    with pytest.raises(AssertionError, match="apply_chat_template"):
        _verl_own(tmp_path / "v.parquet", tok)
    ids = _verl_own(tmp_path / "v.parquet", tok, ignore_input_ids_mismatch=True)["input_ids"]
    assert "I need the time." not in tok.decode(ids.tolist())
    assert tokenize(tok, conversation(), TOOLS).input_ids != ids.tolist()
    # tools must be parquet structs for verl, and parquet unifies them: the second schema gains
    # the first one's keys as nulls, so `tool|tojson` renders other text than the record's
    stored = pd.read_parquet(tmp_path / "v.parquet", dtype_backend="pyarrow")["tools"][0]
    assert stored[1]["function"]["description"] is None
    assert stored[1]["function"]["parameters"]["properties"] == {"tz": None}
    cfg = make_cfg(tmp_path)
    assert "data.custom_cls.name=AstraSFTDataset" in verl_overrides(cfg)


@pytest.mark.parametrize("reasoning,parallel", [(True, True), (False, False), (True, False)])
def test_verl_own_dataset_agrees_where_it_can(
    tmp_path: Path, tok: Any, reasoning: bool, parallel: bool
) -> None:
    """Single-user-turn records, tool results merged, a verl-only template (reasoning always
    rendered), one tool schema shape per file (parquet unifies struct keys): then verl's own
    MultiTurnSFTDataset gives our ids, and its mask differs from ours exactly at the "\\n" after
    each assistant <|im_end|> (verl trains it; we do not: it is never sampled)."""
    messages = conversation(reasoning=reasoning, parallel=parallel)
    serving = tok.chat_template
    assert serving.count(VERL_ONLY_REASONING) == 1
    parquet = tmp_path / "one.parquet"
    tools = TOOLS[:1]
    pd.DataFrame([{"messages": _merge_tool_messages(messages), "tools": tools}]).to_parquet(parquet)
    tok.chat_template = serving.replace(VERL_ONLY_REASONING, "{%- if reasoning %}")
    try:
        row = _verl_own(parquet, tok)
    finally:
        tok.chat_template = serving
    ours = tokenize(tok, messages, tools)
    assert row["input_ids"].tolist() == ours.input_ids
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    newline_after = {
        i + 1 for i, t in enumerate(ours.input_ids) if t == im_end and ours.loss_mask[i] == 1
    }
    assert len(newline_after) == 2 and all(
        tok.decode([ours.input_ids[i]]) == "\n" for i in newline_after
    )
    differ = {
        i
        for i, (a, b) in enumerate(zip(row["loss_mask"].tolist(), ours.loss_mask, strict=True))
        if a != b
    }
    assert differ == newline_after
    assert all(row["loss_mask"][i] == 1 for i in differ)


# --------------------------------------------------------------------------- config and recipes


@pytest.mark.parametrize("recipe", VERL_RECIPES, ids=lambda p: p.stem)
def test_shipped_verl_recipe_composes_with_verls_defaults(
    recipe: Path, tiny_tokenizer_dir: Path
) -> None:
    cfg = load_config(SFTConfig, recipe, environ={})
    assert cfg.backend == "verl" and cfg.max_length == 20480 and cfg.epochs == 2
    assert (cfg.global_batch_size, cfg.lr_scheduler, cfg.warmup_ratio) == (32, "cosine", 0.05)
    composed = compose_verl_config(verl_overrides(cfg), check_model=False)  # placeholder model
    assert composed.data.max_length == 20480 and composed.data.train_batch_size == 32
    assert composed.optim.lr == cfg.learning_rate and composed.trainer.total_epochs == 2
    assert composed.optim.lr_warmup_steps_ratio == 0.05
    assert composed.data.custom_cls.name == "AstraSFTDataset"
    sp = cfg.verl.ulysses_sequence_parallel_size
    assert composed.data.max_token_len_per_gpu * sp >= cfg.max_length  # one sequence fits
    # the model part of verl's schema, checked apart with a real checkpoint
    real = cfg.model_copy(update={"model": tiny_tokenizer_dir})
    assert compose_verl_config(verl_overrides(real)).model.path == str(tiny_tokenizer_dir)


def test_recipe_lr_of_14b_is_the_papers() -> None:
    cfg = load_config(SFTConfig, RECIPES / "sft-astra-14b.yaml", environ={})
    assert cfg.learning_rate == 5e-6 and cfg.verl.nnodes == 1


def test_unknown_key_in_a_recipe_is_a_clear_error(tmp_path: Path) -> None:
    text = (RECIPES / "sft-astra-14b.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "warmup_steps: 10\n")
    with pytest.raises(ConfigError, match="warmup_steps"):
        load_config(SFTConfig, bad, environ={})
    bad.write_text(text.replace("  run: false", "  run: false\n  bogus: 1"))
    with pytest.raises(ConfigError, match=r"verl\.bogus"):
        load_config(SFTConfig, bad, environ={})


def test_unknown_verl_override_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, verl={"overrides": ["data.multiturn.enable=true"]})
    with pytest.raises(ConfigError, match=r"data\.multiturn\.enable"):
        prepare_verl(cfg)
    assert not (tmp_path / "out").exists()
    cfg = make_cfg(tmp_path, verl={"overrides": ["optim.lr_scheduler_type=wsd"]})
    with pytest.raises(ConfigError):  # a known key, a value verl's dataclass refuses
        prepare_verl(cfg)


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"verl": {"nnodes": 2}}, "needs the Ray launcher"),
        ({"global_batch_size": 12}, "not a multiple of the 8 data-parallel"),
        ({"verl": {"ulysses_sequence_parallel_size": 3}}, "does not divide"),
        ({"lr_scheduler": "linear"}, "not implemented by verl"),
    ],
)
def test_settings_verl_cannot_honour_are_refused(
    tmp_path: Path, kw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        verl_overrides(make_cfg(tmp_path, **kw))


def test_max_steps_and_fractional_epochs_count_the_rows(tmp_path: Path, tok: Any) -> None:
    hi: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
    rows: list[tuple[list[dict[str, Any]], Any]] = [
        ([*hi, {"role": "assistant", "content": "Yo"}], [])
    ] * 10
    parquet = write_ours(tmp_path / "train.parquet", rows, tok)
    ov = verl_overrides(
        make_cfg(tmp_path, global_batch_size=4, epochs=1.5, verl={"gpus_per_node": 1})
    )
    assert "trainer.total_training_steps=3" in ov and "trainer.total_epochs=2" in ov  # 2/epoch
    ov = verl_overrides(
        make_cfg(tmp_path, global_batch_size=4, max_steps=7, verl={"gpus_per_node": 1})
    )
    assert "trainer.total_training_steps=7" in ov and "trainer.total_epochs=4" in ov
    parquet.unlink()
    with pytest.raises(ConfigError, match="train file not found"):
        verl_overrides(make_cfg(tmp_path, max_steps=7))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has GPUs")
def test_run_true_without_gpus_fails_up_front(tmp_path: Path, tiny_tokenizer_dir: Path) -> None:
    cfg = make_cfg(tmp_path, model=tiny_tokenizer_dir, verl={"run": True})
    with pytest.raises(ConfigError, match=r"needs 8 CUDA GPU\(s\) here, found 0") as exc:
        run_verl(cfg)
    assert "backend: trl" in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_resuming_into_a_run_of_another_config_is_refused(tmp_path: Path) -> None:
    check_verl_resume(prepare_verl, make_cfg, tmp_path, "5")


def test_the_job_writes_the_run_file_astra_eval_reads(tmp_path: Path) -> None:
    check_verl_run_file(prepare_verl, make_cfg, tmp_path, "sft")


# --------------------------------------------------------------------------- launch.sh


def _script_argv(script: Path, tmp_path: Path, prog: str) -> tuple[list[str], dict[str, str]]:
    """Run launch.sh with a stand-in ``prog`` on PATH that records its argv and environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / prog
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "rec = {'argv': sys.argv[1:], 'env': dict(os.environ)}\n"
        f"json.dump(rec, open({str(tmp_path / 'rec.json')!r}, 'w'))\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=60)
    rec = json.loads((tmp_path / "rec.json").read_text())
    return rec["argv"], rec["env"]


def test_launch_sh_one_node_passes_every_override_verbatim(tmp_path: Path) -> None:
    odd = tmp_path / "it's a run, v=2"
    cfg = make_cfg(tmp_path, output_dir=odd, report_to=["tensorboard"])
    job = prepare_verl(cfg)
    assert os.access(job.launch_script, os.X_OK)
    overrides = job.overrides_file.read_text().splitlines()
    argv, env = _script_argv(job.launch_script, tmp_path, "torchrun")
    head = ["--standalone", "--nnodes=1", "--nproc_per_node=8", "-m", "verl.trainer.sft_trainer"]
    assert argv == head + overrides and tuple(argv) == job.command[1:]
    metrics = Path(env["VERL_FILE_LOGGER_PATH"])  # a file per launch, outside the job dir
    assert metrics == job.metrics_file and metrics.parent == odd.absolute() / "verl-metrics"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "training.verl_compat"
    assert env["TENSORBOARD_DIR"] == str(odd.absolute() / "tensorboard")
    composed = compose_verl_config(argv[5:], check_model=False)  # what verl would parse
    assert composed.trainer.default_local_dir == str(odd.absolute() / "checkpoints")
    assert list(composed.trainer.logger) == ["console", "file", "tensorboard"]
    assert (job.workdir / "config.yaml").read_text().count("AstraSFTDataset") == 1


def test_launch_sh_two_nodes_is_a_ray_job(tmp_path: Path) -> None:
    cfg = make_cfg(
        tmp_path,
        verl={"nnodes": 2, "launcher": "ray", "ray_address": "http://head:8265"},
    )
    job = prepare_verl(cfg)
    text = job.launch_script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "exec ray \\" in text
    argv, _ = _script_argv(job.launch_script, tmp_path, "ray")
    sep = argv.index("--")
    assert argv[:3] == ["job", "submit", "--address=http://head:8265"]
    runtime = json.loads(argv[3].removeprefix("--runtime-env-json="))
    assert runtime["env_vars"]["VERL_FILE_LOGGER_PATH"] == str(job.metrics_file)
    assert argv[sep + 1 : sep + 4] == ["python3", "-m", "verl.trainer.sft_trainer_ray"]
    rest = argv[sep + 4 :]
    assert "trainer.nnodes=2" in rest and "trainer.n_gpus_per_node=8" in rest
    assert rest == job.overrides_file.read_text().splitlines()
    assert shlex.split(text.split("exec ", 1)[1].replace("\\\n", "")) == list(job.command)


# --------------------------------------------------------------------------- run + convert


@pytest.mark.integration
def test_run_streams_the_launch_line_then_converts_the_checkpoint(
    tmp_path: Path, tiny_tokenizer_dir: Path, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's trainer cannot run here, so a stand-in torchrun writes what it would (a verl FSDP
    checkpoint under trainer.default_local_dir); the rest is real: launch.sh, the output
    streamed, serving's converter running verl's model merger, bf16 in OUTPUT_DIR/final-bf16."""
    from serving.tiny import TinySpec, build_tiny_checkpoint

    write_ours(tmp_path / "train.parquet", [(conversation(), TOOLS)], tok)
    verl_ckpt = build_tiny_checkpoint(tmp_path / "ckpt", TinySpec(behavior="random"), layout="verl")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(
        "#!/usr/bin/env bash\nset -e\necho 'step 1 loss 1.0'\n"
        'for a in "$@"; do case $a in trainer.default_local_dir=*) d=${a#*=};; esac; done\n'
        f'cp -r {shlex.quote(str(verl_ckpt))} "$d"\n'
    )
    (bin_dir / "torchrun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    cfg = make_cfg(
        tmp_path,
        model=tiny_tokenizer_dir,
        global_batch_size=1,
        verl={"gpus_per_node": 1, "run": True},
    )
    lines: list[str] = []
    job = run_verl(cfg, echo=lines.append)
    assert "step 1 loss 1.0" in lines and job.ran
    assert job.final == (tmp_path / "out" / "final-bf16").resolve()
    config = json.loads((job.final / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    (bin_dir / "torchrun").write_text("#!/usr/bin/env bash\necho boom\nexit 3\n")
    with pytest.raises(AstraError, match="exited with status 3"):
        run_verl(cfg.model_copy(update={"resume": False}), echo=lines.append)


def test_the_cli_writes_the_verl_job_of_a_shipped_recipe_and_says_how_to_launch_it(
    tmp_path: Path, tok: Any
) -> None:
    from typer.testing import CliRunner

    from training.cli import app

    parquet = write_ours(tmp_path / "train.parquet", [(conversation(), TOOLS)], tok)
    out = tmp_path / "run"
    args = ["sft", "--config", str(RECIPES / "sft-astra-14b.yaml"), "--train-file", str(parquet)]
    res = CliRunner().invoke(app, [*args, "--output-dir", str(out)], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    launch = out / "verl" / "launch.sh"
    assert launch.is_file() and os.access(launch, os.X_OK)
    assert f"bash {launch}" in res.output and "verl.trainer.sft_trainer" in launch.read_text()


def test_a_broken_parquet_cell_is_refused_before_verl_launches(
    tmp_path: Path, tiny_tokenizer_dir: Path, tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same row check as the TRL backend's (``check_sft_parquet``), before the job dir."""
    import pyarrow as pa

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # torchrun
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    write_ours(path, [(conversation(), TOOLS), (conversation(), TOOLS)], tok)
    table = pq.read_table(path)
    column = table.column_names.index("messages")
    cells = table.column("messages").to_pylist()
    cells[1] = "{not json"
    pq.write_table(table.set_column(column, "messages", pa.array(cells)), path)
    cfg = make_cfg(tmp_path, model=tiny_tokenizer_dir, verl={"device": "cpu", "run": True})
    with pytest.raises(ConfigError, match=r"row 1 .*column 'messages': not JSON"):
        run_verl(cfg, echo=lambda _: None)
    assert not (tmp_path / "out").exists()
