"""Speculative decoding for Hugging Face causal LMs: exact, batched, with reusable KV caches.

>>> from speculate.domains.text import SpeculativeGenerator, load_pair
>>> target, draft, tok = load_pair()                                    # doctest: +SKIP
>>> gen = SpeculativeGenerator(target, draft, lookahead=4, verify="block")  # doctest: +SKIP

The folders by role: ``request/`` (what a request is made of), ``drafts/`` (every kind of draft),
``models/`` (the model runtimes), ``training/`` (training drafts), ``examples/`` (the embedded pair
and demos). See ``domains/text/README.md``.
"""

from .api import GenerationOutput, SpeculativeGenerator
from .custom_generate import speculate_decoding
from .drafts import Draft, make_draft, register_draft
from .examples.pair import load_pair
from .examples.tokenizer import ByteTokenizer
from .generation import run_sharded as generate_sharded
from .models.facts import check_vocabularies
from .models.memory import CacheMemoryError
from .ray_data import SpeculativeTextBatches
from .request.sampling import SamplingConfig
from .request.streaming import StreamEvent
from .training.feature_draft import FeatureDraft, train_feature_draft
from .training.heads import MedusaHeads, train_heads

__all__ = [
    "ByteTokenizer",
    "CacheMemoryError",
    "Draft",
    "FeatureDraft",
    "GenerationOutput",
    "MedusaHeads",
    "SamplingConfig",
    "SpeculativeGenerator",
    "SpeculativeTextBatches",
    "StreamEvent",
    "check_vocabularies",
    "generate_sharded",
    "load_pair",
    "make_draft",
    "register_draft",
    "speculate_decoding",
    "train_feature_draft",
    "train_heads",
]
