"""Running the HTTP app: :func:`serve` (engine + app + uvicorn in the foreground, as ``speculate serve``
does; the engine drains on exit) and :func:`running_server` (uvicorn in a background thread on a free
port, for tests and benchmarks).

    from speculate.domains.text import SpeculativeGenerator
    from speculate.domains.text.examples.pair import load_pair
    target, draft, tok = load_pair()
    serve(SpeculativeGenerator(target, draft, tokenizer=tok), port=8000)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

__all__ = ["embedded_generator", "running_server", "serve"]


def embedded_generator(lookahead: int | str = "auto", device: str | None = None) -> Any:
    """A :class:`~speculate.domains.text.SpeculativeGenerator` on the embedded pair (target, draft and
    byte tokenizer, with its chat template)."""
    from ..api import SpeculativeGenerator
    from ..examples.pair import load_pair

    target, draft, tok = load_pair(device=device)
    return SpeculativeGenerator(target, draft, lookahead=lookahead, tokenizer=tok)


def serve(generator: Any = None, *, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 32,
          max_queue: int = 64, model_name: str = "speculate", log_level: str = "info",
          drain_timeout: float = 30.0) -> None:
    """Serve ``generator`` (a ``SpeculativeGenerator`` built with ``tokenizer=``; default: the embedded
    pair) on ``host:port`` until interrupted (Ctrl-C / SIGTERM). On exit uvicorn stops accepting and
    lets open requests finish (up to ``drain_timeout`` seconds), then the engine drains its running
    jobs and ends the rest with ``finish_reason`` "error"."""
    import uvicorn

    from .app import make_app
    from .engine import Engine

    if generator is None:
        generator = embedded_generator()
    engine = Engine(generator, max_batch=max_batch, max_queue=max_queue, model_name=model_name).start()
    app = make_app(engine)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        yield
        app.state.draining = True  # uvicorn has closed its sockets and let open requests finish
        await asyncio.to_thread(engine.shutdown, drain_timeout)

    app.router.lifespan_context = lifespan

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # /health answers 503 from the signal on
            app.state.draining = True
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=max(1, round(drain_timeout)))
    try:
        _Server(config).run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled: the shutdown is done
        pass
    finally:
        app.state.draining = True
        engine.shutdown(timeout=drain_timeout)  # a no-op after the lifespan's (a failed start: here)


@contextmanager
def running_server(engine: Any, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                   start_timeout: float = 30.0) -> Iterator[str]:
    """Serve ``engine`` (started; the caller shuts it down) with uvicorn in a background thread and
    yield the base URL (``http://127.0.0.1:PORT``; ``port=0``: a free port). The server stops on exit."""
    import uvicorn

    from .app import make_app

    server = uvicorn.Server(uvicorn.Config(make_app(engine), host=host, port=port, log_level=log_level,
                                           lifespan="off", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, name="speculate-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start on {host}:{port} (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the HTTP server did not start within {start_timeout} s")
            time.sleep(0.01)
        bound = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{f'[{host}]' if ':' in host else host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout)
