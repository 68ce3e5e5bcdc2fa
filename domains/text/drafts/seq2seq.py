"""The draft of an encoder-decoder target: another encoder-decoder with the same vocabulary (its own
encoder, run once per row), or a decoder that reads the target's encoder output (a distil-whisper
``WhisperForCausalLM``; ``"early-exit:N"``: the target's first ``N`` decoder layers and head), in a
cache of its own (``CachedSeq2Seq``, or the lean loop of ``lean_seq2seq.py`` for Whisper and BART)."""

from __future__ import annotations

from typing import Any

import torch

from ..models.encoder_decoder import EncoderState, check_seq2seq, decoder_layers_path, encode
from ..models.facts import check_vocabularies, encoder_width, is_encoder_decoder, model_vocab_size, reads_encoder
from ..models.lean_seq2seq import lean_seq2seq
from ..request.inputs import EncoderInputs
from .base import DraftOptions, named_draft
from .model import ModelDraft, early_exit_model, unknown_id
from .ngram import SourceNgramDraft

__all__ = ["Seq2SeqDraft"]


class Seq2SeqDraft(ModelDraft):
    """A draft decoder with cross-attention, in a cache of its own (``CachedSeq2Seq``, or the lean
    loop of ``lean_seq2seq.py`` for Whisper and BART).

    ``shares_encoder`` False: an encoder-decoder with its own encoder, run once per row on the
    request's encoder inputs. True: a decoder that reads the target's encoder output (a
    distil-whisper ``WhisperForCausalLM``, or the target's first decoder layers for early exit);
    the target's encoder runs once for both.
    """

    def __init__(self, model: Any, shares_encoder: bool) -> None:
        check_seq2seq(model, "draft")
        self.model = model
        self.lm = lean_seq2seq(model)  # a lean loop for Whisper and BART decoders (draft steps are mostly overhead)
        self.vocab = model_vocab_size(model)
        self.unknown = unknown_id(model, self.vocab)
        self.shares_encoder = shares_encoder

    @classmethod
    def from_spec(cls, draft: Any, target: Any, options: DraftOptions) -> Seq2SeqDraft | SourceNgramDraft | None:
        """Every draft of an encoder-decoder target (its own ``"ngram"`` and ``"early-exit:N"`` too);
        None for a decoder-only target."""
        if not reads_encoder(target):
            return None
        if options.tree is not None:
            raise ValueError(f"{type(target).__name__} is an encoder-decoder: draft heads, feature drafts and "
                             "token trees are for decoder-only targets; pass a draft model, 'ngram' or 'early-exit:N'")
        if isinstance(draft, torch.nn.Module) and hasattr(draft, "config"):
            check_vocabularies(target, draft, options.tokenizer, options.draft_tokenizer)
        return _seq2seq_draft(draft, target)

    def encode(self, inputs: EncoderInputs, target_state: EncoderState) -> None:
        """Set every row's encoder output: the target's (moved to the draft's device), or the
        draft's own encoder run once over ``inputs``."""
        if self.shares_encoder:
            dev = self.lm.device
            self.lm.encoder = EncoderState(
                target_state.hidden.to(dev),
                None if target_state.mask is None else target_state.mask.to(dev))
        else:
            self.lm.encoder = encode(self.model, inputs.tensors)


def _seq2seq_draft(draft: Any, target: Any) -> Seq2SeqDraft | SourceNgramDraft:
    """The draft for an encoder-decoder ``target`` (see :meth:`Seq2SeqDraft.from_spec`)."""
    tname = type(target).__name__
    if isinstance(draft, str):
        kind, n = named_draft(draft)
        if kind == "ngram":
            return SourceNgramDraft(max_n=n)
        if kind == "early-exit":
            path = decoder_layers_path(target)
            return Seq2SeqDraft(early_exit_model(target, n, path), shares_encoder=True)
        raise ValueError(f"unknown draft {draft!r}: pass an encoder-decoder model, a decoder that "
                         "reads the target's encoder (WhisperForCausalLM), 'ngram', 'ngram:N' or "
                         "'early-exit:N'")
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
        raise TypeError(f"draft must be a transformers model or a string, got {type(draft).__name__}")
    dname = type(draft).__name__
    if is_encoder_decoder(draft):
        return Seq2SeqDraft(draft, shares_encoder=False)
    if not reads_encoder(draft):
        raise ValueError(
            f"the draft {dname} is a decoder-only LM without cross-attention: it cannot read the "
            f"input of the encoder-decoder target {tname}. Use an encoder-decoder draft with the "
            "same vocabulary, a decoder that reads the target's encoder output (WhisperForCausalLM), "
            "'ngram' or 'early-exit:N'")
    wd, wt = encoder_width(draft), encoder_width(target)
    if wd != wt:
        raise ValueError(
            f"the draft {dname} reads encoder outputs of width {wd} (config.d_model) but the "
            f"target {tname}'s encoder produces width {wt}: a decoder that shares the target's "
            "encoder must be trained on it (e.g. distil-whisper with its own teacher)")
    return Seq2SeqDraft(draft, shares_encoder=True)
