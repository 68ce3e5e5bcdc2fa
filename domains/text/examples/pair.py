"""The embedded model pair: a small Llama target and its distilled draft, byte-level vocabulary.

Both live in ``domains/text/examples/weights/{target,draft}`` in Hugging Face format (``config.json`` +
``model.safetensors`` + the byte tokenizer's files), so they also load with plain transformers:
``AutoModelForCausalLM.from_pretrained(path)`` and ``AutoTokenizer.from_pretrained(path)``.
They were trained by ``benchmarks/text/train_pair.py`` on the Python standard library's sources
(recipe, losses and acceptance in ``domains/text/MODELS.md``). Weights may be stored in float16
to fit the size budget; they load as float32 unless ``dtype`` says otherwise.

>>> target, draft, tok = load_pair()
>>> ids = tok("def ", return_tensors="pt").input_ids
>>> target(ids).logits.shape[-1] == draft(ids).logits.shape[-1] == len(tok)
True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from speculate.domains.text.examples.tokenizer import ByteTokenizer

MODELS_DIR = Path(__file__).resolve().parent / "weights"
TARGET_DIR = MODELS_DIR / "target"
DRAFT_DIR = MODELS_DIR / "draft"
RETRAIN = "python benchmarks/text/train_pair.py --size small"
HEADS_DIR = MODELS_DIR / "target-heads"  # Medusa heads of the embedded target
FEATURE_DRAFT_DIR = MODELS_DIR / "target-feature-draft"  # its EAGLE-style feature draft


def load_pair(device: str | torch.device | None = None, dtype: torch.dtype | None = None,
              path: str | os.PathLike[str] | None = None):
    """Load ``(target, draft, tokenizer)`` in eval mode.

    ``device``: where to put both models (default CPU). ``dtype``: their parameter dtype
    (default float32). ``path``: a folder holding ``target/`` and ``draft/`` (default: the
    embedded pair; ``benchmarks/text/models/large`` holds the larger pair once trained).
    """
    from transformers import AutoModelForCausalLM

    base = Path(path) if path is not None else MODELS_DIR
    out = []
    for sub in ("target", "draft"):
        folder = base / sub
        if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
            raise FileNotFoundError(
                f"no model in {str(folder)!r} (config.json + model.safetensors expected); "
                f"train the pair with: {RETRAIN}" + ("" if path is None else f" --out {base}"))
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or torch.float32)
        out.append(model.to(device or "cpu").eval())
    tokenizer = ByteTokenizer.from_pretrained(base / "target")
    return out[0], out[1], tokenizer


def load_self_drafts(target: Any, path: str | os.PathLike[str] | None = None) -> tuple[Any, Any]:
    """``(heads, feature_draft)``: the Medusa heads and the feature draft trained on ``target``
    (``benchmarks/text/train_heads.py``), on its device and dtype, in eval mode.

    ``path``: the folder holding ``target-heads/`` and ``target-feature-draft/`` (default: those of
    the embedded target; ``benchmarks/text/models/large`` holds the larger target's once trained).
    """
    from ..training.feature_draft import FeatureDraft
    from ..training.heads import MedusaHeads

    base = Path(path) if path is not None else MODELS_DIR
    folders = (base / HEADS_DIR.name, base / FEATURE_DRAFT_DIR.name)
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"no trained drafts in {str(folder)!r}; train them with: "
                                    "python benchmarks/text/train_heads.py"
                                    + ("" if path is None else f" --pair {base}"))
    return (MedusaHeads.from_pretrained(folders[0], target).eval(),
            FeatureDraft.from_pretrained(folders[1], target).eval())
