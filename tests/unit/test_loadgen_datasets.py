"""Datasets for realistic traffic: tools, sessions, user conversation files, thinking and temperature mixes;
bad input (a malformed file names its file and line; a conversation without a
user turn is skipped and counted)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from loadgen.client import RequestOptions, Target, build_body, settings
from loadgen.datasets import DatasetError, Message, Prompt, load_dataset
from tests.support import REPO

TARGET = Target(label="t", url="http://x", model="m")


def body(prompt: Prompt, opts: RequestOptions, index: int = 0) -> dict:
    return msgspec.json.decode(build_body(TARGET, prompt, opts, settings(prompt, opts, index)))


# --- bundled sets -------------------------------------------------------------------------------


def test_bundled_tools_set_has_valid_tools_and_does_not_force_length() -> None:
    ds = load_dataset("tools")
    assert len(ds.prompts) >= 10 and {p.domain for p in ds.prompts} == {"tools"}
    b = body(ds.prompts[0], RequestOptions())
    assert b["tools"][0]["type"] == "function" and b["tools"][0]["function"]["parameters"]["type"] == "object"
    assert "ignore_eos" not in b  # a tool call needs the model to stop
    assert "ignore_eos" in body(load_dataset("math").prompts[0], RequestOptions())
    assert "ignore_eos" in body(ds.prompts[0], RequestOptions(ignore_eos=True))  # an explicit choice wins


def test_bundled_sessions_are_multi_turn() -> None:
    ds = load_dataset("sessions")
    assert ds.is_sessions and len(ds.sessions) >= 10
    assert all(len(s.turns) >= 3 for s in ds.sessions)
    assert {s.domain for s in ds.sessions} == {"math", "code", "chat"}
    assert all(m.role == "system" for s in ds.sessions for m in s.system)
    assert len(load_dataset("sessions", max_turns=2).sessions[0].turns) == 2
    # warmup and single-request use take the first turns
    first = ds.take(1)[0]
    assert first.messages[-1] == Message("user", ds.sessions[0].turns[0])


def test_bundled_sets_are_apart_from_the_twins_calibration_prompts() -> None:
    from loadgen.conversations import builtin_sessions

    calib = REPO / "twin"
    calib_text = "\n".join(
        p.read_text(errors="replace")
        for p in calib.rglob("*")
        if p.is_file() and p.suffix in {".py", ".toml", ".jsonl", ".json", ".txt"}
    )
    sessions, _ = builtin_sessions()
    for text in [t for s in sessions for t in s.turns] + [p.messages[-1].text for p in load_dataset("tools").prompts]:
        assert text not in calib_text


# --- request options ----------------------------------------------------------------------------


def test_thinking_modes_and_temperature_mix() -> None:
    p = load_dataset("chat").prompts[0]
    assert "chat_template_kwargs" not in body(p, RequestOptions())
    assert body(p, RequestOptions(thinking="off"))["chat_template_kwargs"] == {"thinking": False}
    assert body(p, RequestOptions(thinking="on"))["chat_template_kwargs"] == {"thinking": True}
    mix = [body(p, RequestOptions(thinking="mix"), i)["chat_template_kwargs"]["thinking"] for i in range(4)]
    assert mix == [True, False, True, False]
    temps = [body(p, RequestOptions(temperatures=(0.0, 0.7, 1.0)), i)["temperature"] for i in range(6)]
    assert temps == [0.0, 0.7, 1.0, 0.0, 0.7, 1.0]
    own = msgspec.structs.replace(p, thinking=False, temperature=0.3, top_p=0.9)
    b = body(own, RequestOptions(thinking="on", temperatures=(1.0,)))
    assert b["chat_template_kwargs"] == {"thinking": False} and b["temperature"] == 0.3 and b["top_p"] == 0.9
    # completions carry no chat template: no thinking switch, no tools
    assert "chat_template_kwargs" not in body(p, RequestOptions(thinking="on", endpoint="completions"))


def test_continuous_usage_is_asked_for_by_default() -> None:
    p = load_dataset("chat").prompts[0]
    assert body(p, RequestOptions())["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body(p, RequestOptions(continuous_usage=False))["stream_options"] == {"include_usage": True}


# --- user files ---------------------------------------------------------------------------------


def test_openai_messages_jsonl_with_tools(tmp_path: Path) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            },
        }
    ]
    f = tmp_path / "agent.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "find x"}],
                    "tools": tools,
                    "tool_choice": "auto",
                    "thinking": False,
                    "temperature": 0.6,
                    "domain": "agent",
                },
                {
                    "messages": [
                        {"role": "user", "content": "call it"},
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                            ],
                        },
                        {"role": "tool", "tool_call_id": "c1", "content": "42"},
                    ],
                    "tools": tools,
                },
                {"messages": [{"role": "system", "content": "no user here"}]},
            ]
        )
        + "\n"
    )
    ds = load_dataset(f"jsonl:{f}")
    assert len(ds.prompts) == 2 and ds.skipped == {"no user turn": 1}
    b = body(ds.prompts[0], RequestOptions())
    assert b["tools"] == tools and b["tool_choice"] == "auto" and b["temperature"] == 0.6
    assert b["chat_template_kwargs"] == {"thinking": False}
    history = body(ds.prompts[1], RequestOptions())["messages"]
    assert history[1] == {
        "role": "assistant",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
    }
    assert history[2] == {"role": "tool", "content": "42", "tool_call_id": "c1"}


def test_sessions_from_sharegpt_and_openai_files(tmp_path: Path) -> None:
    f = tmp_path / "conv.json"
    f.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "system", "value": "sys"},
                        {"from": "human", "value": "h1"},
                        {"from": "gpt", "value": "the file's answer"},
                        {"from": "human", "value": "h2"},
                    ]
                },
                {"conversations": [{"from": "gpt", "value": "only the model speaks"}]},
                {
                    "messages": [
                        {"role": "user", "content": "u1"},
                        {"role": "assistant", "content": "a"},
                        {"role": "user", "content": "u2"},
                        {"role": "system", "content": "late"},
                        {"role": "user", "content": "  "},
                        {"role": "user", "content": "u3"},
                    ],
                    "domain": "math",
                },
            ],
            indent=1,
        )
    )
    ds = load_dataset(f"sessions:{f}")
    assert [s.turns for s in ds.sessions] == [("h1", "h2"), ("u1", "u2", "u3")]
    assert ds.sessions[0].system == (Message("system", "sys"),) and ds.sessions[1].domain == "math"
    assert ds.skipped == {"no user turn": 1, "system turn after a user turn": 1}
    first = load_dataset(f"sharegpt:{f}")  # the same file, first turns only
    assert [p.messages[-1].content for p in first.prompts] == ["h1", "u1"]


@pytest.mark.parametrize(
    ("name", "text", "where", "what"),
    [
        ("bad.jsonl", '{"prompt": "ok"}\n\n{"prompt": "x", "max_tokens": "many"}\n', ":3:", "max_tokens"),
        ("role.jsonl", '{"prompt": "ok"}\n{"messages": [{"role": "bot", "content": "x"}]}\n', ":2:", "'bot'"),
        (
            "tools.jsonl",
            '{"prompt": "a", "tools": [{"type": "function", "function": {"name": "bad name"}}]}\n',
            ":1:",
            "function name",
        ),
        (
            "schema.jsonl",
            '{"prompt": "a", "tools": [{"type": "function", "function": {"name": "f", "parameters": '
            '{"type": "object", "properties": {"x": {"type": "texte"}}}}}]}\n',
            ":1:",
            "'texte' is not valid under any of the given schemas at $.properties.x.type",
        ),
        (
            "req.jsonl",
            '{"prompt": "a", "tools": [{"type": "function", "function": {"name": "f", "parameters": '
            '{"type": "object", "properties": {}, "required": "y"}}}]}\n',
            ":1:",
            "'y' is not of type 'array' at $.required",
        ),
        (
            "choice.jsonl",
            '{"prompt": "a", "tool_choice": {"type": "function", "function": {"name": "g"}}}\n',
            ":1:",
            "'g'",
        ),
        ("temp.jsonl", '{"prompt": "a", "temperature": 7}\n', ":1:", "temperature"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, name: str, text: str, where: str, what: str) -> None:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(DatasetError) as e:
        load_dataset(f"jsonl:{f}")
    msg = str(e.value)
    assert f"{f}{where}" in msg and what in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ('[\n {"conversations": [{"from": "human", "value": "a"}]},\n {"conversations": [}\n]\n', 3, ""),
        (
            '[\n {"conversations": [{"from": "human", "value": "a"}]},\n\n {"conversations":\n'
            '   [{"from": "robot", "value": "b"}]}\n]\n',
            4,
            "'robot'",
        ),
        ('[{"conversations": [{"from": "human", "value": "a"}]},\n {"turns": []}]\n', 2, "conversations"),
        (
            '{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [{"role": "user"}], "top_p": 0}\n',
            2,
            "top_p",
        ),
    ],
)
def test_malformed_conversation_file_names_the_line_of_the_entry(
    tmp_path: Path, text: str, line: int, what: str
) -> None:
    f = tmp_path / "c.json"
    f.write_text(text)
    with pytest.raises(DatasetError) as e:
        load_dataset(f"sessions:{f}")
    assert f"{f}:{line}:" in str(e.value) and what in str(e.value)


def test_a_file_of_conversations_without_user_turns_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text('{"conversations": [{"from": "gpt", "value": "a"}]}\n')
    with pytest.raises(DatasetError, match=r"no conversation with a user turn \(1 without a user turn\)"):
        load_dataset(f"sessions:{f}")


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DatasetError, match=r"x\.jsonl:2: not UTF-8"):
        load_dataset(f"jsonl:{f}")


def test_invalid_utf8_in_a_conversation_file_names_the_entry_line(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_bytes(
        b'[\n {"conversations": [{"from": "human", "value": "a"}]},\n'
        b' {"conversations": [{"from": "human", "value": "\xff"}]}\n]\n'
    )
    with pytest.raises(DatasetError, match=r"(?i)c\.json:3: .*UTF-8"):
        load_dataset(f"sessions:{f}")
