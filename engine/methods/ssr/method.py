"""SSR's methods as the registry lists them: ``ssr`` (drafts from a partial chain of thought, lookups,
suffix recovery) and its ablation ``ssr-lookups`` (the same loop without drafts)."""

from __future__ import annotations

from functools import partial

from engine.methods.contract import STUDIO, Method
from engine.methods.ssr.loop import decode_ssr

LOOKUPS = Method("ssr-lookups", "SSR lookups alone", "SSR's loop with its lookups alone, no drafts: the ablation that "
                 "says what SSR's drafts add", start=lambda m: partial(decode_ssr, m.target, method="ssr-lookups",
                                                                       drafts=False, evidence=m.evidence),
                 ssr_loop=True, studio=("compare", "benchmark"), color="#7dd3fc")
SSR = Method("ssr", "SSR", "self-speculative reasoning: drafts forked from a partial chain of thought, verified "
             "against the model, with lookups and suffix recovery (token-identical to baseline)",
             start=lambda m: partial(decode_ssr, m.target, evidence=m.evidence), drafts=True, ssr_loop=True, server="", studio=STUDIO,
             color="#2563eb")
METHODS = (LOOKUPS, SSR)
