"""Models: the lean decoder (``decoder``), its chunked LM head (``lm_head``), Hugging Face
directory loading and the tiny model builder (``loading``)."""

LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3")
"""The ``config.model_type`` values the lean decoder runs (:func:`reasonrl.models.decoder.unsupported_reason`
names what else it needs); read without torch by the memory estimate."""
