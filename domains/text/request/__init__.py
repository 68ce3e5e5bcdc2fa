"""What a request is made of: its inputs (``inputs.py``: prompts, masks, chat, encoder inputs), its
generation settings (``settings.py``: arguments over a ``GenerationConfig``), the sampling transforms
(``sampling.py``: temperature, top-k/p, min-p, typical) and logits processors (``processors.py``),
stop strings and incremental decoding (``strings.py``), its committed tokens (``tokens.py``), the
stream of its rounds (``streaming.py``), progress bars (``progress.py``) and its output
(``output.py``)."""
