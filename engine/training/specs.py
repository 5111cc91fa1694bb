"""What each bundled model is: the data it trains on, its shape and its schedule (read by
``train`` to build and train it, and by ``evaluate`` to know which models there are)."""

from __future__ import annotations

from typing import NamedTuple


class Spec(NamedTuple):
    kind: str  # the data it trains on: "target", "draft" or "prm"
    arch: dict
    rows: int  # rows of ROW_LEN packed tokens per batch
    peak_lr: float
    total: int  # steps planned (the schedule's length)
    warmup: int = 300
    verdict_weight: float = 1.0  # loss weight of the PRM's + / - targets against its LM targets


SPECS = {
    "tiny-reasoner": Spec("target", dict(hidden_size=192, num_hidden_layers=6, num_attention_heads=6,
                                         num_key_value_heads=3, intermediate_size=576), 12, 2e-3, 6500),
    "tiny-reasoner-draft": Spec("draft", dict(hidden_size=96, num_hidden_layers=2, num_attention_heads=3,
                                              num_key_value_heads=3, intermediate_size=288), 8, 3e-3, 2200),
    # deeper and narrower than the draft (its word-level vocabulary is small), same size budget
    "tiny-prm": Spec("prm", dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=4, intermediate_size=192), 8, 2e-3, 27000,
                     warmup=200, verdict_weight=3.0),
}
