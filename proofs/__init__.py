"""proofs/: the theorems the engine relies on, each proved in Markdown and checked by code.

See proofs/README.md for the index (theorem -> proof -> check -> code path).
"""
