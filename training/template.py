"""The training chat template and the loss mask, derived once here and used by both backends.

The *serving* template (``serving/chat_template.jinja``, carried by every checkpoint as
``tokenizer.chat_template``) is what vLLM prompts with. The *training* template is the same
text with ``{% generation %}…{% endgeneration %}`` around exactly what the assistant generates:
from after ``<|im_start|>assistant\\n`` through ``<|im_end|>`` (the ``\\n`` after it is never
sampled). It is derived from the serving template by a program, never kept as a second file,
so the two cannot drift; the markers only record character offsets, so both render the same
text.

The mask is 1 on the tokens of the assistant messages after the last user query: those the
template renders with their reasoning. Earlier turns' assistant messages are rendered without
it (as Qwen3 does), so they are context only; :func:`split_turns` gives each user turn a
conversation of its own so that every assistant message is trained once, with its reasoning.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from transformers.utils.chat_template_utils import render_jinja_template

from astra_agent.errors import ConfigError

_BRANCH = re.compile(r"\{%-?\s*(?:el)?if\s+message\.role\s*==\s*['\"]assistant['\"]\s*-?%\}")
_HEADER = re.compile(r"\{\{-?\s*'<\|im_start\|>assistant\\n'\s*-?\}\}")
_END = re.compile(r"\{\{-?\s*'<\|im_end\|>\\n'\s*-?\}\}")
_IF_TAG = re.compile(r"\{%-?\s*(if|elif|else|endif)\b")
_MACRO_OPEN = re.compile(r"\{%-?\s*macro\b")
_MACRO_CLOSE = re.compile(r"\{%-?\s*endmacro\b")
_SET_BLOCK_OPEN = re.compile(r"\{%-?\s*set\s+[\w.]+\s*-?%\}")  # {% set x %}…{% endset %}
_SET_BLOCK_CLOSE = re.compile(r"\{%-?\s*endset\b")
_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")

HEADER = "<|im_start|>assistant\n"
END = "<|im_end|>"


class DataError(ConfigError):
    """A conversation cannot be trained on as it is (nothing to train, a render mismatch)."""


def serving_template(tokenizer_or_dir: Any) -> str:
    """The chat template the checkpoint serves with (its tokenizer's ``chat_template``)."""
    if isinstance(tokenizer_or_dir, str | Path):
        tokenizer = load_tokenizer(Path(tokenizer_or_dir))
    else:
        tokenizer = tokenizer_or_dir
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ConfigError(
            f"{tokenizer_or_dir!s:.200} has no chat template",
            hint="use a checkpoint written by `astra-serve tiny` or `astra-serve convert`",
        )
    return template


def load_tokenizer(path: Path) -> Any:
    """A fast tokenizer from a checkpoint dir (ConfigError if there is none)."""
    from transformers import AutoTokenizer

    if not path.is_dir():
        raise ConfigError(f"tokenizer {path} is not a directory", hint="pass a checkpoint dir")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {path}: {exc}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"the tokenizer in {path} is not a fast tokenizer (offsets are needed)")
    return tokenizer


def _inside_block(text: str, pos: int, open_re: re.Pattern[str], close_re: re.Pattern[str]) -> bool:
    before = text[:pos]
    return len(open_re.findall(before)) > len(close_re.findall(before))


def _branch_end(text: str, start: int) -> int:
    """Where the if-branch whose body starts at ``start`` ends (its next elif/else/endif)."""
    depth = 0
    for tag in _IF_TAG.finditer(text, start):
        kind = tag.group(1)
        if kind == "if":
            depth += 1
        elif depth == 0:
            return tag.start()
        elif kind == "endif":
            depth -= 1
    return len(text)


def _assistant_branch(serving: str) -> tuple[re.Match[str], re.Match[str]]:
    """The header and the end-of-turn output of the assistant branch of the messages loop."""
    branches = list(_BRANCH.finditer(serving))
    if len(branches) != 1:
        raise ConfigError(
            f"the serving template has {len(branches)} assistant branches (need exactly one)",
            hint="the training template is derived from `message.role == 'assistant'`",
        )
    start = branches[0].end()
    stop = _branch_end(serving, start)
    header = _HEADER.search(serving, start, stop)
    end = _END.search(serving, header.end(), stop) if header else None
    if header is None or end is None:
        raise ConfigError(
            "the serving template's assistant branch was not found "
            "(an `<|im_start|>assistant\\n` … `<|im_end|>\\n` output after the branch)"
        )
    for pos in (header.start(), end.start()):
        if _inside_block(serving, pos, _MACRO_OPEN, _MACRO_CLOSE) or _inside_block(
            serving, pos, _SET_BLOCK_OPEN, _SET_BLOCK_CLOSE
        ):
            raise ConfigError(
                "the template's assistant output is inside a macro or a {% set %} block: "
                "generation offsets would be wrong there"
            )
    return header, end


@lru_cache(maxsize=8)
def training_template(serving: str) -> str:
    """``serving`` with generation markers around what the assistant generates."""
    if _GENERATION.search(serving):
        raise ConfigError("the serving template already has {% generation %} markers")
    header, end = _assistant_branch(serving)
    return (
        serving[: header.end()]
        + "{%- generation %}"
        + serving[header.end() : end.start()]
        + "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
        + serving[end.end() :]
    )


@dataclass(frozen=True)
class Tokenized:
    input_ids: list[int]
    loss_mask: list[int]  # 1 = a trained token (a target)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_trained(self) -> int:
        return sum(self.loss_mask)


def content_text(content: Any) -> str:
    """A message's content as the template's ``text`` macro sees it."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


def is_query(message: dict[str, Any]) -> bool:
    """A real user query (not a user message that only carries tool responses)."""
    if message.get("role") != "user":
        return False
    text = content_text(message.get("content"))
    return not (text.startswith("<tool_response>") and text.endswith("</tool_response>"))


def last_query(messages: list[dict[str, Any]]) -> int:
    """Index of the last real user query, as the template computes it (len-1 if none)."""
    for i in range(len(messages) - 1, -1, -1):
        if is_query(messages[i]):
            return i
    return len(messages) - 1


def _render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template: str,
    spans: bool,
) -> tuple[str, list[tuple[int, int]]]:
    kwargs = {**getattr(tokenizer, "special_tokens_map", {})}
    result: Any = render_jinja_template(  # typed `-> str` upstream; returns (texts, spans)
        conversations=[messages],
        tools=list(tools) if tools else None,
        chat_template=template,
        return_assistant_tokens_mask=spans,
        **kwargs,
    )
    rendered, indices = result
    return str(rendered[0]), ([tuple(x) for x in indices[0]] if spans else [])


def _mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[int]:
    """1 for each token that starts inside a span (spans sorted, disjoint)."""
    mask = [0] * len(offsets)
    k = 0
    for i, (start, _end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= start < spans[k][1]:
            mask[i] = 1
    return mask


def tokenize_text(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and character offsets of a rendered conversation, as apply_chat_template tokenizes."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]


def tokenize(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> Tokenized:
    """Token ids (identical to the serving render) and the loss mask of one conversation."""
    template = training_template(serving_template(tokenizer))
    text, spans = _render(tokenizer, messages, tools, template, spans=True)
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if len(spans) != len(assistants):
        raise DataError(
            f"the template rendered {len(spans)} assistant turns for {len(assistants)} "
            "assistant messages"
        )
    after = last_query(messages)
    if not any(is_query(m) for m in messages):
        after = len(messages)  # no query: the template renders no reasoning; nothing trained
    trained = [span for span, i in zip(spans, assistants, strict=True) if i > after]
    ids, offsets = tokenize_text(tokenizer, text)
    mask = _mask(offsets, trained)
    if not any(mask):
        raise DataError(
            "the conversation has no assistant token to train on (after its last user query)"
        )
    return Tokenized(input_ids=ids, loss_mask=mask)


def split_turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One conversation per user turn: the prefix through that turn's last assistant message.

    Each assistant message then lies after the last query of exactly one conversation, so it is
    trained once, with its reasoning, in the context the serving template gives it. Turns with no
    assistant reply are skipped; a conversation with at most one user turn comes back whole.
    """
    queries = [i for i, m in enumerate(messages) if is_query(m)]
    if len(queries) <= 1:
        return [list(messages)]
    out: list[list[dict[str, Any]]] = []
    bounds = [*queries[1:], len(messages)]
    for q, stop in zip(queries, bounds, strict=True):
        last = max(
            (i for i in range(q + 1, stop) if messages[i].get("role") == "assistant"), default=None
        )
        if last is not None:
            out.append(list(messages[: last + 1]))
    return out


def _ids_diff(tokenizer: Any, a: list[int], b: list[int]) -> str:
    first = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    lo = max(0, first - 8)
    ta = tokenizer.decode(a[lo : first + 24])
    tb = tokenizer.decode(b[lo : first + 24])
    diff = "\n".join(difflib.unified_diff([ta], [tb], "serving", "training", lineterm=""))
    return f"first differing token {first} (serving {len(a)} tokens, training {len(b)}):\n{diff}"


def check_matches_serving(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> None:
    """Raise DataError, with a readable diff, if the training render differs from serving's."""
    served = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
    a = list(
        tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=True, return_dict=True
        )["input_ids"]
    )
    template = training_template(serving_template(tokenizer))
    trained, _ = _render(tokenizer, messages, tools, template, spans=True)
    b = list(tokenize_text(tokenizer, trained)[0])
    if a != b or served != trained:
        raise DataError(
            "the training template renders differently from the serving template: "
            + _ids_diff(tokenizer, a, b)
        )
