"""Speculative decoding for Hugging Face causal LMs: exact, batched, with reusable KV caches.

See ``domains/text/README.md``. Public names: :class:`SpeculativeGenerator`,
:class:`GenerationOutput`, and the drafts' building blocks.
"""

from .generator import GenerationOutput, SpeculativeGenerator, check_vocabularies
from .sampling import SamplingConfig

__all__ = ["GenerationOutput", "SamplingConfig", "SpeculativeGenerator", "check_vocabularies"]
