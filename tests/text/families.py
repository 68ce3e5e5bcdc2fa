"""Every family the text domain was tried on: what works, what was fixed, what is refused.

:data:`FAMILIES` (a test table, beside the tests that walk it) is the table of
``domains/text/README.md`` (a test keeps the two equal): per
transformers family, its status with :class:`~speculate.domains.text.SpeculativeGenerator` and the
mechanism or the reason, and a tiny config to build a random model of it (no download).
``tests/text/test_text_families.py`` walks the table: every row marked ``works`` or ``fixed``
passes the conformance matrix (greedy equals the target's own greedy decoding on a ragged,
left-padded batch; the exact law of the first two sampled tokens for the token and block rules),
every row marked ``fallback`` passes the same matrix through transformers' own cache (the position-
indexed cache refuses it: the ``FallbackWarning`` matches ``refusal``), and every row marked
``refused`` raises the ``ValueError`` whose message matches ``refusal``, before any work.

:data:`ENCODER_DECODER` is the same for encoder-decoder families (``tiny_seq2seq`` builds them);
``tests/text/test_text_encoder_decoder.py`` walks it with different encoder inputs per row.
:func:`markdown_table` renders both tables, decoder-only rows first.

Status: ``works``: exact before this table was made; ``fixed``: refused or wrong before (sliding
windows past the window, ALiBi in ragged batches, recurrent layers, encoder-decoders), exact now;
``fallback``: the position-indexed cache refuses it, transformers' own cache runs it (exact, slower,
with a warning naming the reason: ``models/transformers_cache.py``); ``refused``: a clear error
naming the family and the reason.

>>> fam = family("mamba")
>>> fam.status, fam.model_class
('fixed', 'MambaForCausalLM')
>>> type(tiny_model(fam)).__name__
'MambaForCausalLM'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from speculate.domains.text.conformance import SEQ2SEQ, perturbed

__all__ = ["ENCODER_DECODER", "FAMILIES", "Family", "family", "markdown_table", "perturbed", "tiny_model",
           "tiny_seq2seq"]

#: the sizes every tiny model shares (family configs override what they name differently)
COMMON: dict[str, Any] = dict(
    vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
    pad_token_id=None, tie_word_embeddings=False, experts_implementation="eager")
#: a sliding window shorter than the tests' prompts plus generations, so that they cross it
WINDOW = 6
_SLIDE = ["sliding_attention", "full_attention"]
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)


@dataclass(frozen=True)
class Family:
    """One row of the table: a transformers family, its status, and a tiny config of it."""

    name: str  #: the family, as users know it
    model_type: str  #: transformers' ``model_type`` (``AutoConfig.for_model``)
    model_class: str  #: the causal-LM class ``AutoModelForCausalLM`` builds
    status: str  #: ``works``, ``fixed``, ``fallback`` or ``refused``
    note: str  #: what the family needs (the mechanism) or why it is refused
    config: dict[str, Any] = field(default_factory=dict)  #: overrides of :data:`COMMON`
    refusal: str = ""  #: a regex the refusal's message matches (refused rows; the warning of fallback rows)


FAMILIES: tuple[Family, ...] = (
    # ---- full attention: the position-indexed cache with one causal mask
    Family("Llama", "llama", "LlamaForCausalLM", "works", "full attention; lean draft loop"),
    Family("Qwen3", "qwen3", "Qwen3ForCausalLM", "works", "full attention", dict(head_dim=8)),
    Family("Gemma", "gemma", "GemmaForCausalLM", "works", "full attention", dict(head_dim=8)),
    Family("Phi", "phi", "PhiForCausalLM", "works", "full attention"),
    Family("Phi-3", "phi3", "Phi3ForCausalLM", "works", "full attention (sliding window: see Phi-3 SWA)"),
    Family("GPT-2", "gpt2", "GPT2LMHeadModel", "works", "learned positions: prompt + new tokens <= n_positions",
           dict(n_positions=64)),
    Family("GPT-NeoX", "gpt_neox", "GPTNeoXForCausalLM", "works", "full attention"),
    Family("GPT-J", "gptj", "GPTJForCausalLM", "works", "full attention", dict(rotary_dim=4, n_positions=64)),
    Family("OPT", "opt", "OPTForCausalLM", "works", "learned positions", dict(ffn_dim=64, word_embed_proj_dim=32)),
    Family("GPT-BigCode", "gpt_bigcode", "GPTBigCodeForCausalLM", "works", "learned positions",
           dict(n_positions=64)),
    Family("CodeGen", "codegen", "CodeGenForCausalLM", "works", "full attention", dict(rotary_dim=4, n_positions=64)),
    Family("Falcon", "falcon", "FalconForCausalLM", "works", "rotary positions",
           dict(new_decoder_architecture=True, num_kv_heads=2)),
    Family("MPT", "mpt", "MptForCausalLM", "works", "ALiBi from its own bias table",
           dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=256)),
    Family("Cohere", "cohere", "CohereForCausalLM", "works", "full attention"),
    Family("OLMo", "olmo", "OlmoForCausalLM", "works", "full attention"),
    Family("OLMo 2", "olmo2", "Olmo2ForCausalLM", "works", "full attention"),
    Family("StableLM", "stablelm", "StableLmForCausalLM", "works", "full attention"),
    Family("Granite", "granite", "GraniteForCausalLM", "works", "full attention"),
    Family("Persimmon", "persimmon", "PersimmonForCausalLM", "works", "full attention"),
    Family("GLM-4", "glm4", "Glm4ForCausalLM", "works", "full attention", dict(head_dim=8)),
    Family("SmolLM3", "smollm3", "SmolLM3ForCausalLM", "works", "full attention (NoPE layers)"),
    Family("Mixtral", "mixtral", "MixtralForCausalLM", "works", "mixture of experts", dict(_MOE)),
    Family("Qwen2-MoE", "qwen2_moe", "Qwen2MoeForCausalLM", "works", "mixture of experts",
           dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=32)),
    Family("OLMoE", "olmoe", "OlmoeForCausalLM", "works", "mixture of experts",
           dict(num_experts=4, num_experts_per_tok=2)),
    # ---- sliding windows: a windowed mask over the full cache (rollback stays free past the window)
    Family("Mistral", "mistral", "MistralForCausalLM", "fixed", "every layer slides: windowed mask",
           dict(sliding_window=WINDOW)),
    Family("Qwen2 (sliding)", "qwen2", "Qwen2ForCausalLM", "fixed", "sliding layers past max_window_layers",
           dict(sliding_window=WINDOW, use_sliding_window=True, max_window_layers=1)),
    Family("Starcoder2", "starcoder2", "Starcoder2ForCausalLM", "fixed", "every layer slides: windowed mask",
           dict(sliding_window=WINDOW)),
    Family("Phi-3 SWA", "phi3", "Phi3ForCausalLM", "fixed", "every layer slides: windowed mask",
           dict(sliding_window=WINDOW)),
    Family("Gemma 2", "gemma2", "Gemma2ForCausalLM", "fixed", "alternating sliding/global layers: masks by layer type",
           dict(sliding_window=WINDOW, head_dim=8)),
    Family("Gemma 3", "gemma3_text", "Gemma3ForCausalLM", "fixed", "sliding/global layers: masks by layer type",
           dict(sliding_window=WINDOW, layer_types=_SLIDE, head_dim=8)),
    Family("Cohere 2", "cohere2", "Cohere2ForCausalLM", "fixed", "sliding/global layers: masks by layer type",
           dict(sliding_window=WINDOW, layer_types=_SLIDE)),
    Family("GPT-OSS", "gpt_oss", "GptOssForCausalLM", "fixed", "sliding/global layers, attention sinks, experts",
           dict(sliding_window=WINDOW, layer_types=_SLIDE, head_dim=8, **_MOE)),
    Family("OLMo 3", "olmo3", "Olmo3ForCausalLM", "fixed", "sliding/global layers: masks by layer type",
           dict(sliding_window=WINDOW, layer_types=_SLIDE)),
    Family("Ministral", "ministral", "MinistralForCausalLM", "fixed", "sliding/global layers: masks by layer type",
           dict(sliding_window=WINDOW, layer_types=_SLIDE, head_dim=8)),
    Family("EXAONE 4", "exaone4", "Exaone4ForCausalLM", "fixed", "sliding/global layers: masks by layer type",
           dict(sliding_window=WINDOW, layer_types=_SLIDE)),
    Family("Llama 4 (text)", "llama4_text", "Llama4ForCausalLM", "fixed", "chunked/global layers: chunked masks",
           dict(attention_chunk_size=WINDOW, layer_types=["chunked_attention", "full_attention"], head_dim=8,
                intermediate_size_mlp=64, num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=2)),
    # ---- ALiBi: biases from slot indices, which are positions in the position-indexed cache
    Family("Bloom", "bloom", "BloomForCausalLM", "fixed", "ALiBi: bias from slots (4-D masks)",
           dict(n_layer=2, n_head=4)),
    Family("Falcon (ALiBi)", "falcon", "FalconForCausalLM", "fixed", "ALiBi: bias from slots (4-D masks)",
           dict(alibi=True)),
    # ---- recurrent layers: per-row states, rollback by replaying the kept tokens' step inputs
    Family("Mamba", "mamba", "MambaForCausalLM", "fixed", "selective scan, state rolled back",
           dict(state_size=4, expand=2, conv_kernel=4)),
    Family("Falcon-Mamba", "falcon_mamba", "FalconMambaForCausalLM", "fixed", "selective scan with dt/B/C norms",
           dict(state_size=4, expand=2, conv_kernel=4)),
    Family("Mamba2", "mamba2", "Mamba2ForCausalLM", "fixed", "SSD scan per head, state rolled back",
           dict(num_heads=8, head_dim=8, state_size=4, n_groups=2, expand=2, chunk_size=8)),
    Family("Jamba", "jamba", "JambaForCausalLM", "fixed", "Mamba + attention + experts",
           dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                num_experts=2, num_experts_per_tok=1, mamba_d_state=4, mamba_expand=2, mamba_dt_rank=4)),
    Family("Bamba", "bamba", "BambaForCausalLM", "fixed", "Mamba2 + attention",
           dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=4, mamba_chunk_size=8)),
    Family("FalconH1", "falcon_h1", "FalconH1ForCausalLM", "fixed", "parallel Mamba2 and attention in each layer",
           dict(mamba_d_ssm=16, mamba_n_heads=4, mamba_d_head=4, mamba_d_state=4, mamba_chunk_size=8, head_dim=8)),
    Family("Zamba2", "zamba2", "Zamba2ForCausalLM", "fixed", "Mamba2 + shared attention blocks",
           dict(layers_block_type=["mamba", "hybrid"], mamba_d_state=4, mamba_headdim=8, n_mamba_heads=8,
                num_mem_blocks=1, mamba_ngroups=1, chunk_size=8, attention_head_dim=8)),
    Family("Nemotron-H", "nemotron_h", "NemotronHForCausalLM", "fixed", "Mamba2 + attention + MLP layers",
           dict(layers_block_type=["mamba", "attention", "mlp"], mamba_num_heads=4, mamba_head_dim=8,
                ssm_state_size=4, n_groups=1, chunk_size=8, head_dim=8, num_hidden_layers=3)),
    Family("Granite 4 (hybrid)", "granitemoehybrid", "GraniteMoeHybridForCausalLM", "fixed",
           "Mamba2 + attention + experts",
           dict(layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=4,
                mamba_chunk_size=8, num_local_experts=2, num_experts_per_tok=1)),
    Family("LFM2", "lfm2", "Lfm2ForCausalLM", "fixed", "gated short convolutions + attention",
           dict(layer_types=["conv", "full_attention"], block_ff_dim=64, conv_L_cache=3)),
    Family("Qwen3-Next", "qwen3_next", "Qwen3NextForCausalLM", "fixed", "gated delta net + gated attention + experts",
           dict(layer_types=["linear_attention", "full_attention"], head_dim=8, linear_num_value_heads=4,
                linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2,
                num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32)),
    # ---- the fallback: transformers' own cache (the position-indexed cache's reason in the warning)
    Family("GPT-Neo", "gpt_neo", "GPTNeoForCausalLM", "fallback",
           "transformers' own cache: its local layers take their window from the key length, not from positions",
           dict(num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=WINDOW,
                max_position_embeddings=64), refusal=r"GPTNeoForCausalLM.*local attention"),
    Family("RecurrentGemma", "recurrent_gemma", "RecurrentGemmaForCausalLM", "fallback",
           "transformers' forward without a cache (recompute): RG-LRU layers have no rollback implementation",
           dict(block_types=["recurrent", "attention"], lru_width=32, attention_window_size=WINDOW,
                conv1d_width=4), refusal=r"RecurrentGemmaForCausalLM.*cannot\s+roll back"),
    Family("RWKV", "rwkv", "RwkvForCausalLM", "fallback",
           "transformers' forward without a cache (recompute): RWKV time mixing has no rollback implementation",
           dict(attention_hidden_size=32, context_length=64), refusal=r"RwkvForCausalLM.*cannot\s+roll back"),
)


_T5 = dict(vocab_size=16, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
           relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0,
           eos_token_id=1, decoder_start_token_id=0)
_WHISPER = dict(vocab_size=16, num_mel_bins=8, d_model=32, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                max_source_positions=8, max_target_positions=64, bos_token_id=0, pad_token_id=1, eos_token_id=2,
                decoder_start_token_id=3, suppress_tokens=None, begin_suppress_tokens=None)

#: encoder-decoder families: the encoder runs once per row, the decoder in the position-indexed cache
#: with cross-attention keys and values cached per row (``encoder_decoder.py``)
ENCODER_DECODER: tuple[Family, ...] = (
    Family("T5", "t5", "T5ForConditionalGeneration", "fixed", "encoder-decoder; relative position bias per row",
           dict(_T5)),
    Family("Flan-T5 (T5 v1.1)", "t5", "T5ForConditionalGeneration", "fixed",
           "encoder-decoder; gated-GELU, untied head", dict(_T5, feed_forward_proj="gated-gelu",
                                                            tie_word_embeddings=False)),
    Family("BART", "bart", "BartForConditionalGeneration", "fixed",
           "encoder-decoder; learned positions per row; lean decoder loop", dict(SEQ2SEQ)),
    Family("mBART", "mbart", "MBartForConditionalGeneration", "fixed", "encoder-decoder; learned positions per row",
           dict(SEQ2SEQ)),
    Family("Marian", "marian", "MarianMTModel", "fixed", "encoder-decoder; sinusoidal positions per row",
           dict(SEQ2SEQ, decoder_vocab_size=16, pad_token_id=15, decoder_start_token_id=15)),
    Family("Whisper", "whisper", "WhisperForConditionalGeneration", "fixed",
           "speech encoder (input_features); learned positions per row; lean decoder loop", dict(_WHISPER)),
    Family("ProphetNet", "prophetnet", "ProphetNetForConditionalGeneration", "refused",
           "n-stream decoder: no known position scheme",
           dict(vocab_size=16, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2,
                num_decoder_layers=2, num_encoder_attention_heads=4, num_decoder_attention_heads=4,
                pad_token_id=0, eos_token_id=2, decoder_start_token_id=0),
           refusal=r"ProphetNetForConditionalGeneration.*positions"),
    Family("M2M100 / NLLB", "m2m_100", "M2M100ForConditionalGeneration", "refused",
           "positions from padding ids: no known position scheme", dict(SEQ2SEQ),
           refusal=r"M2M100ForConditionalGeneration.*positions"),
)
#: how each family's config scales its initialisation (T5: a factor on its own per-layer stds)
_INIT = {"t5": ("initializer_factor", 5.0)}


def family(key: str) -> Family:
    """The row whose ``model_type`` (first match) or ``name`` is ``key``."""
    for f in FAMILIES + ENCODER_DECODER:
        if key in (f.model_type, f.name):
            return f
    raise KeyError(key)


def tiny_model(fam: Family, seed: int = 0, dtype: torch.dtype = torch.float64, init_std: float = 0.3) -> Any:
    """A random model of ``fam`` (its tiny config over :data:`COMMON`) in eval mode and ``dtype``.

    ``init_std`` 0.3 (15x the usual) makes the next-token law depend clearly on context and
    position, so that a caching, masking or rollback bug changes it.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(fam.model_type, **{**COMMON, "initializer_range": init_std, **fam.config})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype).eval()


def tiny_seq2seq(fam: Family, seed: int = 0, dtype: torch.dtype = torch.float64, init_std: float = 0.3) -> Any:
    """A random encoder-decoder of ``fam`` (a row of :data:`ENCODER_DECODER`) in eval mode and ``dtype``.

    ``init_std`` 0.3 (15x the usual; T5: ``initializer_factor`` 1.5) makes the decoder's law depend
    clearly on the encoder input (total variation 0.1 to 0.5 between the first-token laws of
    different sources), so that a row that read another row's encoder output would be caught.
    """
    import transformers
    from transformers import AutoConfig

    key, scale = _INIT.get(fam.model_type, ("init_std", 1.0))
    cfg = AutoConfig.for_model(fam.model_type, **{**fam.config, key: init_std * scale})
    torch.manual_seed(seed)
    model = getattr(transformers, fam.model_class)(cfg)
    return model.to(dtype).eval()


def markdown_table() -> str:
    """The table of ``domains/text/README.md`` (family, class, status, mechanism or reason)."""
    rows = ["| family | transformers class | status | how / why |", "|---|---|---|---|"]
    rows += [f"| {f.name} | `{f.model_class}` | {f.status} | {f.note} |" for f in FAMILIES + ENCODER_DECODER]
    return "\n".join(rows)
