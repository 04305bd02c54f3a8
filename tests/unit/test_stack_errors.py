"""A live stack whose service fails to start says why in its error: the log it would point to
goes with the stack's temporary folder."""

from __future__ import annotations

from pathlib import Path

from service.api.stack import _last_line


def test_the_error_names_the_childs_last_exception_else_its_last_line(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("INFO: starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "learned.artifact.MissingArtifactError: cost model 'learned': no trained artifact\n\n"
                   "ERROR:    Application startup failed. Exiting.\n")
    assert _last_line(log) == "learned.artifact.MissingArtifactError: cost model 'learned': no trained artifact"
    log.write_text("INFO: starting\nERROR: address already in use\n")
    assert _last_line(log) == "ERROR: address already in use"
    assert _last_line(tmp_path / "missing.log") == f"see {tmp_path / 'missing.log'}"
