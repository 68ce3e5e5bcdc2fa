"""The text domain's model runtime: everything that touches transformers beyond loading models,
configs and tokenizers, calling ``forward`` and ``generate``.

``transformers_api.py`` names each part of transformers we rely on (and the versions it was
checked on); ``fallback.py`` runs a model through transformers' own cache when speculate's
position-indexed cache (``kv_cache.py``) refuses it.
"""
