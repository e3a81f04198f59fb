"""Conversation files: ShareGPT and OpenAI-messages conversations, as sessions or as first turns.

Two entry shapes, in a JSON array or one entry per line (JSONL), mixed freely:

- ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}, ...]}`
  (speakers: human / user; gpt / assistant / chatgpt / bing / bard / model; system);
- OpenAI messages: `{"messages": [{"role": "user", "content": "..."}, ...]}`.

Either may carry `domain`, `max_tokens`, `thinking`, `temperature`, `top_p` and `priority`. A
session keeps the system turns before the first user turn and every non-empty user turn in order;
the file's assistant turns are dropped, because the replay sends the answers the server actually
gave. A conversation with no user turn is skipped and counted, as is a system turn after the first
user turn (a replay cannot place it). A malformed entry stops the load with the file and the line
it starts on.
"""

from __future__ import annotations

import re
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from loadgen.datasets import (
    NO_USER_TURN,
    DatasetError,
    Message,
    Prompt,
    Session,
    check_messages,
    check_sampling,
    first_turn,
    read_bytes,
)

USER_SPEAKERS = frozenset({"human", "user"})
ASSISTANT_SPEAKERS = frozenset({"gpt", "assistant", "chatgpt", "bing", "bard", "model"})
SYSTEM_SPEAKERS = frozenset({"system"})
LATE_SYSTEM = "system turn after a user turn"


class _ShareGptTurn(msgspec.Struct):
    value: str
    from_: str = msgspec.field(name="from")


class _Entry(msgspec.Struct, forbid_unknown_fields=False):
    conversations: list[_ShareGptTurn] | None = None
    messages: list[Message] | None = None
    domain: str | None = None
    max_tokens: int | None = None
    thinking: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    priority: int | None = None


_entry_decoder = msgspec.json.Decoder(_Entry)
_raw_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def entries_with_lines(data: bytes, where: str) -> list[tuple[int, bytes]]:
    """The entries of a JSON array or JSONL file, each with the line it starts on (1-based). Bytes
    throughout: a ShareGPT dump runs to hundreds of MB, and a str of it would be 1-4x that again
    (invalid UTF-8 is caught where each entry is decoded, with its line)."""
    if data.lstrip()[:1] == b"[":
        try:
            raws = _raw_list_decoder.decode(data)
        except JSON_DECODE_ERRORS as e:
            raise DatasetError(f"{where}:{_line_of_error(data, e)}: {e}") from None
        out, pos = [], 0
        for raw in raws:
            chunk = bytes(raw)
            at = data.find(chunk, pos)  # entries appear in order: each search starts past the last
            pos = at + len(chunk)
            out.append((data.count(b"\n", 0, at) + 1, chunk))
        return out
    return [(n, line) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]


def _line_of_error(data: bytes, err: Exception) -> str:
    """msgspec reports syntax errors as a byte offset: turn it into a line number."""
    m = re.search(r"byte (\d+)", str(err))
    if not m:
        return "?"
    return str(data.count(b"\n", 0, int(m.group(1))) + 1)


def parse_sessions(
    data: bytes, where: str, *, default_domain: str, max_turns: int | None = None
) -> tuple[list[Session], Counter[str]]:
    sessions: list[Session] = []
    skipped: Counter[str] = Counter()
    for lineno, raw in entries_with_lines(data, where):
        at = f"{where}:{lineno}"
        try:
            entry = _entry_decoder.decode(raw)
        except JSON_DECODE_ERRORS as e:
            raise DatasetError(f"{at}: {e}") from None
        session = _session(entry, at, default_domain, skipped)
        if session is None:
            skipped[NO_USER_TURN] += 1
            continue
        if max_turns is not None and len(session.turns) > max_turns:
            session = msgspec.structs.replace(session, turns=session.turns[:max_turns])
        sessions.append(session)
    if not sessions:
        note = f" ({skipped[NO_USER_TURN]} without a user turn)" if skipped[NO_USER_TURN] else ""
        raise DatasetError(f"{where}: no conversation with a user turn{note}")
    return sessions, skipped


def _session(entry: _Entry, at: str, default_domain: str, skipped: Counter[str]) -> Session | None:
    if entry.conversations is not None:
        turns = [_speaker_role(t.from_, at, i) for i, t in enumerate(entry.conversations)]
        pairs = [(role, t.value) for role, t in zip(turns, entry.conversations, strict=True)]
    elif entry.messages is not None:
        check_messages(entry.messages, at)
        pairs = [(m.role, m.text) for m in entry.messages]
    else:
        raise DatasetError(f"{at}: expected 'conversations' (ShareGPT) or 'messages' (OpenAI)")
    check_sampling(
        at, max_tokens=entry.max_tokens, temperature=entry.temperature, top_p=entry.top_p, priority=entry.priority
    )
    system: list[Message] = []
    users: list[str] = []
    for role, content in pairs:
        if role in ("system", "developer"):
            if users:
                skipped[LATE_SYSTEM] += 1
            elif content.strip():
                system.append(Message(role, content))
        elif role == "user" and content.strip():
            users.append(content)
    if not users:
        return None
    return Session(
        system=tuple(system),
        turns=tuple(users),
        domain=entry.domain or default_domain,
        max_tokens=entry.max_tokens,
        thinking=entry.thinking,
        temperature=entry.temperature,
        top_p=entry.top_p,
        priority=entry.priority,
    )


def _speaker_role(speaker: str, at: str, index: int) -> str:
    s = speaker.lower()
    if s in USER_SPEAKERS:
        return "user"
    if s in ASSISTANT_SPEAKERS:
        return "assistant"
    if s in SYSTEM_SPEAKERS:
        return "system"
    raise DatasetError(
        f"{at}: conversations[{index}] has speaker {speaker!r} (expected human/user, gpt/assistant or system)"
    )


def load_sessions(path: Path, max_turns: int | None = None) -> tuple[list[Session], Counter[str]]:
    """`sessions:PATH`: every conversation of the file, replayed turn by turn."""
    return parse_sessions(read_bytes(path), str(path), default_domain="sessions", max_turns=max_turns)


def load_sharegpt(path: Path) -> tuple[list[Prompt], Counter[str]]:
    """`sharegpt:PATH`: the first user turn of each conversation, as single requests."""
    sessions, skipped = parse_sessions(read_bytes(path), str(path), default_domain="sharegpt")
    return [first_turn(s) for s in sessions], skipped


def builtin_sessions(max_turns: int | None = None) -> tuple[list[Session], Counter[str]]:
    data = resources.files("loadgen").joinpath("data", "sessions.jsonl").read_bytes()
    return parse_sessions(data, "<built-in sessions>", default_domain="chat", max_turns=max_turns)


def session_messages(session: Session, history: list[Message], turn: int) -> tuple[Message, ...]:
    """What turn `turn` sends: the system turns, the history so far, then its user message."""
    return (*session.system, *history, Message("user", session.turns[turn]))


def assistant_message(content: str, tool_calls: list[dict[str, Any]]) -> Message:
    """The server's answer as the history of the next turn."""
    return Message("assistant", content if content or not tool_calls else None, tool_calls=tool_calls or None)
