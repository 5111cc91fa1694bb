"""Reproducible CPU training of the bundled tiny models (tokenizer, target, draft, PRM)."""
