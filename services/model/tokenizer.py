"""Byte-level BPE tokenizer trained locally, wrapped so ``AutoTokenizer`` can load it.

Byte-level means every UTF-8 byte has a token, so any text (accents, CJK, emoji) encodes
without an unknown token and decodes back exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from services.model.chat import ASSISTANT, CHAT_TEMPLATE, EOT, SYSTEM, USER

# Order fixes the ids: <|endoftext|> is 0, the role markers 1-3, then the 256 bytes.
SPECIAL_TOKENS: tuple[str, ...] = (EOT, SYSTEM, USER, ASSISTANT)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE with ``vocab_size`` entries (special tokens included) on ``texts``."""
    tokenizer = Tokenizer(models.BPE())
    # add_prefix_space=False: text is encoded as written, so decode(encode(s)) == s.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps offsets exact (transformers uses them for assistant masks).
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, even those the corpus never uses (emoji, CJK): without them
        # such text would be dropped, not merely split into bytes.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer, max_positions: int) -> PreTrainedTokenizerFast:
    """Wrap a trained ``tokenizers.Tokenizer`` as a transformers tokenizer with chat template.

    ``<|endoftext|>`` serves as bos, eos and pad; the role markers are extra special tokens,
    so ``decode(..., skip_special_tokens=True)`` drops them from generated text.
    """
    # In transformers 5 `PreTrainedTokenizerFast` is an alias of `TokenizersBackend`; the
    # saved tokenizer_config.json names the latter, which AutoTokenizer resolves directly.
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        extra_special_tokens=[SYSTEM, USER, ASSISTANT],
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_positions,
        # The default clean-up rewrites " ." as "." and so on, which breaks exact round trips.
        clean_up_tokenization_spaces=False,
    )
