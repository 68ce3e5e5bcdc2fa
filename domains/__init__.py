"""Plug-in domains for speculate: text (Hugging Face causal LMs), rl (gymnasium), physics (Langevin)."""
