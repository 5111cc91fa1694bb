"""The bundled tokenizers.

* :func:`build_tokenizer`: the reasoners' byte-level BPE, with a Qwen3-style chat template and think
  markers. Digits are split one per token (generation generalises better), the think markers and
  the chat delimiters are single special tokens.
* :func:`build_prm_tokenizer`: the PRM's own word-level tokenizer, in which every number is one
  token. A PRM reads text, not the reasoner's ids (math-shepherd's PRM has a Mistral tokenizer), so
  it may tokenize as suits its job. Checking ``38 plus 42 is 80`` then compares three tokens at
  fixed distances. With one token per digit, PRMs of the same size had to line digits up across
  carries and plateaued at AUROC 0.74-0.76 over thousands of steps; with one token per number a
  pilot passed 0.8 in under 2,000 steps (docs/BENCHMARKS.md).

``ки`` is the math-shepherd step tag in both.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
STEP_TAG = "ки"

# Qwen3-style: the generation prompt opens the think block; enable_thinking=False closes it.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{ '<think>\\n' }}{%- endif %}{%- endif %}"
)


def build_tokenizer(corpus: list[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` and wrap it as a transformers fast tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.add_tokens([STEP_TAG])
    fast.chat_template = CHAT_TEMPLATE
    return fast


# whitespace separates pieces; a piece splits into numbers, words and single punctuation marks
PRM_PIECES = r"\d+|[^\W\d_]+|[^\w\s]|_"
PRM_SPECIAL = ["[PAD]", "[UNK]"]


def prm_pre_tokenizer():
    return pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(PRM_PIECES), behavior="isolated")]
    )


def build_prm_tokenizer(corpus: list[str], max_number: int = 1100) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``corpus``'s pieces plus every number below ``max_number``, the
    verdict tokens ``+`` / ``-`` and the step tag; anything else reads as ``[UNK]``. Whitespace
    only separates, so encoding a PRM input step by step gives the same ids as encoding it whole
    (the incremental scorer relies on that)."""
    pre = prm_pre_tokenizer()
    words = {w for text in corpus for w, _ in pre.pre_tokenize_str(text)}
    words |= {str(n) for n in range(max_number)} | {"+", "-", STEP_TAG}
    vocab = {w: i for i, w in enumerate(PRM_SPECIAL + sorted(words - set(PRM_SPECIAL)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
