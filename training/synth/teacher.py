"""The teacher of the synthesis stages: a versioned prompt in, a validated JSON object out.

A :class:`Teacher` wraps any :class:`~astra_agent.model.Model` (in practice a
:class:`~astra_agent.model.ChatModel` on an OpenAI-compatible endpoint). For each question it

* renders ``prompts/<name>.v<N>.jinja`` (the newest version unless one is pinned; the version
  is part of every record's provenance). A template emits ``{{ marker }}`` —
  ``[astra-synth:<name>.v<N>]`` — as its first line, so that a scripted teacher (and a person
  reading a request log) can tell which template a request came from;
* sends it as one user message and reads one JSON object back: a leading ``<think>…</think>``
  block and a ```json fence are tolerated, prose around the object is ignored; then the object
  is validated *strictly* (no type coercion) against the pydantic model the stage gives;
* on a reply it cannot use, asks again with what was wrong (at most ``max_attempts`` calls in
  all), then raises :class:`TeacherRejected` with a reason code and the raw text;
* counts tokens per prompt: in :attr:`Teacher.usage` (the process's totals) and, inside
  :func:`track_usage`, for the piece of work being done (the stage runner records it per input).

Hostile replies are bounded: a reply over ``max_reply_chars`` is not parsed, nesting deeper than
``max_depth`` is refused before validation, and what is sent back or kept is cut.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from astra_agent.errors import ConfigError, ModelBehaviorError
from astra_agent.model import Model, ModelConfig
from training.synth.text import cut_text

log = logging.getLogger(__name__)

PROMPTS_DIR = Path(__file__).parent / "prompts"
MARKER = "[astra-synth:{ref}]"
PROMPT_FILE = re.compile(r"^(?P<name>[a-z0-9_]+)\.v(?P<version>[1-9][0-9]*)\.jinja$")

# Why a reply could not be used. ``truncated``: cut off (an unclosed <think> or JSON object);
# ``not_json``: no JSON object in it; ``schema``: an object of the wrong shape or types;
# ``too_long`` / ``too_deep``: over the limits (never parsed / never validated); ``empty``.
ReplyProblem = Literal["empty", "not_json", "truncated", "schema", "too_long", "too_deep"]
S = TypeVar("S", bound=BaseModel)


# ------------------------------------------------------------------ prompts


@dataclass(frozen=True)
class Prompt:
    """One versioned template file."""

    name: str
    version: int
    path: Path

    @property
    def ref(self) -> str:
        """``name.vN``: what provenance records."""
        return f"{self.name}.v{self.version}"

    @property
    def marker(self) -> str:
        return MARKER.format(ref=self.ref)

    @property
    def sha(self) -> str:
        """The template's content hash: a run refuses to resume after an in-place edit."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()[:16]


def find_prompt(name: str, version: int | None = None, directory: Path = PROMPTS_DIR) -> Prompt:
    """``<directory>/<name>.v<version>.jinja``, or the highest version there."""
    versions = {
        int(m["version"]): p
        for p in directory.glob(f"{name}.v*.jinja")
        if (m := PROMPT_FILE.match(p.name)) and m["name"] == name
    }
    if not versions:
        raise ConfigError(f"no prompt template {name}.v<N>.jinja in {directory}")
    if version is None:
        version = max(versions)
    if version not in versions:
        have = ", ".join(f"v{v}" for v in sorted(versions))
        raise ConfigError(f"no version {version} of prompt {name!r} in {directory} (have {have})")
    return Prompt(name, version, versions[version])


@cache
def _environment(directory: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        undefined=jinja2.StrictUndefined,  # a variable the stage forgot is an error, not ""
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
    )


def render_prompt(prompt: Prompt, **variables: Any) -> str:
    """The template filled in; it must put its marker on its first line."""
    template = _environment(prompt.path.parent).get_template(prompt.path.name)
    try:
        text = template.render(marker=prompt.marker, **variables)
    except jinja2.UndefinedError as exc:
        raise ConfigError(f"prompt {prompt.ref}: {exc.message}") from None
    if text.split("\n", 1)[0].strip() != prompt.marker:
        raise ConfigError(
            f"prompt {prompt.path} does not start with its marker line",
            hint="begin the template with {{ marker }}",
        )
    return text


# ------------------------------------------------------------------ token accounting


class TokenCount(BaseModel):
    """Tokens of one prompt's calls (prompt and completion as the endpoint reported them)."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def add(self, other: TokenCount) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.calls += other.calls


Usage = dict[str, TokenCount]  # by prompt ref (``tasks.v1``)
_current: ContextVar[Usage | None] = ContextVar("astra_synth_usage", default=None)


@contextlib.contextmanager
def track_usage() -> Iterator[Usage]:
    """Collect the tokens of every teacher call made inside (tasks created inside included)."""
    usage: Usage = {}
    token = _current.set(usage)
    try:
        yield usage
    finally:
        _current.reset(token)


def add_usage(into: Usage, ref: str, count: TokenCount) -> None:
    into.setdefault(ref, TokenCount()).add(count)


def count_usage(ref: str, count: TokenCount) -> None:
    """Add ``count`` to the usage :func:`track_usage` is collecting, if any: for model calls
    made outside a :class:`Teacher` (the teacher acting as the agent of an episode)."""
    current = _current.get()
    if current is not None:
        add_usage(current, ref, count)


# ------------------------------------------------------------------ parsing a reply


class ReplyError(ValueError):
    """A reply that cannot be used, and why (``problem`` for code, the message for people)."""

    def __init__(self, problem: ReplyProblem, message: str) -> None:
        super().__init__(message)
        self.problem: ReplyProblem = problem


FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)


def _strip_think(text: str) -> str:
    """Drop a leading ``<think>…</think>`` block (or the tail of one: a reply starting inside
    the reasoning, as Qwen3's template makes it when the prompt opened ``<think>``)."""
    stripped = text.lstrip()
    close = stripped.find("</think>")
    if stripped.startswith("<think>"):
        if close < 0:
            raise ReplyError("truncated", "the reply is an unclosed <think> block: it was cut off")
        return stripped[close + len("</think>") :]
    brace = stripped.find("{")
    if close >= 0 and (brace < 0 or close < brace):
        return stripped[close + len("</think>") :]
    return stripped


def _unfinished(text: str, start: int) -> bool:
    """Does the JSON value at ``start`` run to the end of ``text`` without closing (a string
    or a bracket still open)?"""
    depth, in_string, escaped = 0, False, False
    for ch in text[start:]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return False
    return True


def _depth_over(value: Any, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def extract_object(text: str, *, max_chars: int = 100_000, max_depth: int = 32) -> dict[str, Any]:
    """The first JSON object in a reply (after a ``<think>`` block, inside a fence if any)."""
    if len(text) > max_chars:
        raise ReplyError("too_long", f"the reply is {len(text):,} characters (limit {max_chars:,})")
    body = _strip_think(text)
    fence = FENCE.search(body)
    if fence and "{" in fence.group(1):  # not a stray fence after the object
        body = fence.group(1)
    body = body.strip()
    if not body:
        raise ReplyError("empty", "the reply is empty")
    start = body.find("{")
    if start < 0:
        raise ReplyError("not_json", "the reply holds no JSON object")
    try:
        obj, _ = json.JSONDecoder().raw_decode(body, start)
    except json.JSONDecodeError as exc:
        if _unfinished(body, start):
            raise ReplyError("truncated", "the JSON object is cut off before its end") from None
        raise ReplyError("not_json", f"invalid JSON: {exc.msg} (char {exc.pos})") from None
    except RecursionError:
        raise ReplyError("too_deep", "the JSON is nested too deeply to read") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise ReplyError("not_json", f"invalid JSON: {str(exc)[:200]}") from None
    if _depth_over(obj, max_depth):
        raise ReplyError("too_deep", f"the JSON is nested deeper than {max_depth} levels")
    return obj  # raw_decode at a "{" returns a dict


def parse_reply(text: str, schema: type[S], *, max_chars: int = 100_000, max_depth: int = 32) -> S:
    """A reply as ``schema``: strict (no coercion of "5" to 5), with the schema's own checks."""
    obj = extract_object(text, max_chars=max_chars, max_depth=max_depth)
    try:
        return schema.model_validate_json(json.dumps(obj), strict=True)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'the object'}: {e['msg']}" for e in exc.errors()[:4]
        )
        more = f" (and {exc.error_count() - 4} more)" if exc.error_count() > 4 else ""
        message = f"the object does not match the schema: {problems}{more}"
        raise ReplyError("schema", message) from None


# ------------------------------------------------------------------ the teacher


class TeacherRejected(ModelBehaviorError):
    """The teacher gave no usable answer in ``attempts`` tries. ``reason`` is the last try's
    :data:`ReplyProblem`; ``raw_text`` its reply (cut to ``keep_raw_chars``)."""

    def __init__(
        self, prompt: str, reason: ReplyProblem, raw_text: str, detail: str, attempts: int
    ) -> None:
        super().__init__(f"{prompt}: no usable answer in {attempts} tries ({detail})")
        self.prompt = prompt
        self.reason: ReplyProblem = reason
        self.raw_text = raw_text
        self.detail = detail
        self.attempts = attempts

    @property
    def code(self) -> str:
        """``<prompt name>:<reason>``, e.g. ``tasks_judge:schema``: a rejection reason."""
        return f"{self.prompt}:{self.reason}"


class TeacherConfig(BaseModel):
    """How the teacher asks and how much of a bad reply it puts up with."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(3, ge=1, description="teacher calls per question, retries included")
    max_reply_chars: int = Field(100_000, ge=100, description="longer replies are not parsed")
    max_depth: int = Field(32, ge=2, description="deeper JSON nesting is refused")
    keep_raw_chars: int = Field(20_000, ge=0, description="raw text kept in a rejection")
    feedback_chars: int = Field(4_000, ge=0, description="of a bad reply, sent back on retry")
    prompt_versions: dict[str, int] = Field(
        default_factory=dict, description="pin a template version by name (default: newest)"
    )
    prompts_dir: Path | None = Field(None, description=f"templates (default {PROMPTS_DIR})")


@dataclass(frozen=True)
class Answer(Generic[S]):
    value: S
    raw: str
    attempts: int
    prompt: Prompt


CUT = "\n…[{:,} chars cut]"  # after what is kept of a reply
RETRY = (
    "Your reply could not be used: {error}. Reply again with only the JSON object that the "
    "instructions above ask for, with exactly the fields and types they name, and nothing else."
)


class Teacher:
    """Render a versioned prompt, call the model, return a validated object (see the module)."""

    def __init__(self, model: Model, config: TeacherConfig | None = None) -> None:
        self.model = model
        self.config = config or TeacherConfig()
        self.usage: Usage = {}
        self._prompts: dict[str, Prompt] = {}

    def prompt(self, name: str) -> Prompt:
        if name not in self._prompts:
            directory = self.config.prompts_dir or PROMPTS_DIR
            self._prompts[name] = find_prompt(
                name, self.config.prompt_versions.get(name), directory
            )
        return self._prompts[name]

    def render(self, name: str, **variables: Any) -> str:
        return render_prompt(self.prompt(name), **variables)

    def fingerprint(self, prompts: tuple[str, ...]) -> dict[str, Any]:
        """What a stage's results depend on in the teacher besides the model and sampling."""
        c = self.config
        return {
            "prompts": {self.prompt(n).ref: self.prompt(n).sha for n in prompts},
            "max_attempts": c.max_attempts,
            "max_reply_chars": c.max_reply_chars,
            "max_depth": c.max_depth,
        }

    def _count(self, ref: str, prompt_tokens: int, completion_tokens: int) -> None:
        count = TokenCount(
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, calls=1
        )
        add_usage(self.usage, ref, count)
        count_usage(ref, count)

    async def ask(self, name: str, schema: type[S], **variables: Any) -> Answer[S]:
        """One question: render ``name`` with ``variables``, return the reply as ``schema``.
        Raises :class:`TeacherRejected` after ``max_attempts`` unusable replies; endpoint
        failures (:class:`~astra_agent.model.EndpointError`) propagate."""
        prompt = self.prompt(name)
        c = self.config
        text = self.render(name, **variables)
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
        error = ReplyError("empty", "no reply")
        raw = ""
        for attempt in range(1, c.max_attempts + 1):
            turn = await self.model.complete(messages)
            self._count(prompt.ref, turn.prompt_tokens, turn.completion_tokens)
            raw = turn.content
            try:
                value = parse_reply(raw, schema, max_chars=c.max_reply_chars, max_depth=c.max_depth)
                return Answer(value, raw, attempt, prompt)
            except ReplyError as exc:
                error = exc
                if exc.problem != "truncated" and turn.finish_reason == "length":
                    error = ReplyError("truncated", f"{exc} (the reply hit max_tokens)")
            log.debug("%s: attempt %d unusable: %s", prompt.ref, attempt, error)
            shown = cut_text(raw, c.feedback_chars, CUT) or "(empty)"
            messages += [
                {"role": "assistant", "content": shown},
                {"role": "user", "content": RETRY.format(error=error)},
            ]
        raise TeacherRejected(
            name, error.problem, cut_text(raw, c.keep_raw_chars, CUT), str(error), c.max_attempts
        )


def teacher_provenance(config: ModelConfig, served: str) -> dict[str, Any]:
    """The teacher as provenance records it: the served model and its sampling."""
    info: dict[str, Any] = {
        "model": served,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": config.top_k,
        "min_p": config.min_p,
        "max_tokens": config.max_tokens,
    }
    if config.extra_body:
        info["extra_body"] = config.extra_body
    return info
