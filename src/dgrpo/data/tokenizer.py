"""A small word-level tokenizer for the built-in task, trained locally with the `tokenizers` library.

Words and the first digit of a number keep their leading space (``▁with``, ``▁1``), digits are split one per
token (so numbers of any size are representable), punctuation and ``\\n`` are tokens of their own, and decoding
restores the text exactly. Saved and loaded as a Hugging Face ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def train_word_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """Train a WordLevel tokenizer on ``texts``; pad/eos/unk are ids 0/1/2; left padding."""
    tok = Tokenizer(models.WordLevel(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True),
            pre_tokenizers.Split(Regex(r"▁?\d|<<|>>|####|[^\w▁]"), behavior="isolated"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tok.train_from_iterator(texts, trainer=trainers.WordLevelTrainer(special_tokens=[PAD, EOS, UNK]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    fast.padding_side = "left"
    return fast
