"""Plug-in domains for speculate (installed as ``speculate.domains``; the repository keeps them in its
top-level domains/ folder): each supplies its target, draft, step and snapshot as a Process
(speculate.rounds) and reuses the one verification core.

``REGISTRY`` names every registered domain; each ``speculate.domains.<name>.conformance.conformance_cases()``
returns the cases the shared exactness suite (tests/test_conformance.py) runs over every domain.
"""

REGISTRY = ("text", "rl", "physics", "diffusion")
