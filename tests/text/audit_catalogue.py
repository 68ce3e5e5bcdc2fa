"""A catalogue of the exactness bugs speculative decoders have shipped, each planted in OUR text path
as one switchable fault (a monkeypatch, in tests only), so that the audit and the project's own law
tests can be shown to catch every one of them (tests/text/test_text_audit_catalogue.py).

Each :class:`Fault` names the upstream issue, what was wrong, how it is planted here, and the total
variation (TV) it induces on the audit's standard case (:data:`CASE`: the joint law of the first 3
new tokens of one prompt, a 2-layer target and a 1-layer draft on 8 tokens, lookahead 2,
temperature 0.8, top-k 4, top-p 0.9, min-p 0.15, EOS = token ``CASE.eos``). The TV is computed
EXACTLY by :func:`exact_law`, an enumeration of the generator's rounds (every drafted path, every
verification outcome, float64 forwards) with the fault's wrong piece in place; without a fault it
reproduces ``continuation_law`` (checked by the tests), so the numbers are the faults' own.

| fault | upstream | what was wrong | TV |
|---|---|---|---|
| residual-softmaxed | transformers #28508 | the rejection residual softmaxed instead of normalised | 0.734 |
| greedy-draft-vs-softmax | transformers #30778 / #32867 | a greedy draft verified against its softmax | 0.168 |
| raw-logit-q | transformers #47932 | sampled from the processed law, verified with the raw logits' softmax | 0.084 |
| target-unfiltered | vLLM #9834 / PR #10198 | target law without top-p and temperature, draft's filtered | 0.317 |
| min-p-not-on-target | SGLang #10617 | min_p not applied to the target | 0.136 |
| eos-in-block-missed | transformers #47931 | an EOS accepted inside a block did not end the row | 0.280 |
| block-as-token-rule | vllm-ascend #7807 / PR #7808 | the block path ran the token test and residual | 0.059 |
| bf16-draft | DeepSpec #31 | drafts sampled from bfloat16 logits, accepted with the float32 law | 0.062 (offset 20) |
| ranks-disagree | vLLM #17498 / PR #17929 | own uniforms per rank: count from one, token from another | 0.073 (T 1) |
| nan-greedy-temperature | vLLM #27077 | greedy marker 0 not swapped: target law softmax(logits / 0), NaN | 1.0 (T 0) |

vLLM #17498 happened across processes (tensor-parallel ranks without a shared seed: each ran the
rejection sampler with its own random state, so ranks accepted different tokens). Its one-process
analogue here: the round verified twice by our own kernels with independent uniforms, the count of
accepted drafts taken from one verification and the token after them from the other (a row assembled
from two ranks' verdicts). Its exact law is the product of the token rule with itself
(:func:`split_rule`). At the standard case's temperature 0.8 its TV is 0.0410, under the audit's
default 0.05 (the default audit's power against that deviation is 0.94); at temperature 1 (its case
here) it is 0.0726, with 1.2% of its mass on outcomes the law excludes.

vLLM #27077 hit greedy rows (temperature 0; at 0.8 the plant changes nothing): their logits were
divided by the new greedy marker 0. Planted on the target's side of our path, the law it verifies
with is NaN; our greedy verifier refuses it (``ValueError``: "probabilities contain NaN"), so the
generator raises and the audit reports the sampler's error (verdict ``"error"``); nothing wrong is
ever sampled. ``Fault.unguarded`` removes that guard too (a NumPy argmax that reads NaN rows, as a
GPU argmax would): token 0 at every position, an outcome the greedy law excludes (TV 1), rejected by
the audit on its first sample and by the law test.

``python tests/text/audit_catalogue.py`` prints this table with the TVs recomputed; each fault's
``tv`` field holds its number and the tests check it against :func:`exact_law`. Every TV is above
the audit's default ``tv`` (0.05) on its case: the default audit catches each of them with probability >= 0.99.
bfloat16 rounding alone is a tiny bias (TV 0.0002 with logits near 0, 0.01 near 20 without top-k / top-p /
min-p); what makes DeepSpec #31 visible is the filtered support it moves (a token one law keeps and the
other drops), so its case adds 20 to the draft's logits (no change to its float32 law).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from speculate.domains.text.request.sampling import SamplingConfig, probabilities


@dataclass(frozen=True)
class Case:
    prompt: tuple[int, ...] = (2, 4, 6)
    tokens: int = 3
    lookahead: int = 2
    temperature: float = 0.8
    top_k: int = 4
    top_p: float = 0.9
    min_p: float = 0.15
    eos: int = 4
    vocab: int = 8
    draft_offset: float = 0.0  #: a constant added to the draft's logits (no change to its law; bf16 rounds it)

    @property
    def cfg(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def settings(self) -> dict[str, Any]:
        """SpeculativeGenerator.generate keyword arguments of the case."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                    eos_token_id=[self.eos])


CASE = Case()


def case_models(case: Case = CASE) -> tuple[Any, Any]:
    from speculate.domains.text.conformance import tiny_llama

    draft = tiny_llama(vocab=case.vocab, layers=1, hidden=16, heads=2, kv_heads=1, rng=1)
    if case.draft_offset:
        draft.lm_head.bias = torch.nn.Parameter(torch.full((case.vocab,), float(case.draft_offset)))
    return tiny_llama(vocab=case.vocab), draft


# --------------------------------------------------------------------------- verification rules
# Each rule maps the target's laws p[0..L] along a drafted path x[0..L-1] and the draft laws q[0..L-1]
# the verifier is told about to a list of (tau, law of the next token, probability over the uniforms).


def _norm(v: np.ndarray) -> np.ndarray:
    s = v.sum()
    return v / s if s > 0 else v


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return _norm(np.maximum(p - q, 0.0))


def softmaxed_residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """transformers #28508: the residual softmaxed instead of normalised (every token gets mass)."""
    r = np.maximum(p - q, 0.0)
    e = np.exp(r - r.max())
    return e / e.sum()


def token_rule(p: list, q: list, x: tuple, res: Callable = residual) -> list[tuple[int, np.ndarray, float]]:
    out, alive = [], 1.0
    for i, xi in enumerate(x):
        # a drafted token the verifier's q gives 0 (only with the bf16 fault): accepted, p / q = inf, as
        # upstream's float arithmetic does (our kernels refuse such a draft with a ValueError)
        a = 1.0 if q[i][xi] <= 0 else min(1.0, p[i][xi] / q[i][xi])
        out.append((i, res(p[i], q[i]), alive * (1 - a)))
        alive *= a
    out.append((len(x), p[len(x)], alive))
    return out


def block_rule(p: list, q: list, x: tuple) -> list[tuple[int, np.ndarray, float]]:
    """Sun et al. (2024): exact."""
    L = len(x)
    P = [1.0]
    for i, xi in enumerate(x):
        P.append(min(P[-1] * p[i][xi] / q[i][xi], 1.0))
    h = []
    for i in range(L):
        R = np.maximum(P[i] * p[i] - q[i], 0).sum()
        h.append(1.0 if i == 0 else R / (R + 1 - P[i]))
    h.append(P[L])
    out = []
    for t in range(L + 1):
        pr = h[t] * np.prod([1 - h[j] for j in range(t + 1, L + 1)])
        nxt = p[L] if t == L else _norm(np.maximum(P[t] * p[t] - q[t], 0))
        out.append((t, nxt, pr))
    return out


def block_as_token_rule(p: list, q: list, x: tuple) -> list[tuple[int, np.ndarray, float]]:
    """vllm-ascend #7807: the block path kept the longest prefix passing the token rule's test on the
    running ratio (U_i <= P_i, no h_i correction) and resampled from the token residual."""
    L = len(x)
    P = [1.0]
    for i, xi in enumerate(x):
        P.append(min(P[-1] * p[i][xi] / q[i][xi], 1.0))
    out = []
    for t in range(L + 1):
        pr = (P[t] if t > 0 else 1.0) * np.prod([1 - P[j] for j in range(t + 1, L + 1)])
        out.append((t, p[L] if t == L else residual(p[t], q[t]), pr))
    return out


def split_rule(p: list, q: list, x: tuple) -> list[tuple[int, np.ndarray, float]]:
    """vLLM #17498: two "ranks" verify the same drafts with the token rule, each with its OWN uniforms;
    the row keeps rank A's count of accepted drafts and rank B's token after them (drawn where B
    stopped: its residual, or its bonus token when it accepted everything). A and B are independent
    given the drafts, so the round's law is the product of the token rule's law with itself."""
    law = token_rule(p, q, x)
    return [(a, nd, pa * pb) for a, _, pa in law for _, nd, pb in law]


def greedy_rule(p: list, q: list, x: tuple) -> list[tuple[int, np.ndarray, float]]:
    """Temperature 0 verified by argmax with no check of what it reads (``np.argmax``, like
    ``torch.argmax``, takes a NaN for the maximum): the drafts up to the first that is not the target's
    argmax, then that argmax. On finite one-hot laws it is the token rule's greedy case."""
    def top(v: np.ndarray) -> np.ndarray:
        out = np.zeros(len(v))
        out[int(np.argmax(v))] = 1.0
        return out

    for i, xi in enumerate(x):
        if xi != int(np.argmax(p[i])):
            return [(i, top(p[i]), 1.0)]
    return [(len(x), top(p[len(x)]), 1.0)]


# ------------------------------------------------------------------------------------ the faults


@dataclass
class Fault:
    name: str
    issue: str
    what: str
    verify: str  #: the rule the standard case runs
    tv: float  #: exact TV on the standard case (exact_law vs continuation_law); checked by the tests
    plant: Callable[[Any], contextlib.AbstractContextManager]  #: monkeypatch -> context that plants it
    # the engine's wrong pieces (None: the correct one)
    rule: Callable | None = None
    target_cfg: SamplingConfig | None = None  #: the law the verifier's p is computed with
    report_q: str = "law"  #: what q the verifier is told: "law" (what was sampled from) or "raw"
    sample_q: str = "law"  #: what the draft samples from: "law", "argmax", "bf16"
    eos_in_block: bool = True  #: False: an EOS among the accepted drafts does not end the row
    target_nan: bool = False  #: the verifier's target laws are all NaN (vLLM #27077's division by 0)
    case: Case = CASE  #: the case it is measured and caught on (the standard one but for bf16-draft, #27077)
    #: a fault our own guard refuses: the ValueError (regex) a run raises with ``plant`` alone, and
    #: ``unguarded``, the plant with that guard removed too (what the audit and the law test must catch)
    raises: str | None = None
    unguarded: Callable[[Any], contextlib.AbstractContextManager] | None = None

    @property
    def caught(self) -> Callable[[Any], contextlib.AbstractContextManager]:
        """The plant the audit and the law test are shown to catch (without our guard, if it has one)."""
        return self.unguarded or self.plant


def _wrap(monkeypatch: Any, obj: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    monkeypatch.setattr(obj, name, make(getattr(obj, name)))


@contextlib.contextmanager
def _planted(monkeypatch: Any, patches: list[tuple[Any, str, Callable]]) -> Iterator[None]:
    with monkeypatch.context() as mp:
        for obj, name, make in patches:
            _wrap(mp, obj, name, make)
        yield


def _rule_patch(rule_fn: Callable, res: Callable = residual) -> tuple[Any, str, Callable]:
    """speculate.verify.one_round._categorical replaced by a NumPy round running ``rule_fn``."""
    from speculate.verify import one_round

    def make(real: Callable) -> Callable:
        def faulty(target, proposal, rule, m, k, R, lengths, rng):
            if rule == "greedy" or m != 1:
                return real(target, proposal, rule, m, k, R, lengths, rng)
            oshape, outcomes = one_round.round_outcomes(target, proposal, rule, m, k, R)
            p = np.asarray(target.probs, np.float64)
            q = np.asarray(one_round._draft_probs(proposal.dists, outcomes, oshape, target.num_outcomes,
                                                  target.probs.dtype), np.float64)
            n, nxt = np.zeros(R, np.int64), np.zeros(R, np.int64)
            for r in range(R):
                L = int(lengths[r])
                x = tuple(int(v) for v in outcomes[r, :L])
                law = (rule_fn(list(p[r]), list(q[r]), x, res) if rule_fn is token_rule
                       else rule_fn(list(p[r]), list(q[r]), x))
                probs = np.array([w for _, _, w in law])
                t = int(rng.choice(len(law), p=probs / probs.sum()))
                tau, nd, _ = law[t]
                n[r], nxt[r] = tau, int(rng.choice(nd.size, p=_norm(np.maximum(nd, 0))))
            return n, nxt, np.zeros(R, np.int64), rule
        return faulty

    return (one_round, "_categorical", make)


def _score_with(swap: Callable) -> tuple[Any, str, Callable]:
    """A patch of TextProcess.score that scores the target with ``swap(the request's transforms)``
    (the draft keeps the request's own)."""
    from speculate.domains.text import process

    def make(real: Callable) -> Callable:
        def score(self, rows, proposal):
            keep = self.cfg
            self.cfg = swap(keep)
            try:
                return real(self, rows, proposal)
            finally:
                self.cfg = keep
        return score

    return (process.TextProcess, "score", make)


def _target_cfg_patch(cfg: SamplingConfig) -> tuple[Any, str, Callable]:
    """The target's probabilities computed with ``cfg`` (the draft's keep the request's settings)."""
    from speculate.domains.text.request.processors import Transforms

    return _score_with(lambda keep: Transforms(cfg, keep.before, keep.user, keep.min_new, keep.eos))


def _draft_patches(report: str, sample: str) -> list[tuple[Any, str, Callable]]:
    """The model draft samples from one law and reports another (drafts/model.py's _probs/_sample)."""
    from speculate.domains.text.drafts import model as dm

    stash: dict[str, np.ndarray] = {}

    def make_probs(real: Callable) -> Callable:
        def probs(self, logits, cfg, vocab, *a, **kw):
            law = real(self, logits, cfg, vocab, *a, **kw)
            if sample == "bf16":
                stash["sample"] = real(self, logits.to(torch.bfloat16).float(), cfg, vocab, *a, **kw).cpu().numpy()
            elif sample == "argmax":
                hot = np.zeros(law.shape, np.float32)
                hot[np.arange(law.shape[0]), law.argmax(-1).cpu().numpy()] = 1.0
                stash["sample"] = hot
            else:
                stash["sample"] = law.cpu().numpy()
            if report == "raw":  # transformers #47932: the softmax of the raw logits
                return logits[..., :vocab].float().softmax(-1)
            return law
        return probs

    def make_sample(real: Callable) -> Callable:
        def sample(q, rng):
            return real(np.ascontiguousarray(stash.pop("sample"), dtype=np.float32), rng)
        return sample

    return [(dm.ModelDraft, "_probs", make_probs), (dm, "_sample", make_sample)]


def _eos_patch() -> tuple[Any, str, Callable]:
    """transformers #47931: an EOS among the accepted drafts is missed; only the round's last token ends a row."""
    from speculate.domains.text import process

    def make(real: Callable) -> Callable:
        def commit(self, rows, proposal, verdict):
            eos = self.eos
            self.eos = np.zeros(0, np.int64)
            try:
                n_used, done = real(self, rows, proposal, verdict)
            finally:
                self.eos = eos
            last = verdict.outcomes[np.arange(len(n_used)), n_used - 1]
            hit = np.isin(last, eos)
            return n_used, hit if done is None else (done | hit)
        return commit

    return (process.TextProcess, "commit", make)


def _ranks_patch() -> tuple[Any, str, Callable]:
    """vLLM #17498: the round verified twice, as two unsynchronised ranks would, each drawing its own
    uniforms from the round's generator; the count accepted from the first, the token after them from
    the second (our kernels, unchanged, run both verifications)."""
    from speculate.verify import one_round

    def make(real: Callable) -> Callable:
        def faulty(target, proposal, rule, m, k, R, lengths, rng):
            n_a, _, branch, used = real(target, proposal, rule, m, k, R, lengths, rng)  # rank A
            _, nxt_b, _, _ = real(target, proposal, rule, m, k, R, lengths, rng)  # rank B: its own uniforms
            return n_a, nxt_b, branch, used
        return faulty

    return (one_round, "_categorical", make)


OLD_GREEDY_MARKER = -1.0  #: vLLM's greedy temperature before the change that #27077 completed (then 0.0)


class _MarkerTransforms:
    """The target's transforms with vLLM #27077's temperature handling: the scores are divided by the
    row's temperature after swapping the greedy MARKER for 1, but the swap still looks for the old
    marker (-1) while greedy rows now carry 0: logits / 0 is +-inf (0 / 0 NaN), its softmax NaN."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def probs(self, logits, tokens, rows, drafts, first=0, dtype=torch.float32):
        t = float(self._real.cfg.temperature)
        x = self._real.scores(logits, tokens, rows, drafts, first, dtype)
        if t == OLD_GREEDY_MARKER:  # the swap, looking for the old marker: never true now
            t = 1.0
        if self._real.cfg.greedy:
            return torch.softmax(x / t, dim=-1)  # greedy rows: logits / 0
        return self._real.probs(logits, tokens, rows, drafts, first, dtype)


def _marker_patch() -> tuple[Any, str, Callable]:
    """vLLM #27077 on the target's side of our path (TextProcess.score's law; the draft is untouched)."""

    return _score_with(_MarkerTransforms)


def _unguarded_greedy_patch() -> tuple[Any, str, Callable]:
    """Our guard removed: the greedy verification replaced by a NumPy argmax that reads NaN rows
    without refusing them (our kernel, speculate/verify/greedy.py, reports NOT_FINITE and the round
    raises); ``np.argmax`` of an all-NaN row is 0, as ``torch.argmax`` on a GPU has it."""
    from speculate.verify import one_round

    def make(real: Callable) -> Callable:
        def faulty(target, proposal, rule, m, k, R, lengths, rng):
            if rule != "greedy":
                return real(target, proposal, rule, m, k, R, lengths, rng)
            _, outcomes = one_round.round_outcomes(target, proposal, rule, m, k, R)
            top = np.argmax(np.asarray(target.probs), axis=-1)  # [R, k + 1]: a NaN is the maximum
            n, nxt = np.zeros(R, np.int64), np.zeros(R, np.int64)
            for r in range(R):
                L = int(lengths[r])
                miss = np.flatnonzero(np.asarray(outcomes[r, :L]) != top[r, :L])
                n[r] = int(miss[0]) if miss.size else L
                nxt[r] = top[r, n[r]]
            return n, nxt, np.zeros(R, np.int64), rule
        return faulty

    return (one_round, "_categorical", make)


def _no_top_p_temperature() -> SamplingConfig:
    return SamplingConfig(temperature=1.0, top_k=CASE.top_k, min_p=CASE.min_p)


def _no_min_p() -> SamplingConfig:
    return SamplingConfig(temperature=CASE.temperature, top_k=CASE.top_k, top_p=CASE.top_p)


FAULTS: list[Fault] = [
    Fault("residual-softmaxed", "transformers #28508",
          "the rejection residual softmaxed instead of normalised (max(p - q, 0) -> softmax)", "token", 0.7340,
          lambda mp: _planted(mp, [_rule_patch(token_rule, softmaxed_residual)]),
          rule=functools.partial(token_rule, res=softmaxed_residual)),
    Fault("greedy-draft-vs-softmax", "transformers #30778 / #32867",
          "a greedy (argmax) draft verified against its softmax, as if it had sampled from it", "token", 0.1681,
          lambda mp: _planted(mp, _draft_patches("law", "argmax")), sample_q="argmax"),
    Fault("raw-logit-q", "transformers #47932",
          "the draft sampled from its processed law but the verifier was told the softmax of its raw logits",
          "token", 0.0843, lambda mp: _planted(mp, _draft_patches("raw", "law")), report_q="raw"),
    Fault("target-unfiltered", "vLLM #9834 / PR #10198",
          "the target's probabilities ignored top-p and temperature while the draft's were filtered", "token", 0.3173,
          lambda mp: _planted(mp, [_target_cfg_patch(_no_top_p_temperature())]), target_cfg=_no_top_p_temperature()),
    Fault("min-p-not-on-target", "SGLang #10617",
          "min_p (and logit_bias) not applied to the target under EAGLE", "token", 0.1360,
          lambda mp: _planted(mp, [_target_cfg_patch(_no_min_p())]), target_cfg=_no_min_p()),
    Fault("eos-in-block-missed", "transformers #47931",
          "an EOS accepted inside a drafted block did not end the row (only the last token was checked)", "token",
          0.2804, lambda mp: _planted(mp, [_eos_patch()]), eos_in_block=False),
    Fault("block-as-token-rule", "vllm-ascend #7807 / PR #7808",
          "block verification kept the longest prefix passing the token test on the running ratio and "
          "resampled from the token residual (no h_i correction, no P_tau factor)", "block", 0.0591,
          lambda mp: _planted(mp, [_rule_patch(block_as_token_rule)]), rule=block_as_token_rule),
    Fault("bf16-draft", "DeepSpec #31",
          "drafts sampled from bfloat16 logits, accepted with the float32 law (logits near 20, where bfloat16's "
          "spacing is 0.125: filtered supports differ, and a draft the float32 law excludes is accepted, p/q = inf; "
          "our own kernels would refuse it, so the plant verifies with a NumPy token rule that does not)", "token",
          0.0616, lambda mp: _planted(mp, [*_draft_patches("law", "bf16"), _rule_patch(token_rule)]), sample_q="bf16",
          case=replace(CASE, draft_offset=20.0)),
    Fault("ranks-disagree", "vLLM #17498 / PR #17929",
          "with tensor parallelism and no seed, each rank ran the rejection sampler with its own random state "
          "and ranks accepted different tokens; one process's analogue: the round verified twice with "
          "independent uniforms, the count accepted taken from one verification and the token after them "
          "from the other (at temperature 1: at the standard 0.8 its TV is 0.0410, below the audit's default 0.05)",
          "token", 0.0726, lambda mp: _planted(mp, [_ranks_patch()]), rule=split_rule,
          case=replace(CASE, temperature=1.0)),
    Fault("nan-greedy-temperature", "vLLM #27077",
          "the greedy temperature marker changed from -1 to 0 but the rejection sampler still swapped only -1 "
          "for 1 before dividing: greedy rows' logits / 0, NaN probabilities, empty outputs and negative "
          "acceptance counts; here the target's law at temperature 0 is softmax(logits / 0). Our greedy "
          "verifier refuses the NaN rows (ValueError); with that guard removed too, argmax of a NaN row "
          "emits token 0 at every position", "token", 1.0, lambda mp: _planted(mp, [_marker_patch()]),
          rule=greedy_rule, target_nan=True, case=replace(CASE, temperature=0.0),
          raises=r"NaN", unguarded=lambda mp: _planted(mp, [_marker_patch(), _unguarded_greedy_patch()])),
]
BY_NAME = {f.name: f for f in FAULTS}


# ------------------------------------------------------------------------------ the exact engine


def exact_law(target: Any, draft: Any, fault: Fault | None, case: Case = CASE, verify: str | None = None
              ) -> dict[tuple[int, ...], float]:
    """The exact law of the first ``case.tokens`` new tokens our generator produces with ``fault``
    planted (None: no fault), enumerating its rounds: each round drafts ``L = min(need - 1, k)``
    tokens from the draft's sampling law, the rule decides from the target's and the reported laws,
    the row ends at EOS (or, with the EOS fault, only when the round's last token is EOS)."""
    t64, d64 = copy.deepcopy(target).double().eval(), copy.deepcopy(draft).double().eval()
    f = fault or Fault("none", "", "", verify or "token", 0.0, lambda mp: contextlib.nullcontext(), case=case)
    rule_name = verify or f.verify
    rule = f.rule or (token_rule if rule_name == "token" else block_rule)
    p_cfg = f.target_cfg or case.cfg
    prompt = list(case.prompt)

    @functools.cache
    def logits(which: str, prefix: tuple[int, ...]) -> torch.Tensor:
        m = t64 if which == "t" else d64
        with torch.no_grad():
            return m(input_ids=torch.tensor([prompt + list(prefix)])).logits[0, -1]

    def law(lg: torch.Tensor, cfg: SamplingConfig) -> np.ndarray:
        return probabilities(lg[None], cfg, dtype=torch.float64)[0].numpy()

    @functools.cache
    def p(prefix: tuple[int, ...]) -> np.ndarray:
        if f.target_nan:  # softmax(logits / 0): every entry NaN
            return np.full(case.vocab, np.nan)
        return law(logits("t", prefix), p_cfg)

    @functools.cache
    def q_law(prefix: tuple[int, ...]) -> np.ndarray:
        return law(logits("d", prefix), case.cfg)

    @functools.cache
    def q_report(prefix: tuple[int, ...]) -> np.ndarray:
        if f.report_q == "raw":
            return law(logits("d", prefix), SamplingConfig())
        return q_law(prefix)

    @functools.cache
    def q_sample(prefix: tuple[int, ...]) -> np.ndarray:
        if f.sample_q == "argmax":
            out = np.zeros(case.vocab)
            out[int(np.argmax(q_law(prefix)))] = 1.0
            return out
        if f.sample_q == "bf16":
            return law(logits("d", prefix).to(torch.bfloat16).to(torch.float32).double(), case.cfg)
        return q_law(prefix)

    k, m, eos = case.lookahead, case.tokens, case.eos
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    while frontier:
        nxt_frontier = []
        for prefix, w in frontier:
            L = max(0, min(m - len(prefix) - 1, k))
            paths = [()] if L == 0 else itertools.product(range(case.vocab), repeat=L)
            for x in paths:
                wx = w
                for i in range(L):
                    wx *= q_sample(prefix + x[:i])[x[i]]
                    if wx == 0:
                        break
                if wx == 0:
                    continue
                ps = [p(prefix + x[:i]) for i in range(L + 1)]
                qs = [q_report(prefix + x[:i]) for i in range(L)]
                for tau, nd, pr in rule(ps, qs, x):
                    if pr <= 0:
                        continue
                    for y in np.flatnonzero(nd > 0):
                        emitted = (*x[:tau], int(y))
                        wy = wx * pr * nd[y]
                        if f.eos_in_block and eos in emitted:
                            emitted = emitted[: emitted.index(eos) + 1]
                        new = prefix + emitted
                        if len(new) >= m or emitted[-1] == eos:
                            out[new] = out.get(new, 0.0) + wy
                        else:
                            nxt_frontier.append((new, wy))
        frontier = nxt_frontier
    return out


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


def oracle(target: Any, case: Case = CASE) -> dict[tuple[int, ...], float]:
    from speculate.domains.text.continuation_law import continuation_law

    return continuation_law(target, list(case.prompt), case.tokens, case.cfg, [case.eos])


def exact_tv(fault: Fault) -> float:
    """The fault's TV on its case, computed now."""
    target, draft = case_models(fault.case)
    return tv(exact_law(target, draft, fault, fault.case), oracle(target, fault.case))


def table() -> str:
    """The catalogue as a Markdown table, TVs computed now."""
    rows = ["| fault | upstream | what was wrong | rule | TV (exact) |", "|---|---|---|---|---|"]
    for f in FAULTS:
        rows.append(f"| {f.name} | {f.issue} | {f.what} | {f.verify} | {exact_tv(f):.4f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
