"""Retention's settings: a retention of zero (or a malformed one) is refused at start, naming
its variable, by the service's settings and by ``slicesched retention`` before Neo4j is reached."""

from __future__ import annotations

import pytest

from service.domain.error import InvalidInputError
from service.live.retention import RetentionSettings
from tests.conftest import cli_in_process


@pytest.mark.parametrize(("name", "value"), [("SLICESCHED_RETAIN_REQUESTS_S", "0"),
                                             ("SLICESCHED_RETAIN_AUDIT_S", "-5"),
                                             ("SLICESCHED_RETENTION_BATCH", "0"),
                                             ("SLICESCHED_RETAIN_OBSERVATIONS_S", "soon")])
def test_a_bad_retention_is_refused_naming_its_variable(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidInputError, match=name):
        RetentionSettings.from_env()
    out = cli_in_process("retention", "plan")
    assert out.returncode == 2 and name in out.stderr and "Traceback" not in out.stderr


def test_the_defaults_and_the_archive_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setenv("SLICESCHED_STATE", str(tmp_path))
    s = RetentionSettings.from_env()
    assert (s.requests_s, s.workflows_s, s.audit_s, s.observations_s) == (7 * 86400, 7 * 86400, 90 * 86400,
                                                                          30 * 86400)
    assert s.archive_dir is not None and str(s.archive_dir) == f"{tmp_path}/archive"
    assert s.cutoffs(1_000_000.0)["requests"] == 1_000_000.0 - 7 * 86400
