"""SSR on a speculating vLLM server against the baselines that mean something there.

    python -m engine.tools.served_bench --plain-url http://127.0.0.1:8102 --suffix-url http://127.0.0.1:8101 \\
        --dataset bundled-classes --limit 12 --out served.json [--model tiny-reasoner] [run settings]

Per problem, interleaved: (A) plain decoding on a server that does not speculate, (B) plain
decoding on the server that runs vLLM's suffix speculation (its speculation alone), (C) SSR on that
server (its drafts as the server's material, ``engine.remote.served``). Before B and C, ``--isolate``
short unrelated requests push earlier outputs out of the server's suffix cache (start it with
``suffix_decoding_max_cached_requests`` at most that many), so each answer sees only its own run's
drafts. Reported: the median of per-problem ratios C / A (end to end), C / B (the answer phase)
and B / A, C / A over the reasoning (the server's speculation alone, and with SSR's drafts beside it),
forward passes for the answer (one per engine step: answer tokens less the proposed tokens the
server accepted), and whether every answer is the same.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from engine.benchmarks.summary import iqr
from engine.registry import decoder
from engine.remote.client import BackendError
from engine.runtime.model import ModelLoadError
from engine.tools.bench import add_source_args, problems_from_args
from engine.wiring import Server, load_role, run_config

JUNK = "Name three colours of the rainbow, then count to ten in words."


def answer_passes(stats) -> int:
    """Forward passes the server spent on the answer: one per engine step."""
    return stats.answer_tokens - stats.server.accepted


def isolate(lm, n: int) -> None:
    """``n`` short unrelated requests on ``lm``'s server: earlier outputs leave its suffix cache."""
    for i in range(n):
        list(lm.client.stream(lm.prompt_ids(f"{JUNK} ({i})"), 48, lm.eos_ids))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.served_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-reasoner", help="the served model (its tokenizer, here)")
    ap.add_argument("--plain-url", required=True, help="a vLLM server of --model without speculation")
    ap.add_argument("--suffix-url", required=True, help="a vLLM server of --model with --speculative-config "
                    "'{\"method\": \"suffix\", ...}' and --per-request-spec-decode-metrics detailed")
    ap.add_argument("--isolate", type=int, default=2, help="unrelated requests before each run on the suffix server")
    ap.add_argument("--draft-start", type=int, default=None)
    ap.add_argument("--num-drafts", type=int, default=None)
    ap.add_argument("--draft-interval", type=int, default=None)
    ap.add_argument("--max-draft", type=int, default=None)
    ap.add_argument("--out", required=True)
    add_source_args(ap)
    args = ap.parse_args(argv)
    try:
        flags = {k: getattr(args, k) for k in ("draft_start", "num_drafts", "draft_interval", "max_draft")
                 if getattr(args, k) is not None}
        cfg = run_config(args.model, flags)
        problems, dataset = problems_from_args(args)
        plain = load_role(args.model, server=Server(args.plain_url))
        suffix = load_role(args.model, server=Server(args.suffix_url, speculation="suffix"))
    except (ValueError, ModelLoadError, BackendError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    runs = []
    list(decoder("baseline", plain)(problems[0].prompt, cfg))  # warm-up, untimed
    list(decoder("ssr", suffix)(problems[0].prompt, cfg))
    for p in problems:
        a = list(decoder("baseline", plain)(p.prompt, cfg))[-1]
        isolate(suffix, args.isolate)
        b = list(decoder("baseline", suffix)(p.prompt, cfg))[-1]
        isolate(suffix, args.isolate)
        c = list(decoder("ssr", suffix)(p.prompt, cfg))[-1]
        row = {"id": p.id, "same": a.answer_ids == b.answer_ids == c.answer_ids and a.reasoning_ids == c.reasoning_ids,
               "plain_s": a.stats.wall_s, "suffix_s": b.stats.wall_s, "ssr_s": c.stats.wall_s,
               "plain_answer_s": a.stats.answer_s, "suffix_answer_s": b.stats.answer_s, "ssr_answer_s": c.stats.answer_s,
               # the reasoning (its prefill included): where the server's own speculation and SSR's drafts act first
               **{f"{k}_reasoning_s": r.stats.prefill_s + r.stats.reasoning_s for k, r in (("plain", a), ("suffix", b),
                                                                                            ("ssr", c))},
               "plain_passes": a.stats.answer_tokens, "suffix_passes": answer_passes(b.stats),
               "ssr_passes": answer_passes(c.stats), "ssr_note": c.stats.server.note, "suffix_note": b.stats.server.note}
        runs.append(row)
        print(f"{p.id:>16}: plain {row['plain_s']:.3f}s  suffix {row['suffix_s']:.3f}s  ssr {row['ssr_s']:.3f}s  "
              f"answer passes {row['plain_passes']} / {row['suffix_passes']} / {row['ssr_passes']}  "
              f"same={row['same']}" + (f"  note: {row['ssr_note']}" if row["ssr_note"] else ""), flush=True)

    def ratio(num: str, den: str) -> tuple[float, tuple[float, float]]:
        xs = [r[num] / r[den] for r in runs if r[den]]
        return statistics.median(xs), iqr(xs)

    summary = {"dataset": dataset, "problems": len(runs), "all_same": all(r["same"] for r in runs),
               "ssr_over_plain_end_to_end": ratio("ssr_s", "plain_s"),
               "suffix_over_plain_end_to_end": ratio("suffix_s", "plain_s"),
               "ssr_over_suffix_answer": ratio("ssr_answer_s", "suffix_answer_s"),
               "ssr_over_plain_answer": ratio("ssr_answer_s", "plain_answer_s"),
               "suffix_over_plain_reasoning": ratio("suffix_reasoning_s", "plain_reasoning_s"),
               "ssr_over_plain_reasoning": ratio("ssr_reasoning_s", "plain_reasoning_s"),
               **{f"median_{k}_passes": statistics.median(r[f"{k}_passes"] for r in runs) for k in ("plain", "suffix", "ssr")}}
    Path(args.out).write_text(json.dumps({"config": cfg.to_dict(), "runs": runs, "summary": summary}, indent=1))
    for k, v in summary.items():
        print(f"{k}: {v[0]:.3f} (IQR {v[1][0]:.2f}-{v[1][1]:.2f})" if isinstance(v, tuple) else f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
