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

import json
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
    # the model can be asked for an answer alone (thinking off, :func:`chat_prompt_ids`): its template has a thinking
    # switch (Qwen3's enable_thinking), or (prompted) the engine does not ask it to reason
    switch: bool = field(default=True, compare=False)
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
    with ``</think>`` as text; else None (a base model: its whole output is the answer). A marker
    token's ``switch`` says whether the template turns thinking off (:func:`has_thinking_switch`)."""
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
                        prompted=not single, switch=not single or has_thinking_switch(tokenizer),
                        decode=None if single else _decoder(tokenizer))


def has_thinking_switch(tokenizer) -> bool:
    """Whether the chat template writes another generation prompt with ``enable_thinking=False`` than
    with ``True`` (Qwen3's: an empty think block, ``<think>\n\n</think>\n\n``): a template without
    the switch ignores it (and a model without a template has none)."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    turn = [_user("?")]
    try:
        on, off = (tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False, enable_thinking=think)
                   for think in (True, False))
    except TemplateError:
        return False
    return on != off


def answer_only_refusal(markers: ThinkMarkers | None, model_id: str) -> str | None:
    """Why ``model_id`` cannot be asked for an answer alone (thinking off), or None where it can: a
    model that reasons by a marker token through a template without a thinking switch (DeepSeek-R1-Distill's
    opens ``<think>`` itself), or without a template, always reasons. Thinking off is
    a no-op for a model without markers (it never reasons), and asks a prompted model no reasoning."""
    if markers is None or markers.switch:
        return None
    return (f"{model_id} cannot answer with thinking off: it reasons with an end-of-thinking token and its chat "
            "template has no thinking switch (enable_thinking), so it always reasons; run it with Thinking on")


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


ROLES = ("system", "user", "assistant")


class Conversation(str):
    """A user turn after earlier turns of the same chat, passed where a prompt goes (every decode loop
    hands its prompt to ``prompt_ids``, which templates all the turns). As a string it is the whole
    transcript, each turn as ``role: content`` (what the run log keeps and hashes, so every turn is
    kept and two conversations ending on the same question are two prompts); ``history`` holds the
    earlier turns (:func:`check_history`), ``user`` the new message. The template decides what of the
    history the model sees: Qwen3's drops an earlier assistant turn's ``reasoning_content``.

    >>> c = Conversation([{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5"}], "times 4?")
    >>> str(c)
    'user: 2+3?\\n\\nassistant: 5\\n\\nuser: times 4?'
    """

    history: tuple[dict, ...]
    user: str

    def __new__(cls, history, user: str):
        turns = check_history(history)
        self = super().__new__(cls, "\n\n".join(f"{m['role']}: {m['content']}" for m in (*turns, _user(user))))
        self.history, self.user = turns, user
        return self

    def __getnewargs__(self) -> tuple:  # a copy or a pickle is rebuilt from the turns, not from the transcript
        return self.history, self.user


def check_history(history) -> tuple[dict, ...]:
    """The earlier turns of a chat, checked: a list (or its JSON text) of messages ``{"role", "content"}``,
    role one of :data:`ROLES` (a system turn first only), content a string; an assistant turn may carry
    ``reasoning_content`` (a string: its reasoning, which the template may render). ValueError naming
    the message and what is wrong with it."""
    if isinstance(history, str):
        try:
            history = json.loads(history)
        except json.JSONDecodeError as err:
            raise ValueError(f"history is not JSON ({err.msg} at character {err.pos}): give a list of "
                             '{"role": ..., "content": ...} messages') from None
    if not isinstance(history, (list, tuple)):
        raise ValueError(  # noqa: TRY004 (the boundary's one error type: a client's bad input, caught as such)
            f"history must be a list of {{\"role\", \"content\"}} messages, not {type(history).__name__}")
    for i, m in enumerate(history):
        if not isinstance(m, dict):
            raise ValueError(f"history[{i}] must be a {{\"role\", \"content\"}} object, not {type(m).__name__}")  # noqa: TRY004
        if m.get("role") not in ROLES:
            raise ValueError(f"history[{i}]'s role must be one of {', '.join(ROLES)}, not {m.get('role')!r}")
        if m["role"] == "system" and i > 0:
            raise ValueError(f"history[{i}] is a system turn: a system turn comes first only")
        for key in ("content", "reasoning_content"):
            if key in m and not isinstance(m[key], str):
                raise ValueError(f"history[{i}]'s {key} must be a string, not {type(m[key]).__name__}")
        if "content" not in m:
            raise ValueError(f"history[{i}] has no content")
        if extra := sorted(set(m) - {"role", "content"} - ({"reasoning_content"} if m["role"] == "assistant" else set())):
            raise ValueError(f"history[{i}] has {', '.join(extra)}: a message holds role and content (an assistant's "
                             "also reasoning_content)")
    return tuple(dict(m) for m in history)


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def chat_prompt_ids(tok, markers: ThinkMarkers | None, user_text: str, thinking: bool = True,
                    model_id: str = "this model") -> list[int]:
    """The user message through the chat template with thinking on, after the earlier turns when
    ``user_text`` is a :class:`Conversation`; the think block is opened here when the template leaves
    it to the model (as Qwen3's does). A prompted model also gets the instruction to reason
    (:data:`PROMPTED_INSTRUCTION`) as its system turn (before a system turn's own text).

    ``thinking`` False (an answer alone): the template with ``enable_thinking=False`` (Qwen3's writes an
    empty think block) and no think block opened, a prompted model not asked to reason, a model without
    markers as with thinking on; ValueError naming ``model_id`` where the model always reasons
    (:func:`answer_only_refusal`)."""
    if not thinking and (why := answer_only_refusal(markers, model_id)):
        raise ValueError(why)
    history, user = (user_text.history, user_text.user) if isinstance(user_text, Conversation) else ((), user_text)
    turns = [*history, _user(user)]
    if getattr(tok, "chat_template", None):
        instructed = thinking and markers is not None and markers.prompted
        try:
            messages = _instructed(turns, "system") if instructed else turns
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                           enable_thinking=thinking)
        except TemplateError:  # a template without a system role: the instruction leads the first user turn
            if not thinking:  # (nothing of the engine's to move: the template refuses the conversation itself)
                raise
            text = tok.apply_chat_template(_instructed(turns, "user"), add_generation_prompt=True, tokenize=False,
                                           enable_thinking=True)
    elif history:
        raise ValueError("this model has no chat template: it takes one prompt, not a conversation")
    else:
        text = user + "\n"
    # a template writes the special tokens it wants; raw text gets the tokenizer's own (a base model's <bos>)
    ids = tok.encode(text, add_special_tokens=not getattr(tok, "chat_template", None))
    if thinking and markers is not None and markers.open_ids and not _ends_with_open(ids, markers.open_ids):
        ids = ids + list(markers.open_ids)
    return ids


def _instructed(turns: list[dict], role: str) -> list[dict]:
    """``turns`` with :data:`PROMPTED_INSTRUCTION` leading the first ``role`` turn (one made for it:
    a system turn where there is none)."""
    at = next((i for i, m in enumerate(turns) if m["role"] == role), None)
    if at is None:
        return [{"role": role, "content": PROMPTED_INSTRUCTION}, *turns]
    return [*turns[:at], {**turns[at], "content": f"{PROMPTED_INSTRUCTION}\n\n{turns[at]['content']}"}, *turns[at + 1:]]


def _ends_with_open(ids: list[int], open_ids: tuple[int, ...]) -> bool:
    """Whether the prompt already opened the think block (possibly followed by a newline)."""
    k = len(open_ids)
    return tuple(ids[-k:]) == open_ids or (k > 1 and tuple(ids[-k + 1 :]) == open_ids[:-1])
