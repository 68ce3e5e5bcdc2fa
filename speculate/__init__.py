"""speculate: exact speculative sampling."""
