"""Serving: an OpenAI-compatible HTTP server (``speculate serve``) over a continuous-batching engine.

``engine.py`` (:class:`Engine`: the batch, the round loop, admission, faults), ``rows.py`` (per-row
settings and random streams), ``types.py`` (what a request asks and what comes back)."""

from .engine import Engine, Job
from .types import Busy, JobEvent, Refused, Sampling

__all__ = ["Busy", "Engine", "Job", "JobEvent", "Refused", "Sampling"]
