"""The training template and the loss mask: exactly the assistant's tokens, same ids as serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from astra_agent.errors import ConfigError
from serving.tiny import TEMPLATE_PATH
from training import template as tpl
from training.template import (
    DataError,
    check_matches_serving,
    serving_template,
    split_turns,
    tokenize,
    training_template,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Time in a zone.",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
]


def call(name: str, args: Any, cid: str = "c") -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def tool(content: str, cid: str = "c") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": cid, "content": content}


def spans(tokenizer: Any, ids: list[int], mask: list[int]) -> list[str]:
    """The decoded runs of trained tokens, in order."""
    out, cur = [], None
    for i, m in enumerate([*mask, 0]):
        if m and cur is None:
            cur = i
        if not m and cur is not None:
            out.append(tokenizer.decode(ids[cur:i]))
            cur = None
    return out


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> Any:
    return tpl.load_tokenizer(tiny_tokenizer_dir)


def trained(tok: Any, messages: list[dict[str, Any]], tools: Any = TOOLS) -> list[str]:
    t = tokenize(tok, messages, tools)
    assert len(t.input_ids) == len(t.loss_mask) == t.num_tokens
    check_matches_serving(tok, messages, tools)
    served = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)
    assert t.input_ids == list(served["input_ids"])  # the ids vLLM prompts with
    return spans(tok, t.input_ids, t.loss_mask)


def test_training_template_is_derived_with_markers_around_the_reply(
    tiny_tokenizer_dir: Path,
) -> None:
    serving = serving_template(tiny_tokenizer_dir)
    assert serving == TEMPLATE_PATH.read_text(encoding="utf-8")
    train = training_template(serving)
    assert train.count("{%- generation %}") == 1 and train.count("{%- endgeneration %}") == 1
    assert train.index("'<|im_start|>assistant\\n' }}{%- generation %}") > 0
    assert "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}" in train
    assert (
        train.replace("{%- generation %}", "").replace(
            "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}", "{{- '<|im_end|>\\n' }}"
        )
        == serving
    )


def test_template_without_assistant_branch_or_with_it_in_a_macro_is_refused() -> None:
    with pytest.raises(ConfigError, match="assistant branch"):
        training_template("{%- for message in messages %}{{ message.content }}{%- endfor %}")
    in_macro = (
        "{%- macro turn(m) %}{%- if m.role == 'x' %}{%- elif message.role == 'assistant' %}"
        "{{- '<|im_start|>assistant\\n' }}{{ m.content }}{{- '<|im_end|>\\n' }}{%- endif %}"
        "{%- endmacro %}"
    )
    with pytest.raises(ConfigError, match="macro"):
        training_template(in_macro)
    with pytest.raises(ConfigError, match="already"):
        training_template(training_template(TEMPLATE_PATH.read_text(encoding="utf-8")))


def test_multi_step_loop_with_parallel_calls_reasoning_and_errors(tok: Any) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Time and weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Two calls at once.",
            "tool_calls": [
                call("get_time", '{"tz": "Europe/Paris"}', "a"),
                call("get_weather", {"city": "Paris"}, "b"),
            ],
        },
        tool("12:00", "a"),
        tool("error: weather service down", "b"),
        {
            "role": "assistant",
            "content": "Retrying.",
            "reasoning": "Retry the weather.",
            "tool_calls": [call("get_weather", '{"city": "Paris"}', "d")],
        },
        tool("sunny", "d"),
        {"role": "assistant", "content": "12:00 and sunny.", "reasoning_content": "Done."},
    ]
    assert trained(tok, msgs) == [
        '<think>\nTwo calls at once.\n</think>\n\n<tool_call>\n{"name": "get_time", "arguments": '
        '{"tz": "Europe/Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
        '"arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        '<think>\nRetry the weather.\n</think>\n\nRetrying.\n<tool_call>\n{"name": '
        '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
        "<think>\nDone.\n</think>\n\n12:00 and sunny.<|im_end|>",
    ]


def test_answer_without_tools_and_think_in_content(tok: Any) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet.\n</think>\n\nHello!"},
    ]
    assert trained(tok, msgs, None) == ["<think>\nGreet.\n</think>\n\nHello!<|im_end|>"]


def test_several_user_turns_are_split_and_each_reply_trained_once_with_reasoning(tok: Any) -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "Time in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "first",
            "tool_calls": [call("get_time", '{"tz": "Europe/Paris"}')],
        },
        tool("12:00"),
        {"role": "assistant", "content": "12:00.", "reasoning_content": "answer one"},
        {"role": "user", "content": "And Tokyo?"},
        {"role": "assistant", "content": "19:00.", "reasoning_content": "answer two"},
    ]
    # unsplit, only the last turn is trained (earlier reasoning is not rendered at all)
    assert trained(tok, msgs) == ["<think>\nanswer two\n</think>\n\n19:00.<|im_end|>"]
    parts = split_turns(msgs)
    assert parts == [msgs[:4], msgs]
    got = [trained(tok, p) for p in parts]
    assert got == [
        [
            '<think>\nfirst\n</think>\n\n<tool_call>\n{"name": "get_time", "arguments": {"tz": '
            '"Europe/Paris"}}\n</tool_call><|im_end|>',
            "<think>\nanswer one\n</think>\n\n12:00.<|im_end|>",
        ],
        ["<think>\nanswer two\n</think>\n\n19:00.<|im_end|>"],
    ]


def test_split_turns_skips_unanswered_turns_and_trailing_tool_messages() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "q1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_time", "{}")]},
        tool("x"),
    ]
    assert split_turns(msgs) == [msgs[:3]]
    tool_only_user = {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}
    assert (
        len(
            split_turns(
                [
                    msgs[0],
                    {"role": "assistant", "content": "a"},
                    tool_only_user,
                    {"role": "assistant", "content": "b"},
                ]
            )
        )
        == 1
    )


def test_nothing_to_train_is_an_error(tok: Any) -> None:
    with pytest.raises(DataError, match="no assistant token"):
        tokenize(tok, [{"role": "user", "content": "hi"}], None)
    with pytest.raises(DataError, match="no assistant token"):  # no query: no reasoning rendered
        tokenize(
            tok, [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], None
        )


def test_a_drifted_training_template_is_caught_with_a_diff(
    tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    real = tpl.training_template

    def drifted(serving: str) -> str:
        return real(serving).replace(
            "'<|im_end|>' }}{%- endgeneration %}", "'<|im_end|>!' }}{%- endgeneration %}"
        )

    monkeypatch.setattr(tpl, "training_template", drifted)
    with pytest.raises(DataError, match="first differing token"):
        check_matches_serving(tok, msgs, None)


@pytest.mark.integration
def test_serving_and_training_render_identically_over_the_arena_corpus(
    tok: Any, arena_corpus: Path
) -> None:
    """Every record of the replayed 24 training + 12 held-out arena tasks (real loop)."""
    records = [json.loads(x) for x in arena_corpus.read_text().splitlines()]
    assert len(records) == 36
    for rec in records:
        traj = rec["trajectory"]
        for conv in split_turns(traj["messages"]):
            check_matches_serving(tok, conv, traj["tools"])
            t = tokenize(tok, conv, traj["tools"])
            got = spans(tok, t.input_ids, t.loss_mask)
            replies = [m for m in conv if m["role"] == "assistant"]
            assert len(got) == len(replies)
            for text, m in zip(got, replies, strict=True):
                assert text.startswith(f"<think>\n{m['reasoning_content']}\n</think>\n\n")
                assert text.endswith("<|im_end|>") and text.count("<|im_end|>") == 1
                assert text.count("<tool_call>") == len(m.get("tool_calls") or [])
