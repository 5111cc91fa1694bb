"""Think markers: how a model's reasoning opens and closes, and where it closed.

A reasoning model (Qwen3, DeepSeek-R1-Distill, Gemma 4) has its end-of-thinking marker as one
special token: the reasoning ends at that token, whatever text stands around it. A chat model
without one (SmolLM2, Llama-3.x-Instruct, Gemma-3-it, Phi-3.5, ...) reasons when its template asks
it to (**prompted reasoning**): the instruction asks for the reasoning between ``<think>`` and
``</think>``, the assistant turn opens ``<think>\\n``, and the end marker is several tokens of text.

Where a prompted reasoning ends is decided on the text, never on token ids (decision, written
once here): reasoning token ``i`` closes it when the decoded reasoning up to and including token
``i`` contains ``</think>`` and up to token ``i - 1`` did not. So ``</``, ``think``, ``>`` closes it
at ``>``; ``</think>\\n\\n`` as one token closes it at that token; ``.</th`` ``ink>`` at ``ink>``;
whatever the split. Only a window of the last tokens is decoded (the marker's length in bytes:
every token carries at least one byte), so each check costs a few tokens' decoding. Budget
forcing feeds the marker's canonical tokens (the tokenizer's own split) and the template tail.

>>> m = find_markers(tok)                      # None for a model with neither a marker nor a chat template
>>> m.closes_at(reasoning_ids, len(reasoning_ids) - 1)   # did the newest reasoning token close it?
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from jinja2.exceptions import TemplateError

CLOSE_TEXT = "</think>"
PROMPTED_OPEN = "<think>\n"
# the instruction a prompted model gets, as its system turn (or before the user text, where the template has no system role)
PROMPTED_INSTRUCTION = ("Think step by step before you answer. Write your reasoning between <think> and </think>, "
                        "then write the final answer after </think>.")


@dataclass(frozen=True)
class ThinkMarkers:
    """A model's think markers (token ids as its tokenizer splits them) and the rule that finds
    where its reasoning closed."""

    open_ids: tuple[int, ...]  # what opens the think block, e.g. "<think>\n"
    marker_ids: tuple[int, ...]  # the end-of-thinking marker: one special token, or (prompted) its text's tokens
    tail_ids: tuple[int, ...]  # what the template puts after the marker, before the answer (e.g. "\n\n")
    close_text: str = CLOSE_TEXT
    prompted: bool = False  # no marker token: the template asks for reasoning, its end is found in the text
    decode: Callable[[list[int]], str] | None = field(default=None, compare=False, repr=False)

    @property
    def close_ids(self) -> tuple[int, ...]:
        """The marker, then the template tail: what a forced or forked end of thinking feeds."""
        return self.marker_ids + self.tail_ids

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens a server may stop the reasoning at: the marker token (a prompted marker is text,
        found by the client, which then ends the request)."""
        return frozenset() if self.prompted else frozenset(self.marker_ids)

    def closes_at(self, reasoning: Sequence[int], i: int) -> bool:
        """Whether reasoning token ``i`` closes the reasoning (``reasoning``: its tokens so far, the
        prompt excluded): the marker token itself, or (prompted) the token that completes the marker's
        text, however the model split it."""
        if not self.prompted:
            return reasoning[i] == self.marker_ids[0]
        width = len(self.close_text.encode())
        return self.close_text in self._text(reasoning, i, width) and \
            (i == 0 or self.close_text not in self._text(reasoning, i - 1, width))

    def reasoning_end(self, tokens: Sequence[int]) -> int | None:
        """How many of ``tokens`` (a reasoning, then maybe an answer) are reasoning, the closing
        marker included; None when they never close it."""
        return next((i + 1 for i in range(len(tokens)) if self.closes_at(tokens, i)), None)

    def before_close(self, context: Sequence[int], proposal: Sequence[int]) -> int:
        """How many of ``proposal``'s tokens can follow the reasoning ``context`` without closing it
        (a lookup proposal in the reasoning stops before the marker, as it stops before an end of
        sequence: the main row's own next token closes the reasoning, never a verified lookup)."""
        joined = [*context, *proposal]
        for j in range(len(proposal)):
            if self.closes_at(joined, len(context) + j):
                return j
        return len(proposal)

    def _text(self, tokens: Sequence[int], i: int, width: int) -> str:
        assert self.decode is not None, "prompted markers decode the reasoning to find their close"
        return self.decode(list(tokens[max(0, i - width + 1) : i + 1]))


def find_markers(tokenizer, preset=None) -> ThinkMarkers | None:
    """The think markers: the preset's (or ``<think>``/``</think>``) when the end marker is one
    token of the vocabulary; else, for a chat model (it has a chat template), prompted reasoning
    with ``</think>`` as text; else None (a base model: its whole output is the answer)."""
    open_text = preset.think_open if preset else PROMPTED_OPEN
    close_text = preset.think_close if preset else CLOSE_TEXT
    tail = preset.close_tail if preset else "\n\n"
    close = tokenizer.encode(close_text, add_special_tokens=False)
    single = len(close) == 1 and tokenizer.convert_ids_to_tokens(close[0]) not in (None, tokenizer.unk_token)
    if not single and not getattr(tokenizer, "chat_template", None):
        return None
    if not single:  # prompted reasoning, in the text
        open_text, close_text, tail = PROMPTED_OPEN, CLOSE_TEXT, "\n\n"
        close = tokenizer.encode(close_text, add_special_tokens=False)
    open_ids = tokenizer.encode(open_text, add_special_tokens=False)
    return ThinkMarkers(tuple(open_ids), tuple(close), tuple(_tail_ids(tokenizer, tail)), close_text,
                        prompted=not single, decode=None if single else _decoder(tokenizer))


def _decoder(tokenizer) -> Callable[[list[int]], str]:
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _tail_ids(tokenizer, tail: str) -> list[int]:
    """The tail's tokens as they come out when an answer follows it: byte-level tokenizers split
    whitespace differently before text ("\n" "\n" "Answer") than at the end of a string ("\n\n")."""
    if not tail:
        return []
    follower = tokenizer.encode("Answer", add_special_tokens=False)
    in_context = tokenizer.encode(tail + "Answer", add_special_tokens=False)
    if in_context[len(in_context) - len(follower):] == follower:
        return in_context[: len(in_context) - len(follower)]
    return tokenizer.encode(tail, add_special_tokens=False)


def chat_prompt_ids(tok, markers: ThinkMarkers | None, user_text: str) -> list[int]:
    """The user message through the chat template with thinking on; the think block is opened
    here when the template leaves it to the model (as Qwen3's does). A prompted model also gets
    the instruction to reason (:data:`PROMPTED_INSTRUCTION`) as its system turn."""
    if getattr(tok, "chat_template", None):
        messages = [{"role": "user", "content": user_text}]
        if markers is not None and markers.prompted:
            messages.insert(0, {"role": "system", "content": PROMPTED_INSTRUCTION})
        try:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True)
        except TemplateError:  # a template without a system role: the instruction leads the user's turn
            text = tok.apply_chat_template([{"role": "user", "content": f"{PROMPTED_INSTRUCTION}\n\n{user_text}"}],
                                           add_generation_prompt=True, tokenize=False, enable_thinking=True)
    else:
        text = user_text + "\n"
    # a template writes the special tokens it wants; raw text gets the tokenizer's own (a base model's <bos>)
    ids = tok.encode(text, add_special_tokens=not getattr(tok, "chat_template", None))
    if markers is not None and markers.open_ids and not _ends_with_open(ids, markers.open_ids):
        ids = ids + list(markers.open_ids)
    return ids


def _ends_with_open(ids: list[int], open_ids: tuple[int, ...]) -> bool:
    """Whether the prompt already opened the think block (possibly followed by a newline)."""
    k = len(open_ids)
    return tuple(ids[-k:]) == open_ids or (k > 1 and tuple(ids[-k + 1 :]) == open_ids[:-1])
