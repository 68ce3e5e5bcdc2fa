"""Medusa-style draft heads that live on a frozen target (Cai et al., arXiv:2401.10774).

The target's *features* are the input of its output embedding: the final hidden state after the
final norm, ``[.., H]`` (:func:`target_features` captures them with a forward pre-hook, the same
for every family). Head ``i`` (0-based) maps the feature at position ``t``, whose own logits
predict token ``t + 1``, to logits for token ``t + 2 + i``: with the target's own next token the
heads draft ``n_heads + 1`` tokens from one target call. Each head is ``n_layers`` residual blocks
``h + SiLU(W h + b)`` (zero at initialisation) and its own copy of the target's output embedding,
so fresh heads repeat the target's next-token law one step too late.

:func:`train_heads` trains them against the target (frozen) on windows whose second half the
target itself samples (Medusa-2's self-distillation); the loss of head ``i`` at ``t`` is a
divergence between the target's law at ``t + 1 + i`` (the law of token ``t + 2 + i`` given the
true prefix) and the head's output at ``t``, and its acceptance is ``E[sum_x min(p, q)]``.

>>> from speculate.domains.text.conformance import tiny_llama
>>> target = tiny_llama(vocab=16)
>>> heads = MedusaHeads.for_target(target, n_heads=3)
>>> feats, logits = target_features(target, torch.tensor([[1, 2, 3, 4]]))
>>> heads(feats).shape                                  # [B, L, n_heads, V]
torch.Size([1, 4, 3, 16])
>>> torch.allclose(heads(feats)[..., 0, :], logits)    # fresh: the target's head, one step late
True
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..models.facts import check_eval_mode, execution_device, model_vocab_size, text_config
from ..request.progress import progress_bar
from .distill import (
    DIVERGENCES,
    acceptance,
    divergence_loss,
    optimizer_step,
    sample_continuations,
    sample_windows,
    token_stream,
)

CONFIG_NAME, WEIGHTS_NAME = "heads_config.json", "heads.safetensors"


# --------------------------------------------------------------------------------------------
# the target's features


@torch.no_grad()
def target_features(target: torch.nn.Module, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One plain forward (no cache) of a frozen ``target``: ``(features [B, L, H], logits [B, L, V])``.

    The features are what the target's output embedding receives (a forward pre-hook on
    ``target.get_output_embeddings()``), so the logits are ``output_embedding(features)``.
    """
    check_eval_mode(target, "target")
    got: list[torch.Tensor] = []
    handle = target.get_output_embeddings().register_forward_pre_hook(lambda m, args: got.append(args[0]))
    try:
        dev = execution_device(target.get_input_embeddings())
        logits = target(input_ids=input_ids.to(dev), use_cache=False).logits  # [B, L, V]
    finally:
        handle.remove()
    return got[-1], logits


@torch.no_grad()
def output_weight(target: torch.nn.Module) -> torch.Tensor:
    """The target's output embedding weight ``[V, H]`` where the head computes. A head offloaded
    with a ``device_map`` (its weight on ``meta`` between calls) is read through its own forward:
    ``head(I) - head(0)`` is the weight's transpose, bias or not."""
    head = target.get_output_embeddings()
    w = head.weight
    if w.device.type != "meta":
        return w
    H = int(w.shape[1])
    x = torch.cat([torch.eye(H, dtype=w.dtype), torch.zeros(1, H, dtype=w.dtype)])  # [H + 1, H]
    out = head(x.to(execution_device(head)))  # [H + 1, V]
    return (out[:H] - out[H:]).T.contiguous()


def target_summary(target: torch.nn.Module) -> dict[str, Any]:
    """What a draft living on ``target`` records about it: feature width, vocabulary, family."""
    cfg = text_config(target.config)
    return {"hidden_size": int(target.get_output_embeddings().weight.shape[1]),
            "vocab_size": model_vocab_size(target),
            "target_model_type": getattr(cfg, "model_type", "?"),
            "target_layers": getattr(cfg, "num_hidden_layers", None)}


def check_summary(saved: dict[str, Any], target: torch.nn.Module, what: str, retrain: str) -> None:
    """Raise ``ValueError`` when ``target`` is not the kind of target ``saved`` was trained for."""
    now = target_summary(target)
    trained = f"a {saved['target_model_type']} target of {saved['target_layers']} layers"
    for key, name in (("hidden_size", "hidden size"), ("vocab_size", "a vocabulary of")):
        if saved[key] != now[key]:
            unit = " ids" if key == "vocab_size" else ""
            raise ValueError(f"these {what} were trained for a target with {name} {saved[key]}{unit} "
                             f"({trained}); this target ({now['target_model_type']}, "
                             f"{now['target_layers']} layers) has {name} {now[key]}{unit}: {retrain}")


def save_module(module: torch.nn.Module, folder: str | os.PathLike[str], config: dict[str, Any],
                config_name: str, weights_name: str, dtype: torch.dtype | None = None) -> Path:
    """Write ``config`` as JSON and the module's own weights (in ``dtype``) as safetensors."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / config_name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(state, out / weights_name)
    return out


def load_config(folder: str | os.PathLike[str], config_name: str) -> dict[str, Any]:
    path = Path(folder) / config_name
    if not path.is_file():
        raise FileNotFoundError(f"no {config_name} in {str(folder)!r}")
    return json.loads(path.read_text())


def load_weights(module: torch.nn.Module, folder: str | os.PathLike[str], weights_name: str,
                 target: torch.nn.Module) -> torch.nn.Module:
    """Load saved weights into ``module`` and put it on the target's device and dtype, eval mode."""
    from safetensors.torch import load_file

    module.load_state_dict(load_file(Path(folder) / weights_name))
    w = output_weight(target)
    return module.to(device=w.device, dtype=w.dtype).eval()


# --------------------------------------------------------------------------------------------
# the heads


class MedusaHeads(torch.nn.Module):
    """``n_heads`` heads of ``n_layers`` residual blocks and an output embedding each.

    ``forward(features [..., H]) -> logits [..., n_heads, V]``; head ``i`` at position ``t``
    drafts token ``t + 2 + i``. The heads' weights are stacked over heads, so every layer of all
    heads is one batched matrix product (a drafting call is three of them with two layers, not
    twelve): ``weight`` ``[n_layers, n_heads, H, H]`` and ``bias`` ``[n_layers, n_heads, 1, H]``
    (block ``l`` of head ``i``: ``h + SiLU(h @ weight[l, i] + bias[l, i])``, zero at
    initialisation) and ``out`` ``[n_heads, H, V]`` (logits ``h @ out[i]``). ``config``:
    hidden_size, vocab_size, n_heads, n_layers and the target's family and depth (for error
    messages).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = dict(config)
        H, V, n, L = config["hidden_size"], config["vocab_size"], config["n_heads"], config["n_layers"]
        self.weight = torch.nn.Parameter(torch.zeros(L, n, H, H))
        self.bias = torch.nn.Parameter(torch.zeros(L, n, 1, H))
        self.out = torch.nn.Parameter(torch.zeros(n, H, V))

    @property
    def n_heads(self) -> int:
        return self.out.shape[0]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        lead, H = features.shape[:-1], features.shape[-1]
        return self._logits(features.reshape(-1, H)).transpose(0, 1).reshape(*lead, self.n_heads, -1)  # [..., n, V]

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` without autograd on ``features`` ``[R, H]``: ``[R, n_heads, V]`` (a view;
        what drafting calls, with no more than the three batched products)."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._logits(features).transpose(0, 1)
        return self._logits(features).transpose(0, 1)

    def _logits(self, features: torch.Tensor) -> torch.Tensor:
        """``[n_heads, N, V]`` from ``features`` ``[N, H]``."""
        P = self.out
        if features.dtype != P.dtype:
            features = features.to(P.dtype)
        x = features.expand(P.shape[0], *features.shape)  # [n, N, H]
        for W, b in zip(self.weight.unbind(0), self.bias.unbind(0), strict=True):  # [n, H, H], [n, 1, H]
            x = x + F.silu(torch.baddbmm(b, x, W))  # [n, N, H]
        return torch.bmm(x, P)  # [n, N, V]

    def _load_from_state_dict(self, state: dict[str, Any], prefix: str, *args: Any) -> None:
        """Heads saved one module per head (``heads.{i}.{l}.linear.{weight,bias}`` and
        ``heads.{i}.{n_layers}.weight``, as before the weights were stacked) load too."""
        old = f"{prefix}heads."
        if any(k.startswith(old) for k in state):
            n, L = self.config["n_heads"], self.config["n_layers"]
            ws = [[state.pop(f"{old}{i}.{j}.linear.weight").T for i in range(n)] for j in range(L)]
            bs = [[state.pop(f"{old}{i}.{j}.linear.bias")[None] for i in range(n)] for j in range(L)]
            H = self.config["hidden_size"]
            state[f"{prefix}weight"] = torch.stack([torch.stack(w) for w in ws]) if L else torch.zeros(0, n, H, H)
            state[f"{prefix}bias"] = torch.stack([torch.stack(b) for b in bs]) if L else torch.zeros(0, n, 1, H)
            state[f"{prefix}out"] = torch.stack([state.pop(f"{old}{i}.{L}.weight").T for i in range(n)])
        super()._load_from_state_dict(state, prefix, *args)

    @classmethod
    def for_target(cls, target: torch.nn.Module, n_heads: int = 4, n_layers: int = 1) -> MedusaHeads:
        """Fresh heads for ``target``, each output layer a copy of its output embedding."""
        if n_heads < 1 or n_layers < 0:
            raise ValueError(f"need n_heads >= 1 and n_layers >= 0, got {n_heads}, {n_layers}")
        heads = cls({**target_summary(target), "n_heads": n_heads, "n_layers": n_layers})
        w = output_weight(target)  # [V, H]
        heads.to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            heads.out.copy_(w.T.expand_as(heads.out))
        return heads

    def check_target(self, target: torch.nn.Module) -> None:
        """``ValueError`` unless ``target`` has this config's hidden size and vocabulary."""
        check_summary(self.config, target, "heads", "train heads for it with train_heads(target, texts)")

    def save_pretrained(self, folder: str | os.PathLike[str], dtype: torch.dtype | None = None) -> Path:
        """``heads_config.json`` + ``heads.safetensors`` (weights in ``dtype``, default theirs)."""
        return save_module(self, folder, self.config, CONFIG_NAME, WEIGHTS_NAME, dtype)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike[str], target: torch.nn.Module) -> MedusaHeads:
        """Saved heads for ``target`` (checked), on its device and dtype, in eval mode."""
        heads = cls(load_config(folder, CONFIG_NAME))
        heads.check_target(target)
        return load_weights(heads, folder, WEIGHTS_NAME, target)


# --------------------------------------------------------------------------------------------
# acceptance and training


def head_targets(logits: torch.Tensor, out: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Head ``i``'s pairs: target logits at ``t + 1 + i`` and the head at ``t``, ``[B, L-1-i, V]``."""
    L = logits.shape[1]
    return logits[:, 1 + i:], out[:, : L - 1 - i, i]


@torch.no_grad()
def heads_acceptance(target: torch.nn.Module, heads: MedusaHeads, input_ids: torch.Tensor, start: int = 0,
                     temperature: float = 1.0, batch: int = 16) -> list[float]:
    """Per head ``i``: mean of ``sum_x min(p_{t+1+i}, q_{i,t})`` over positions ``t >= start``."""
    sums, counts = np.zeros(heads.n_heads), np.zeros(heads.n_heads)
    for lo in range(0, input_ids.shape[0], batch):
        feats, logits = target_features(target, input_ids[lo:lo + batch])  # [b, L, H], [b, L, V]
        out = heads(feats.to(next(heads.parameters()).dtype))  # [b, L, n, V]
        for i in range(heads.n_heads):
            p, q = head_targets(logits, out, i)
            a = acceptance(p[:, start:], q[:, start:], temperature)  # [b, L-1-i-start]
            sums[i] += float(a.sum())
            counts[i] += a.numel()
    return (sums / np.maximum(counts, 1)).tolist()


def expected_tokens(alphas: list[float]) -> float:
    """Tokens per target call of a chain drafted with per-step acceptances ``alphas`` (taken as
    independent): ``1 + a_0 + a_0 a_1 + ...`` (the target's own token counts).

    >>> expected_tokens([0.5, 0.5])
    1.75
    """
    return float(1.0 + np.cumprod(alphas).sum())


def training_windows(target: torch.nn.Module, stream: torch.Tensor, n: int, seq_len: int,
                     self_distill: bool, temperature: float, g_data: torch.Generator,
                     g_sample: torch.Generator) -> torch.Tensor:
    """``n`` windows ``[n, seq_len]`` of the stream; with ``self_distill`` the second half of each
    is sampled from the target at ``temperature`` after a corpus prefix of ``seq_len // 2``."""
    ids = sample_windows(stream, n, seq_len, g_data)  # [n, L]
    if not self_distill:
        return ids
    half = seq_len // 2
    width = model_vocab_size(target)
    return sample_continuations(target, ids[:, :half], seq_len - half, temperature, g_sample, width).cpu()


def seeded(rng: int | np.random.Generator | None, device: torch.device) -> Callable[..., torch.Generator]:
    """``gen(k, device=device)``: a generator seeded ``base + k``, ``base`` from an int seed (itself),
    a numpy Generator or None."""
    base = int(rng) if isinstance(rng, (int, np.integer)) else int(np.random.default_rng(rng).integers(2**62))

    def gen(k: int, dev: Any = None) -> torch.Generator:
        return torch.Generator(device=device if dev is None else dev).manual_seed(base + k)

    return gen


def training_data(target: torch.nn.Module, texts: Any, tokenizer: Any, eval_texts: Any, eval_batch: int,
                  seq_len: int, divergence: str, temperature: float,
                  rng: int | np.random.Generator | None
                  ) -> tuple[Callable[..., torch.Generator], torch.Tensor, torch.Tensor]:
    """What a draft trained on a frozen target starts from: the seeded generators (:func:`seeded`),
    the training token stream and the fixed evaluation windows ``[eval_batch, seq_len]`` (second
    halves sampled from the target). Refuses a target in training mode and an unknown divergence."""
    check_eval_mode(target, "target")
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    gen = seeded(rng, execution_device(target.get_output_embeddings()))
    stream = token_stream(texts, tokenizer)
    eval_stream = stream if eval_texts is None else token_stream(eval_texts, tokenizer)
    eval_ids = training_windows(target, eval_stream, eval_batch, seq_len, True, temperature, gen(1, "cpu"), gen(2))
    return gen, stream, eval_ids


def fit_on_target(module: torch.nn.Module, target: torch.nn.Module, stream: torch.Tensor,
                  gen: Callable[..., torch.Generator], loss_of: Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                                                      torch.Tensor],
                  *, steps: int, batch_size: int, seq_len: int, lr: float, self_distill: bool,
                  temperature: float, what: str, say: Callable[[str], None], progress: bool | None) -> list[float]:
    """The loop both drafts on a target train with: AdamW on ``module``'s trainable parameters,
    each step a batch of windows of ``stream`` (second halves sampled from the frozen ``target``
    when ``self_distill``), the target's features and logits on them, and ``loss_of(ids, features,
    logits)``; scheduled learning rate, gradients clipped (:func:`optimizer_step`). Returns the
    loss per step; ``module`` is left in training mode."""
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    g_data, g_sample = gen(3, "cpu"), gen(4)
    losses: list[float] = []
    module.train()
    with progress_bar(steps, what, enabled=progress, unit="step") as bar:
        for step in range(steps):
            ids = training_windows(target, stream, batch_size, seq_len, self_distill, temperature, g_data, g_sample)
            feats, logits = target_features(target, ids)  # [B, L, H], [B, L, V]
            losses.append(optimizer_step(opt, loss_of(ids, feats, logits), params, lr, step, steps, what))
            bar.update(1)
            if (step + 1) % 50 == 0:
                say(f"{what}: step {step + 1}/{steps} loss {np.mean(losses[-50:]):.4f}")
    return losses


@dataclass
class HeadsResult:
    """What :func:`train_heads` did: per-head acceptance before and after, the loss per step."""

    heads: MedusaHeads
    losses: list[float]
    alpha_before: list[float]
    alpha_after: list[float]
    seconds: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)


def train_heads(target: torch.nn.Module, texts, *, tokenizer=None, n_heads: int = 4, n_layers: int = 1,
                steps: int = 300, batch_size: int = 16, seq_len: int = 128, lr: float = 1e-3,
                divergence: str = "tv", self_distill: bool = True, temperature: float = 1.0,
                rng: int | np.random.Generator | None = 0, eval_texts=None, eval_batch: int = 32,
                log: Callable[[str], None] | None = None, progress: bool | None = None,
                heads: MedusaHeads | None = None) -> HeadsResult:
    """Train Medusa heads (new, or ``heads`` in place) on a frozen ``target``.

    Each step takes ``batch_size`` windows of ``seq_len`` tokens of ``texts`` (strings with
    ``tokenizer``, or token ids), the second half sampled from the target when
    ``self_distill``; the loss is the mean over heads and positions of ``divergence`` (see
    ``distill.divergence_loss``) between the target's law at ``t + 1 + i`` and head ``i`` at
    ``t``. AdamW, warm-up and cosine decay to 10%, gradient clip 1. Acceptance is measured per
    head on ``eval_batch`` windows of ``eval_texts`` (default ``texts``) whose second half the
    target samples, at positions ``t >= seq_len // 2 - 1``. ``rng`` seeds everything.
    """
    if steps < 0 or batch_size < 1 or seq_len < 4:
        raise ValueError(f"need steps >= 0, batch_size >= 1, seq_len >= 4; got {steps}, {batch_size}, {seq_len}")
    gen, stream, eval_ids = training_data(target, texts, tokenizer, eval_texts, eval_batch, seq_len,
                                          divergence, temperature, rng)
    heads = heads if heads is not None else MedusaHeads.for_target(target, n_heads, n_layers)
    heads.check_target(target)
    say, t0 = log or (lambda s: None), time.perf_counter()
    start = seq_len // 2 - 1

    def evaluate() -> list[float]:
        heads.eval()
        return heads_acceptance(target, heads, eval_ids, start, temperature)

    before = evaluate()
    say(f"heads: alpha before = {[round(a, 4) for a in before]}")
    dtype = next(p for p in heads.parameters() if p.requires_grad).dtype

    def loss_of(ids: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        out = heads(feats.to(dtype))  # [B, L, n, V]
        return torch.stack([divergence_loss(*head_targets(logits, out, i), divergence, temperature).mean()
                            for i in range(heads.n_heads)]).mean()

    losses = fit_on_target(heads, target, stream, gen, loss_of, steps=steps, batch_size=batch_size, seq_len=seq_len,
                           lr=lr, self_distill=self_distill, temperature=temperature, what="heads", say=say,
                           progress=progress)
    after = evaluate()
    say(f"heads: alpha after = {[round(a, 4) for a in after]}")
    cfg = dict(n_heads=heads.n_heads, n_layers=heads.config["n_layers"], steps=steps, batch_size=batch_size,
               seq_len=seq_len, lr=lr, divergence=divergence, self_distill=self_distill, temperature=temperature)
    return HeadsResult(heads=heads, losses=losses, alpha_before=before, alpha_after=after,
                       seconds=time.perf_counter() - t0, config=cfg)
