"""``slicesched serve`` runs under uvicorn with its fast parts installed (pyproject.toml): uvicorn's
automatic choice picks the httptools parser and the uvloop event loop, which cut the serve
process's CPU per call under a fleet's load (benchmarks/fleet.py, docs/scaling.md)."""

from __future__ import annotations

import uvicorn
from starlette.applications import Starlette


def test_uvicorn_picks_the_httptools_parser() -> None:
    config = uvicorn.Config(Starlette())  # serve's defaults: http="auto", loop="auto"
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"


def test_uvicorn_picks_the_uvloop_event_loop() -> None:
    factory = uvicorn.Config(Starlette()).get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
