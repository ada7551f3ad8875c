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

:func:`tokenize` refuses two kinds of conversation before tokenizing them:

* **Control text** (:class:`ControlTextError`): the tokenizer turns the text of each of its
  special and added tokens (``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>``, and here also
  ``<think>``, ``<tool_call>``, ``<tool_response>`` and their closing tags) into that token
  wherever it appears, so one message holding ``<|im_end|>\n<|im_start|>assistant\n…`` would
  forge whole turns into the sequence. Any string the template may render (content, reasoning,
  call names and arguments, the tools, any other field; keys too) holding one is refused. Think
  tags are the template's own syntax in an assistant message whatever the tokenizer: its
  content may carry its reasoning inline as ``<think>R</think>C`` (the template splits it out;
  anything else with think tags would be dropped or mis-split), its reasoning holds none. The
  shipped template puts its own text between any two strings it renders, so no token can be
  formed across a boundary either.
* **Text that cannot fit** (:class:`TooLongError`, with ``max_tokens``): a rendered conversation
  of more than ``max_tokens × B × r`` UTF-8 bytes cannot fit in ``max_tokens`` tokens, where B
  is the most bytes one token stands for (the longest vocabulary entry or added token) and r
  how much the tokenizer's normalizer can shrink UTF-8 (1 without one; 4 for NFC/NFD, 5 for
  NFKC/NFKD: the most measured over every code point is 3 and 4). That holds for byte-level BPE,
  whose tokens spell out every byte of the normalized text (every byte is in its vocabulary,
  so no unknown token swallows text) — the tiny checkpoints' and Qwen3's tokenizers. For any
  other tokenizer (WordPiece, an unknown token, a normalizer or pre-tokenizer that can delete
  text) :func:`text_limit` is None and the text is tokenized to be measured.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable
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
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# How much a normalizer can shrink the UTF-8 of a text, at most (measured over every code
# point: NFC/NFD 3, e.g. U+1FEF → "`"; NFKC/NFKD 4, e.g. U+107A5 → "q"; one more for margin).
_SHRINK = {"NFC": 4, "NFD": 4, "NFKC": 5, "NFKD": 5}
_SPLIT_KEEPS = {"Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"}


class DataError(ConfigError):
    """A conversation cannot be trained on as it is (nothing to train, a render mismatch)."""


class ControlTextError(DataError):
    """A string the template renders holds the text of a special/added token (or think tags
    where the template reads them): it would become control tokens."""


class TooLongError(DataError):
    """The rendered conversation has more bytes than ``max_tokens`` tokens can stand for."""


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


@dataclass(frozen=True)
class _Controls:
    """What a tokenizer turns into control tokens."""

    any: re.Pattern[str]  # the text of any special/added token
    reply: re.Pattern[str]  # the same, or a think tag (where the template reads them)
    turns: re.Pattern[str]  # the turn markers: special tokens and <|…|> added tokens
    normalize: Callable[[str], str] | None  # where added tokens match after normalizing

    def find(self, pattern: re.Pattern[str], text: str) -> str | None:
        found = pattern.search(text)
        if found is None and self.normalize is not None:
            found = pattern.search(self.normalize(text))
        return found.group() if found else None

    def first_leaf(self, value: Any, pattern: re.Pattern[str]) -> str | None:
        """The first match of ``pattern`` in a string, key or value inside ``value``."""
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                found = self.find(pattern, v)
                if found:
                    return found
            elif isinstance(v, dict):
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, list | tuple):
                stack.extend(v)
        return None


@lru_cache(maxsize=8)
def _controls(tokenizer: Any) -> _Controls:
    added = list(getattr(tokenizer, "added_tokens_decoder", {}).values())
    texts = {t.content for t in added} | set(getattr(tokenizer, "all_special_tokens", []))
    ordered = sorted((t for t in texts if t), key=len, reverse=True)
    normalizer: Any = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    normalized = normalizer is not None and any(getattr(t, "normalized", False) for t in added)
    special = set(getattr(tokenizer, "all_special_tokens", []))
    turns = [t for t in ordered if t in special or (t.startswith("<|") and t.endswith("|>"))]
    return _Controls(
        any=re.compile("|".join(re.escape(t) for t in ordered) or r"(?!)"),
        reply=re.compile("|".join(re.escape(t) for t in [*ordered, THINK_OPEN, THINK_CLOSE])),
        turns=re.compile("|".join(re.escape(t) for t in turns) or r"(?!)"),
        normalize=normalizer.normalize_str if normalized else None,
    )


def _assistant_content(text: str, controls: _Controls) -> str | None:
    """What in an assistant message's content is control text, as the template splits it."""
    if THINK_CLOSE not in text:
        return controls.find(controls.reply, text)
    head, *rest = text.split(THINK_CLOSE)
    before, _, reasoning = head.rpartition(THINK_OPEN)
    if len(rest) > 1:
        return f"{THINK_CLOSE} twice (the template drops what lies between)"
    if before.strip():
        return f"text before {THINK_OPEN} (the template drops it)"
    return controls.find(controls.reply, reasoning) or controls.find(controls.reply, rest[0])


def turn_marker(tokenizer: Any, value: Any) -> str | None:
    """The first turn marker's text (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``: the
    special tokens and the ``<|…|>`` added ones) in a string, key or value inside ``value``."""
    controls = _controls(tokenizer)
    return controls.first_leaf(value, controls.turns)


def control_text(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> str | None:
    """Where the conversation holds text that would become control tokens (None: nowhere)."""
    controls = _controls(tokenizer)
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        assistant = m.get("role") == "assistant"
        for key, value in m.items():
            if key == "content" and assistant:
                found = _assistant_content(content_text(value), controls)
            elif key == "content":
                found = controls.find(controls.any, content_text(value))
            elif key in ("reasoning_content", "reasoning") and assistant:
                found = controls.first_leaf(value, controls.reply)
            else:
                found = controls.first_leaf([key, value], controls.any)
            if found:
                return f"message {i} {str(key)[:40]}: {found}"
    found = controls.first_leaf(tools or [], controls.any)
    return f"tools: {found}" if found else None


@lru_cache(maxsize=8)
def bytes_per_token(tokenizer: Any) -> int | None:
    """B × r of the module docstring: at most how many UTF-8 bytes of text one token stands for
    (None: no such bound holds for this tokenizer)."""
    from tokenizers.pre_tokenizers import ByteLevel

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    keeps_all = all(
        k in ("ByteLevel", "Digits") or (k == "Split" and p.get("behavior") in _SPLIT_KEEPS)
        for k, p in zip(kinds, parts, strict=True)
    )
    vocab = model.get("vocab") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in kinds or not keeps_all:
        return None
    if not isinstance(vocab, dict) or not set(ByteLevel.alphabet()) <= vocab.keys():
        return None
    shrink = _shrink(spec.get("normalizer"))
    if shrink is None:
        return None
    longest = max(
        [len(t) for t in vocab]  # byte-level: one character per byte
        + [len(str(t.get("content", "")).encode()) for t in spec.get("added_tokens") or []]
    )
    return longest * shrink


def _shrink(normalizer: dict[str, Any] | None) -> int | None:
    if normalizer is None:
        return 1
    if normalizer.get("type") == "Sequence":
        total = 1
        for part in normalizer.get("normalizers") or []:
            one = _shrink(part)
            if one is None:
                return None
            total *= one
        return total
    return _SHRINK.get(str(normalizer.get("type")))


def text_limit(tokenizer: Any, max_tokens: int) -> int | None:
    """The most UTF-8 bytes the rendered text of ``max_tokens`` tokens can have (None: no
    bound for this tokenizer)."""
    per = bytes_per_token(tokenizer)
    return None if per is None else max_tokens * per


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


def _check_fits(tokenizer: Any, text: str, max_tokens: int) -> None:
    """TooLongError if ``text`` has more bytes than ``max_tokens`` tokens can stand for."""
    per = bytes_per_token(tokenizer)
    size = len(text.encode("utf-8", "surrogatepass"))
    if per is not None and size > max_tokens * per:
        raise TooLongError(
            f"{size} bytes of text cannot fit in max_length {max_tokens} "
            f"(a token stands for {per} bytes at most)"
        )


def tokenize(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    max_tokens: int | None = None,
) -> Tokenized:
    """Token ids (identical to the serving render) and the loss mask of one conversation.

    ControlTextError if a message or tool holds control text; TooLongError if ``max_tokens``
    is given and the rendered text cannot fit it (found without tokenizing)."""
    found = control_text(tokenizer, messages, tools)
    if found:
        raise ControlTextError(f"control text in {found[:200]}")
    template = training_template(serving_template(tokenizer))
    text, spans = _render(tokenizer, messages, tools, template, spans=True)
    if max_tokens is not None:
        _check_fits(tokenizer, text, max_tokens)
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
