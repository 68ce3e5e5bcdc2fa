"""What more than one domain uses (not a domain: no process, api or demo of its own, not in ``REGISTRY``).

- :mod:`.gaussian_drift`: chains of Gaussian steps whose mean a costly field drives (the physics
  domain's force, the diffusion domain's eps): their kinds of draft, the cuts that keep a round exact,
  the round's record, the counters both domains add to ``speculate.Stats`` and the checks of the
  round loop's ``lookahead`` and ``cost_ratio`` both domains' APIs make.
"""
