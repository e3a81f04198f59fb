"""Copy-heavy turns: a request whose answer will repeat text the model generated earlier in the
conversation.

Why routing cares: SGLang's NGRAM drafter proposes tokens from one trie per server of the text
that server generated (prompts are not inserted; docs/twin.md, "NGRAM"), so a turn that asks for
an earlier answer back, changed, drafts well on the server that wrote that answer and nowhere else.
The gateway reads the request with its own rules, as it reads the domain (`policies.domain`):

- the last message is the user's and asks for earlier text back changed: a rewriting verb
  (rewrite, edit, update, fix, refactor, apply ..., return the full ...) and a word that points at
  earlier text (above, previous, your, it, this, the whole/full/updated ...), read in a window of
  its first and last `_WINDOW` characters;
- the latest assistant message before it, within the last `_LOOKBACK` messages, has substance:
  at least `MIN_SOURCE_CHARS` characters of text or tool-call arguments (an agent's file edit is
  text the model generated too).

Text the user pasted or a tool returned is not in any server's trie, so a rewrite of it is not a
copy turn here, and a rewrite request with no earlier answer is not one either. The structural
checks come first and are O(1) per message; the patterns run only on a candidate, over at most
2 x `_WINDOW` characters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from policies.prefix import HistoryMessage, answer_key, content_text, render_history, text_blocks

__all__ = ["MIN_SOURCE_CHARS", "conversation_keys", "copy_source", "rewrite_request"]

MIN_SOURCE_CHARS = 800  # ~200 tokens: below that a copy saves too few passes to matter
_WINDOW = 1000
_LOOKBACK = 8

_REWRITE = re.compile(
    r"\b(?:re-?write|revise|edit|refactor|modify|update|fix|change|rename|reformat|repeat|"
    r"apply (?:the|these|this|those|my|that)|return (?:the|it|them)|give (?:me )?(?:it|the \w+) back|"
    r"same (?:code|answer|text|file|thing) (?:but|with)|keep (?:the rest|everything else))",
    re.IGNORECASE,
)
_REFERENCE = re.compile(
    r"\b(?:above|previous|earlier|before|your|it|this|that|these|those|"
    r"(?:the )?(?:same|whole|full|complete|entire|updated|rest))\b",
    re.IGNORECASE,
)


def rewrite_request(text: str) -> bool:
    """Does this user message ask for earlier text back, changed?"""
    window = text if len(text) <= 2 * _WINDOW else text[:_WINDOW] + "\n" + text[-_WINDOW:]
    return _REWRITE.search(window) is not None and _REFERENCE.search(window) is not None


def copy_source(messages: Sequence[HistoryMessage]) -> int | None:
    """The index of the assistant message a copy-heavy last turn asks back (module docstring), or
    None when the request is not one."""
    n = len(messages)
    if n < 2 or messages[-1].role != "user":
        return None
    for i in range(n - 2, max(-1, n - 2 - _LOOKBACK), -1):
        m = messages[i]
        if m.role == "assistant":
            if _size(m) < MIN_SOURCE_CHARS:
                return None
            return i if rewrite_request(content_text(messages[-1].content)) else None
    return None


def _size(m: HistoryMessage) -> int:
    """Characters of text and tool-call arguments the message holds."""
    content = m.content
    size = len(content) if isinstance(content, str) else len(content_text(content))
    calls = m.tool_calls
    if isinstance(calls, list):
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else getattr(c, "function", None)
            args = fn.get("arguments") if isinstance(fn, dict) else getattr(fn, "arguments", None)
            if isinstance(args, str):
                size += len(args)
    return size


def conversation_keys(messages: Sequence[HistoryMessage], seed: int = 0) -> tuple[tuple[int, ...], int, int]:
    """A history's prefix chain (`policies.prefix.text_blocks` of `render_history`), its answer key
    (`RequestFeatures.prompt_key`) and, for a copy-heavy turn, the answer key of the request whose
    answer it asks back (`RequestFeatures.copy_of`; 0: none). That request's history was this one's
    messages before the source answer, rendered alike: its key comes from this chain and the
    rendering's length less that of the messages from the source on (a few, short beside it)."""
    rendered = render_history(messages)
    chain = text_blocks(rendered, seed)
    source = copy_source(messages)
    copy_of = 0
    if source is not None:
        before = len(rendered) - len(render_history(messages[source:]))
        if before >= 0:
            copy_of = answer_key(rendered[:before], chain, seed)
    return chain, answer_key(rendered, chain, seed), copy_of
