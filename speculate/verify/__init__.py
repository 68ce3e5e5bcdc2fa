"""The one verification core: every acceptance rule the library applies, in this folder.

- ``token.py``, ``block.py``, ``greedy.py``, ``multi.py``, ``gaussian.py``, ``tree.py``: the rules
  as Numba kernels batched over rows, each beside its NumPy twin (same bits on the same uniforms);
  ``tree.py`` verifies a token tree (``Tree``: a parent array; multi-draft is the tree with
  branching only at the root);
- ``kernels.py``: their checked entry points ``verify_*`` / ``verify_*_reference``;
- ``device.py``: the token, block, greedy and multi-draft rules as tensor operations for
  probabilities that live on an accelerator (no host transfer; one flag per row), held to the same
  exact laws on the CPU;
- ``one_step.py``: ``verify_one``, the one-step rule for any pair of distributions (the kernels for
  Categorical and equal-scale Normal pairs, rejection from the target for the rest);
- ``one_round.py``: ``verify_round``, which routes one round of the loop to a kernel or to the
  one-step rule, and ``RULES``, the rule names.

Every function is pure: the uniforms are inputs, so a seeded caller is reproducible and the Numba
kernels can be checked bit for bit against their NumPy references.

>>> import numpy as np
>>> from speculate.verify import verify_token
>>> p = np.array([[[0.6, 0.4], [0.5, 0.5]]])          # [B=1, K+1=2, V=2]
>>> q = np.array([[[0.8, 0.2]]])                      # [B=1, K=1, V=2]
>>> verify_token(p, q, np.array([[0]]), None, np.array([[0.1]]), np.array([0.3]))
(array([1]), array([0]))
"""

from .kernels import (
    verify_block,
    verify_block_reference,
    verify_gaussian,
    verify_gaussian_reference,
    verify_greedy,
    verify_greedy_reference,
    verify_multi,
    verify_multi_reference,
    verify_token,
    verify_token_reference,
    verify_tree,
    verify_tree_greedy,
    verify_tree_greedy_reference,
    verify_tree_reference,
)
from .one_round import RULES, verify_round
from .one_step import DEFAULT_MAX_TRIES, ResidualSamplingError, verify_one
from .tree import Tree

__all__ = [
    "DEFAULT_MAX_TRIES",
    "RULES",
    "ResidualSamplingError",
    "Tree",
    "verify_block",
    "verify_block_reference",
    "verify_gaussian",
    "verify_gaussian_reference",
    "verify_greedy",
    "verify_greedy_reference",
    "verify_multi",
    "verify_multi_reference",
    "verify_one",
    "verify_round",
    "verify_token",
    "verify_token_reference",
    "verify_tree",
    "verify_tree_greedy",
    "verify_tree_greedy_reference",
    "verify_tree_reference",
]
