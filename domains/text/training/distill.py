"""Distil a draft language model toward its target so that speculative sampling accepts more.

DistillSpec-style (Zhou et al., arXiv:2310.08461): the training states are the ones the draft
visits when it drafts (prefixes taken from a corpus, continuations sampled from the draft itself,
optionally mixed with corpus continuations), and the loss is a divergence between the target's
and the draft's next-token distributions at those states. The divergence that matters is total
variation: at a state with target ``p`` and draft ``q`` the token-wise verifier accepts with
probability ``sum_x min(p(x), q(x)) = 1 - TV(p, q)``, so minimising TV maximises acceptance
directly. Forward KL, reverse KL and Jensen-Shannon are available for comparison.

Vocabularies: the draft may have fewer (or more) logits than the target when one is a padded
prefix of the other (32000 vs 32064); ids only one model has are given probability zero under
the other. Different tokenizers are refused (``check_vocab``).

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> cfg = dict(vocab_size=259, intermediate_size=64, num_attention_heads=2,
...            num_key_value_heads=2, max_position_embeddings=64)
>>> _ = torch.manual_seed(0)
>>> target = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, **cfg))
>>> draft = LlamaForCausalLM(LlamaConfig(hidden_size=16, num_hidden_layers=1, **cfg))
>>> stream = [list(range(200))]
>>> res = distill(target, draft, stream, steps=30, batch_size=4, prefix_len=8,
...               continuation_len=8, lr=1e-2, rng=0)
>>> res.alpha_after > res.alpha_before
True
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..models.facts import execution_device, model_vocab_size
from ..models.transformers_api import output_cache, state_kwarg
from ..request.progress import progress_bar

DIVERGENCES = ("tv", "fkl", "rkl", "jsd")


@dataclass
class DistillResult:
    """What ``distill`` did.

    ``alpha_before``/``alpha_after``: the mean acceptance probability ``E[sum_x min(p, q)]`` of
    the draft against the target over the evaluation states (see ``distill``'s ``eval_on``).
    ``losses``: the training loss at every step. ``history``: ``(step, alpha)`` at every
    evaluation, first and last included.
    """

    alpha_before: float
    alpha_after: float
    losses: list[float]
    steps: int
    divergence: str
    history: list[tuple[int, float]] = field(default_factory=list)
    seconds: float = 0.0
    eval_on: str = "target"
    temperature: float = 1.0


# --------------------------------------------------------------------------------------------
# vocabularies


def check_vocab(target: torch.nn.Module, draft: torch.nn.Module, tokenizer=None,
                draft_tokenizer=None) -> int:
    """Check that target and draft share a vocabulary; return the number of shared ids.

    The rule is the library's one rule, ``speculate.domains.text.check_vocabularies`` (the
    same pairs are accepted by ``distill`` and by ``SpeculativeGenerator``): equal logit widths,
    or widths differing by padding; different tokenizers and different BOS/EOS ids are refused
    with ``ValueError``. Distillation adds one requirement: every id of the tokenizer must be
    a logit of both models (the texts are fed to both).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> small = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
    ...              num_attention_heads=2, num_key_value_heads=2)
    >>> a = LlamaForCausalLM(LlamaConfig(vocab_size=259, **small))
    >>> check_vocab(a, LlamaForCausalLM(LlamaConfig(vocab_size=264, **small)))  # padding
    259
    >>> check_vocab(a, LlamaForCausalLM(LlamaConfig(vocab_size=1000, **small)))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: draft vocabulary (1000 ids) and target vocabulary (259 ids) differ by more ...
    """
    from ..models.facts import check_vocabularies

    check_vocabularies(target, draft, tokenizer, draft_tokenizer)
    vt, vd = model_vocab_size(target), model_vocab_size(draft)
    for tok in (tokenizer, draft_tokenizer):
        if tok is not None and len(tok) > min(vt, vd):
            who = "target" if vt < vd else "draft"
            raise ValueError(f"the tokenizer has {len(tok)} ids but the {who} has only "
                             f"{min(vt, vd)} logits: it was trained with a different vocabulary")
    return min(vt, vd)


# --------------------------------------------------------------------------------------------
# data


def token_stream(texts, tokenizer=None) -> torch.Tensor:
    """Concatenate documents into one int64 id stream ``[N]``.

    ``texts``: strings (tokenized with ``tokenizer``, whose EOS is appended to each document),
    or sequences/arrays/tensors of token ids (used as they are), or one 1-D id tensor.
    """
    if isinstance(texts, torch.Tensor):
        if texts.dim() != 1:
            raise ValueError(f"a tensor of ids must be 1-D, got shape {tuple(texts.shape)}")
        return texts.to(torch.int64).cpu()
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a sequence of documents, not one string")
    parts: list[torch.Tensor] = []
    for t in texts:
        if isinstance(t, str):
            if tokenizer is None:
                raise ValueError("texts are strings: pass tokenizer= to encode them")
            ids = list(tokenizer(t).input_ids)
            if getattr(tokenizer, "eos_token_id", None) is not None:
                ids.append(tokenizer.eos_token_id)
            parts.append(torch.tensor(ids, dtype=torch.int64))
        else:
            parts.append(torch.as_tensor(t, dtype=torch.int64).reshape(-1).cpu())
    if not parts:
        raise ValueError("texts is empty")
    return torch.cat(parts)


def sample_windows(stream: torch.Tensor, n: int, length: int,
                   generator: torch.Generator) -> torch.Tensor:
    """``n`` random windows ``[n, length]`` of the stream (uniform start offsets)."""
    if stream.numel() < length:
        raise ValueError(f"the texts hold {stream.numel()} tokens, fewer than one window of "
                         f"{length} (prefix_len + continuation_len)")
    starts = torch.randint(0, stream.numel() - length + 1, (n,), generator=generator)
    return stream[starts[:, None] + torch.arange(length)]  # [n, length]


# --------------------------------------------------------------------------------------------
# distributions, divergences, acceptance


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    dev = execution_device(model)
    return model(input_ids=ids.to(dev), use_cache=False).logits  # [B, L, V]


def _shared_probs(logits_t: torch.Tensor, logits_d: torch.Tensor, temperature: float):
    """Float32 p, q over the union of ids ``[..., max(Vt, Vd)]``: ids a model lacks get zero."""
    logits_t = logits_t.float() / temperature
    logits_d = logits_d.float() / temperature
    v = max(logits_t.shape[-1], logits_d.shape[-1])
    logp = F.pad(logits_t.log_softmax(-1), (0, v - logits_t.shape[-1]), value=-math.inf)
    logq = F.pad(logits_d.log_softmax(-1), (0, v - logits_d.shape[-1]), value=-math.inf)
    return logp, logq


def divergence_loss(logits_t: torch.Tensor, logits_d: torch.Tensor, kind: str = "tv",
                    temperature: float = 1.0) -> torch.Tensor:
    """Per-state divergence ``D(p, q)`` ``[...]`` between target and draft logits ``[..., V]``.

    ``tv``: total variation (= 1 - acceptance). ``fkl``: KL(p || q). ``rkl``: KL(q || p).
    ``jsd``: Jensen-Shannon. KLs are taken over the ids both models have.

    >>> p = torch.tensor([[0.0, 0.0]]); q = torch.tensor([[0.0, math.log(3.0)]])
    >>> round(float(divergence_loss(p, q, "tv")), 6)   # |.5-.25| + |.5-.75| over 2
    0.25
    """
    if kind not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {kind!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for distillation, got {temperature}")
    logp, logq = _shared_probs(logits_t, logits_d, temperature)
    p, q = logp.exp(), logq.exp()
    if kind == "tv":
        return 0.5 * (p - q).abs().sum(-1)
    w = min(logits_t.shape[-1], logits_d.shape[-1])
    logp, logq, p, q = logp[..., :w], logq[..., :w], p[..., :w], q[..., :w]
    if kind == "fkl":
        return _kl(p, logp, logq)
    if kind == "rkl":
        return _kl(q, logq, logp)
    m = 0.5 * (p + q)
    logm = m.masked_fill(m == 0, 1.0).log()  # where m = 0 both p and q are 0: masked in _kl
    return 0.5 * (_kl(p, logp, logm) + _kl(q, logq, logm))


def _kl(a: torch.Tensor, loga: torch.Tensor, logb: torch.Tensor) -> torch.Tensor:
    """sum_x a(x) (log a(x) - log b(x)) with 0 log 0 = 0 (ids a model masks to -inf)."""
    diff = (loga - logb).masked_fill(a == 0, 0.0)  # no 0 * inf, no NaN in the gradient
    return (a * diff).sum(-1)


@torch.no_grad()
def acceptance(logits_t: torch.Tensor, logits_d: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``sum_x min(p(x), q(x))`` per state ``[...]``, in float64, of logits ``[..., Vt]`` and
    ``[..., Vd]`` at ``temperature`` (ids one model lacks have probability 0 there: min is 0).

    >>> round(float(acceptance(torch.zeros(2), torch.tensor([0.0, math.log(3.0)]))), 6)   # .5 + .25
    0.75
    """
    p = (logits_t.double() / temperature).softmax(-1)  # [..., Vt]
    q = (logits_d.to(logits_t.device).double() / temperature).softmax(-1)  # [..., Vd]
    v = min(p.shape[-1], q.shape[-1])
    return torch.minimum(p[..., :v], q[..., :v]).sum(-1)


def cosine_lr(lr: float, step: int, steps: int, warmup: int = 10) -> float:
    """The learning rate at ``step``: linear warm-up over ``warmup`` steps, then cosine decay to 10%."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def optimizer_step(opt: torch.optim.Optimizer, loss: torch.Tensor, params: list, lr: float, step: int,
                   steps: int, what: str, warmup: int = 10, grad_clip: float = 1.0) -> float:
    """One step at the scheduled learning rate (:func:`cosine_lr`), gradients clipped to ``grad_clip``
    (0: not clipped); a non-finite loss raises ``FloatingPointError`` naming ``what``. Returns the loss."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"{what} loss is {float(loss)} at step {step}")
    for group in opt.param_groups:
        group["lr"] = cosine_lr(lr, step, steps, warmup)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    return loss.item()


@torch.no_grad()
def acceptance_rate(target: torch.nn.Module, draft: torch.nn.Module, input_ids: torch.Tensor,
                    start: int = 0, temperature: float = 1.0) -> float:
    """Mean of ``sum_x min(p(x), q(x))`` over the states ``input_ids[:, :t+1]``, ``t >= start``.

    This is the probability that token-wise speculative sampling accepts a drafted token, on
    average over those states (``speculate.theory.acceptance_rate`` of the two models'
    distributions, in float64: :func:`acceptance`). ``input_ids``: int64 ``[B, L]``.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    lt = _logits(target, input_ids)[:, start:]  # [B, L - start, Vt]
    ld = _logits(draft, input_ids)[:, start:]  # [B, L - start, Vd]
    return float(acceptance(lt, ld, temperature).mean())


@torch.no_grad()
def cross_entropy(model: torch.nn.Module, input_ids: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood (nats/token) of ``input_ids`` ``[B, L]``."""
    logits = _logits(model, input_ids)[:, :-1].float()  # [B, L-1, V]
    tgt = input_ids[:, 1:].to(logits.device)  # [B, L-1]
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1)))


@torch.no_grad()
def sample_continuations(model: torch.nn.Module, prefix: torch.Tensor, n_new: int,
                         temperature: float, generator: torch.Generator,
                         width: int | None = None) -> torch.Tensor:
    """Ancestral sampling with a KV cache: ``prefix`` ``[B, P]`` -> ``[B, P + n_new]``.

    ``width`` limits sampling to ids ``< width`` (the ids the other model also has).
    """
    dev = execution_device(model)
    ids = prefix.to(dev)
    name = state_kwarg(model)  # cache / past_key_values / cache_params, by transformers release
    out = model(input_ids=ids, use_cache=True)
    past, new = output_cache(out), []
    logits = out.logits[:, -1]  # [B, V]
    for i in range(n_new):
        logits = logits.float() / temperature
        if width is not None and width < logits.shape[-1]:
            logits = logits[:, :width]
        tok = torch.multinomial(logits.softmax(-1), 1, generator=generator)  # [B, 1]
        new.append(tok)
        if i + 1 < n_new:
            out = model(input_ids=tok, use_cache=True, **{name: past})
            past, logits = output_cache(out), out.logits[:, -1]
    return torch.cat([ids, *new], dim=1).to(prefix.device) if new else prefix


# --------------------------------------------------------------------------------------------
# distillation


def distill(target: torch.nn.Module, draft: torch.nn.Module, texts, *, tokenizer=None,
            draft_tokenizer=None, divergence: str = "tv", steps: int = 200, batch_size: int = 16,
            prefix_len: int = 64, continuation_len: int = 64, on_policy: float = 1.0,
            temperature: float = 1.0, lr: float = 1e-3, weight_decay: float = 0.0,
            warmup: int = 10, grad_clip: float = 1.0, eval_texts=None, eval_batch: int = 32,
            eval_on: str = "target", eval_every: int = 0,
            rng: int | np.random.Generator | None = 0,
            log: Callable[[str], None] | None = None, progress: bool | None = None) -> DistillResult:
    """Train ``draft`` in place toward ``target``; return acceptance before and after.

    Each step takes ``batch_size`` random windows of ``prefix_len`` tokens from ``texts``; a
    fraction ``on_policy`` of the rows continues with ``continuation_len`` tokens sampled from
    the draft at ``temperature`` (the others keep the corpus continuation); the loss is the mean
    ``divergence`` between target and draft next-token distributions (both at ``temperature``)
    over the continuation states. The target is frozen; AdamW with linear warm-up and cosine
    decay to 10% trains the draft; gradients are clipped to ``grad_clip``.

    Acceptance is measured on fixed evaluation states drawn from ``eval_texts`` (default:
    ``texts``): ``eval_on="target"`` continues ``eval_batch`` prefixes with ``continuation_len``
    tokens sampled from the target, i.e. the states speculative sampling actually meets;
    ``eval_on="data"`` uses the corpus continuations.

    ``rng``: an int seed, a numpy Generator or None; it seeds the torch generators of the data
    windows, the evaluation states and the draft's samples (an int ``s`` seeds them with
    ``s + 1`` .. ``s + 4``). ``texts``: strings (then ``tokenizer`` is required) or sequences of
    token ids. Models may be
    on any device; the target's and draft's parameters are used where they are. Raises
    ``ValueError`` on incompatible vocabularies (see ``check_vocab``) or bad arguments.
    ``progress``: a progress bar over the steps (None: on a terminal with tqdm installed; see
    ``speculate.domains.text.request.progress``).
    """
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    if eval_on not in ("target", "data"):
        raise ValueError(f"eval_on must be 'target' or 'data', got {eval_on!r}")
    for name, v in (("steps", steps), ("batch_size", batch_size), ("prefix_len", prefix_len),
                    ("continuation_len", continuation_len), ("eval_batch", eval_batch)):
        if not isinstance(v, int) or v < (0 if name == "steps" else 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 0.0 <= on_policy <= 1.0:
        raise ValueError(f"on_policy must be in [0, 1], got {on_policy}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if not any(p.requires_grad for p in draft.parameters()):
        raise ValueError("the draft has no trainable parameters (all requires_grad=False)")
    width = check_vocab(target, draft, tokenizer, draft_tokenizer)
    say = log or (lambda s: None)
    t_start = time.perf_counter()
    seed = int(rng) if isinstance(rng, (int, np.integer)) else int(np.random.default_rng(rng).integers(2**62))

    stream = token_stream(texts, tokenizer if tokenizer is not None else draft_tokenizer)
    if int(stream.max()) >= width or int(stream.min()) < 0:
        raise ValueError(f"texts hold token ids outside [0, {width}): ids must exist in both "
                         "models")
    eval_stream = stream if eval_texts is None else token_stream(
        eval_texts, tokenizer if tokenizer is not None else draft_tokenizer)
    length = prefix_len + continuation_len
    dev_d = execution_device(draft)
    dev_t = execution_device(target)

    def gen(device: torch.device, s: int) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(s)

    # Fixed evaluation states.
    eval_ids = sample_windows(eval_stream, eval_batch, length, gen(torch.device("cpu"), seed + 1))
    if eval_on == "target":
        eval_ids = sample_continuations(target, eval_ids[:, :prefix_len], continuation_len,
                                        temperature, gen(dev_t, seed + 2), width)

    was_training_t, was_training_d = target.training, draft.training
    target.eval()

    def evaluate() -> float:
        draft.eval()
        a = acceptance_rate(target, draft, eval_ids, start=prefix_len - 1,
                            temperature=temperature)
        draft.train()
        return a

    history = [(0, evaluate())]
    say(f"distill: alpha before = {history[0][1]:.4f}")

    decay, no_decay = [], []
    for p in draft.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))

    g_data, g_draft = gen(torch.device("cpu"), seed + 3), gen(dev_d, seed + 4)
    n_policy = round(on_policy * batch_size)
    losses: list[float] = []
    draft.train()
    bar_cm = progress_bar(steps, "distill", enabled=progress, unit="step")
    bar = bar_cm.__enter__()
    try:
        for step in range(steps):
            ids = sample_windows(stream, batch_size, length, g_data)  # [B, L]
            if n_policy > 0:
                draft.eval()
                ids[:n_policy] = sample_continuations(
                    draft, ids[:n_policy, :prefix_len], continuation_len, temperature, g_draft,
                    width).cpu()
                draft.train()
            with torch.no_grad():
                lt = _logits(target, ids)[:, prefix_len - 1:]  # [B, C+1, Vt]
            ld = _logits(draft, ids)[:, prefix_len - 1:]  # [B, C+1, Vd]
            loss = divergence_loss(lt.to(ld.device), ld, divergence, temperature).mean()
            losses.append(optimizer_step(opt, loss, decay + no_decay, lr, step, steps, "distillation",
                                         warmup, grad_clip))
            bar.update(1)
            if eval_every and (step + 1) % eval_every == 0 and step + 1 < steps:
                history.append((step + 1, evaluate()))
                say(f"distill: step {step + 1}/{steps} loss {losses[-1]:.4f} "
                    f"alpha {history[-1][1]:.4f}")
        if steps:
            history.append((steps, evaluate()))
    finally:
        bar_cm.__exit__(None, None, None)
        target.train(was_training_t)
        draft.train(was_training_d)
    say(f"distill: alpha after = {history[-1][1]:.4f}")
    return DistillResult(alpha_before=history[0][1], alpha_after=history[-1][1], losses=losses,
                         steps=steps, divergence=divergence, history=history,
                         seconds=time.perf_counter() - t_start, eval_on=eval_on,
                         temperature=temperature)
