"""The method contract: what a decoding method declares, so that the bench CLI, the studio and the run
log can run it and show it without knowing its name.

A method is one module that builds a :class:`Method` record and hands it to the registry
(``engine.registry``: one line there for the methods that ship, or :func:`engine.registry.register` /
a file named in ``SSR_STUDIO_METHODS`` for one of your own). The record carries

* its names (``name`` in the run log and on the command line, ``label`` in the studio) and a one-line
  ``summary``;
* its traits, which everything else reads instead of lists of names: whether its output is ``exact``
  (greedy token-identical to plain decoding) or lossy by design, whether it writes ``drafts`` (a Draft
  pane), runs SSR's loop (``ssr_loop``: think markers, a draft start in the reasoning), writes whole
  reasoning steps (``steps``), which models beside the target it ``uses`` (a draft model, a PRM), and
  why it does not run on a vLLM server, on llama.cpp or with thinking off (empty where it does);
* where the studio offers it (``studio``: a mode of its own on the Run tab, a run in a Compare, a choice
  on the Benchmark tab);
* ``cells``: what the studio's strip adds for its finished run, from the run's ``RunStats``: (key,
  words) pairs, escaped where the strip draws them (None: nothing beyond every run's cells);
* ``start``: given the run's :class:`Models`, the decoder ``(prompt, cfg) -> events``. Events are the
  engine's spine (``engine.events``): phases, tokens with their status and source, forwards, and one
  final ``DoneEvent``; every consumer reads only those.

A worked example, a method in one file (docs/METHODS.md walks through ``engine/methods/sd.py``)::

    from functools import partial
    from engine.methods.baseline import decode_baseline
    from engine.methods.contract import Method

    METHOD = Method("my-plain", "My plain", "plain decoding under another name",
                    start=lambda m: partial(decode_baseline, m.target))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from engine.config import RunConfig
from engine.events import Event, RunStats

Decoder = Callable[[str, RunConfig], Iterator[Event]]
IN_PROCESS = "in process only"  # the default: a method not offered on a vLLM server, for no reason of its own
STUDIO = ("run", "compare", "benchmark")  # where the studio can offer a method


@dataclass(frozen=True)
class Models:
    """The models of one run: the ``target``, and the ``draft`` model and the PRM ``scorer`` where the
    method uses them (``Method.uses``). ``writer``: how a step-writing method's models write a step (in
    process, or on their vLLM server: the registry's factory; None for the in-process default). ``evidence``:
    what SSR's loop has learned and learns on the target (``engine.methods.ssr.evidence.Evidence``; None:
    the target's own store; a shared studio passes the visitor's)."""

    target: Any
    draft: Any = None
    scorer: Any = None
    writer: Any = None
    evidence: Any = None


@dataclass(frozen=True)
class Method:
    """A decoding method as the bench, the studio and the run log know it (see the module docstring)."""

    name: str
    label: str
    summary: str
    start: Callable[[Models], Decoder]
    exact: bool = True  # greedy output token-identical to baseline's; False: lossy by design, never called exact
    drafts: bool = False  # it writes drafts: something to show in a Draft pane
    ssr_loop: bool = False  # SSR's loop: it needs think markers and reads the draft-start settings
    steps: bool = False  # it writes whole reasoning steps: one budget for the whole response (RSD's family)
    uses: tuple[str, ...] = ()  # models beside the target: "draft", "prm"
    server: str = IN_PROCESS  # why it is not offered on a vLLM server; "" where it runs there
    llama: str = ""  # why it does not run on the llama.cpp runtime; "" where it does
    thinking_off: str = ""  # why it does not run with thinking off (the answer alone); "" where it does
    studio: tuple[str, ...] = ()  # where the studio offers it: any of STUDIO
    color: str = "#888888"  # its colour in the charts (History, Compare, the Benchmark tab)
    cells: Callable[[RunStats], list[tuple[str, str]]] | None = None  # the strip's cells of its own, for a finished run

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").isalnum() or self.name != self.name.lower():
            raise ValueError(f"a method's name is lower-case letters, digits and '-' (not {self.name!r})")
        if not self.label.strip():
            raise ValueError(f"method {self.name!r} needs a label (its name in the studio)")
        if unknown := set(self.studio) - set(STUDIO):
            raise ValueError(f"method {self.name!r}: studio places are {', '.join(STUDIO)} (not {', '.join(unknown)})")
        if not (len(self.color) == 7 and self.color[0] == "#" and all(c in "0123456789abcdefABCDEF" for c in self.color[1:])):
            raise ValueError(f"method {self.name!r}: its color is '#rrggbb' (not {self.color!r})")
        if self.cells is not None and not callable(self.cells):
            raise ValueError(f"method {self.name!r}: its cells are a function of the run's stats (not {self.cells!r})")
        if unknown := set(self.uses) - {"draft", "prm"}:
            raise ValueError(f"method {self.name!r}: it may use a 'draft' and a 'prm' (not {', '.join(unknown)})")

    @property
    def plain(self) -> bool:
        """One model writes every token, unproposed: nothing to show beyond the reasoning and the answer."""
        return not self.drafts and not self.ssr_loop
