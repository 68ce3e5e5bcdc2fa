"""``speculate serve``: an OpenAI-compatible server over a continuous-batching engine.

``types.py`` (what the engine takes and gives), ``rows.py`` (per-row settings and random streams),
``engine.py`` (:class:`Engine`: one thread, requests joining and leaving the running batch), ``app.py``
(the HTTP layer: :func:`~.app.make_app`), ``server.py`` (:func:`~.server.serve`,
:func:`~.server.running_server`), ``cli.py`` (``speculate serve``). Only the engine's names are
imported here: fastapi and uvicorn (the HTTP layer) are the ``serve`` extra.
"""

from .engine import Engine, Job
from .types import Busy, JobEvent, Refused, Sampling

__all__ = ["Busy", "Engine", "Job", "JobEvent", "Refused", "Sampling"]
