"""The table in docs/SSR.md ("Families"): what the capability probe and exact mode's self-check
measure on each tiny family model of ``tests/families.py``, in float32 on this CPU.

    python -m tests.family_table            # every family (a few minutes on 2 cores)
    python -m tests.family_table jamba gpt2
"""

from __future__ import annotations

import sys

import torch

from engine.runtime.exact import invariance
from engine.runtime.probe import capabilities
from tests.families import FAMILIES, family_model


def row(family: str) -> str:
    lm = family_model(family, dtype=torch.float32)
    caps = capabilities(lm)
    failed = caps.failed()
    if caps.failed(rollbacks=False):
        ssr = "plain decoding refused: " + "; ".join(map(str, caps.failed(rollbacks=False)))
    elif failed:
        ssr = "refused: " + "; ".join(map(str, failed))
    else:
        ssr = "one token per step" if caps.one_token_steps else "k tokens per forward"
    try:
        inv = invariance(lm)
        exact = "bitwise" if inv.exact else f"refused: {inv}"
        exact_s = f"{inv.seconds:.1f}"
    except ValueError as err:
        exact, exact_s = f"refused: {err}", "-"
    return f"| {family} | {lm.layout.kind} | {ssr} | {exact} | {caps.seconds:.2f} | {exact_s} |"


def main(argv: list[str]) -> None:
    print("| family | cache | SSR (probe) | exact mode (self-check, fp32) | probe s | self-check s |")
    print("|---|---|---|---|---|---|")
    for family in argv or FAMILIES:
        print(row(family), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
