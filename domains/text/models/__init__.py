"""The text domain's model runtime: the one place that touches transformers beyond loading models,
configs and tokenizers, calling ``forward`` and ``generate``.

``runtime.py``: the interface every runtime implements (``ModelRuntime``); ``pick.py`` chooses one
per model. The runtimes: ``kv_cache.py`` (the position-indexed cache over the model's own forward,
and the probe that checks it), ``encoder_decoder.py``, ``lean_llama.py`` and ``lean_seq2seq.py``
(lean loops over ``lean_cache.py``'s slots; static steps in ``cuda_graphs.py``),
``transformers_cache.py`` (the fallback through transformers' own cache). Beside them: the model
facts (``facts.py``), memory and length checks (``memory.py``, ``limits.py``), attention masks
(``attention_masks.py``), recurrent layers' states (``recurrent.py``, ``recurrent_mixers.py``) and
``transformers_api.py``, which names each part of transformers we rely on and the releases it was
checked on. A new model family that needs a mechanism of its own lands here.
"""
