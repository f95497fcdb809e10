"""Models: the lean decoder (``decoder``), Hugging Face directory loading and the tiny model builder (``loading``)."""
