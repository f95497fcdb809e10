"""A character-level tokenizer built with `tokenizers`, saved as a Hugging Face tokenizer.

Vocabulary: ``<pad>`` (0), ``<eos>`` (1), ``<unk>`` (2), newline, then printable ASCII.
Saved with ``save_pretrained`` so that ``AutoTokenizer.from_pretrained(dir)`` loads it
exactly like any other local Hugging Face tokenizer.

Its chat template (:data:`CHAT_TEMPLATE`) joins the message contents and adds no generation
prompt: the embedded tasks feed the raw question text, so a chat-format tool asking for
``[{"role": "user", "content": q}]`` with the generation prompt gets ``q``, the training prompt.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARACTERS = ["\n"] + [c for c in string.printable if c.isprintable()]
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
"""The message contents joined, no role markers and no generation prompt: the embedded prompt."""


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The embedded character-level tokenizer, with :data:`CHAT_TEMPLATE`."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=512,
        chat_template=CHAT_TEMPLATE,
    )
