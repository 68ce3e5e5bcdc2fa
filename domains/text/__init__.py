"""Speculative decoding for Hugging Face causal LMs: exact, batched, with reusable KV caches.

>>> from speculate.domains.text import SpeculativeGenerator, load_pair
>>> target, draft, tok = load_pair()                                    # doctest: +SKIP
>>> gen = SpeculativeGenerator(target, draft, lookahead=4, verify="block")  # doctest: +SKIP

See ``domains/text/README.md``.
"""

from .api import GenerationOutput, SpeculativeGenerator, check_vocabularies
from .custom_generate import speculate_decoding
from .feature_draft import FeatureDraft, train_feature_draft
from .heads import MedusaHeads, train_heads
from .pair import load_pair
from .runtime.kv_cache import CacheMemoryError
from .sampling import SamplingConfig
from .streaming import StreamEvent
from .tokenizer import ByteTokenizer

__all__ = [
    "ByteTokenizer",
    "CacheMemoryError",
    "FeatureDraft",
    "GenerationOutput",
    "MedusaHeads",
    "SamplingConfig",
    "SpeculativeGenerator",
    "StreamEvent",
    "check_vocabularies",
    "load_pair",
    "speculate_decoding",
    "train_feature_draft",
    "train_heads",
]
