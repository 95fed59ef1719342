"""The built-in task's tokenizer: a byte-level BPE trained locally with the `tokenizers` library.

Its pipeline is exactly Qwen2's (NFC, Qwen2's pre-tokenizer regex, byte-level BPE, byte-level decoder), so a
checkpoint of the built-in task's Qwen2-architecture model loads back with plain
``transformers.AutoTokenizer.from_pretrained`` (which always builds a ``Qwen2Tokenizer`` for that model type)
and encodes and decodes exactly as it was trained; Llama and GPT-2 architectures load it as saved. Trained on
the task's text with a vocabulary large enough that every word is one token (``ĠAdd``); digits are one token
each (Qwen2's regex splits numbers into digits, and the space before a number is a token of its own), so
numbers of any size are representable and every operation of the task (``Add 4.``) is four tokens.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
#: Qwen2's pre-tokenizer regex (transformers' Qwen2Tokenizer), so that AutoTokenizer reproduces this tokenizer
QWEN2_PRETOKENIZE = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_task_tokenizer(texts: list[str], vocab_size: int = 4000) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE on ``texts``; pad/eos/unk are ids 0/1/2; left padding."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, UNK],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    fast.padding_side = "left"
    return fast
