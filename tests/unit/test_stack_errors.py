"""A live stack whose service fails to start says why in its error: the log it would point to
goes with the stack's temporary folder; a SIGTERM unwinds a stack instead of orphaning it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from service.harness.stack import _last_line, exit_on_sigterm


def test_the_error_names_the_childs_last_exception_else_its_last_line(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("INFO: starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "learned.artifact.MissingArtifactError: cost model 'learned': no trained artifact\n\n"
                   "ERROR:    Application startup failed. Exiting.\n")
    assert _last_line(log) == "learned.artifact.MissingArtifactError: cost model 'learned': no trained artifact"
    log.write_text("INFO: starting\nERROR: address already in use\n")
    assert _last_line(log) == "ERROR: address already in use"
    assert _last_line(tmp_path / "missing.log") == f"see {tmp_path / 'missing.log'}"


def test_a_sigterm_inside_a_stack_unwinds_it_and_the_handler_is_put_back() -> None:
    original = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        previous = exit_on_sigterm()
        assert previous is signal.SIG_DFL
        with pytest.raises(SystemExit) as exc:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises at the next bytecode, well before this ends
        assert exc.value.code == 143
        assert exit_on_sigterm() is None  # a handler is in place already: left alone
    finally:
        signal.signal(signal.SIGTERM, original)
