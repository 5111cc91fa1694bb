"""Benchmarks: problems from a dataset or a local file, graded answers, and the interleaved runs and
summaries that the bench CLI (``engine.tools.bench``) and the studio's Benchmark tab share.

* ``problems``: where the problems come from (a Hugging Face dataset through ``datasets``, a local
  JSON lines / JSON / CSV / Parquet file) and how a row becomes a prompt and a reference (presets
  for GSM8K, MATH-500, MATH, or a field mapping);
* ``grading``: how an answer is graded, by task (math with ``math-verify`` in a bounded worker,
  multiple choice by letter, code and free text by agreement with baseline, a user's function);
* ``runner``: the methods one after another on each problem, every run logged;
* ``summary``: per method, accuracy with a Wilson interval, latencies with their spread, ratios to
  baseline (median of per-problem ratios), SSR's tokens per verify, RSD's steps kept.
"""
