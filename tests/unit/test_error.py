"""The one error table: every error class's HTTP answer and exit code, and the CLI using it."""

from __future__ import annotations

import pytest

from service.cli import main as cli
from service.domain import error as e

TABLE = [  # class, HTTP status (None: unmapped, answered 500 internal), kind, exit code
    (e.SliceschedError, None, "invalid_input", 1),
    (e.InvalidInputError, 400, "invalid_input", 2),
    (e.InvalidGraphError, 400, "invalid_input", 2),
    (e.InvalidClusterError, 400, "invalid_input", 2),
    (e.CatalogError, 400, "invalid_input", 2),
    (e.NotFoundError, 404, "not_found", 2),
    (e.ReadOnlyViolationError, 403, "read_only", 2),
    (e.UnauthorizedError, 401, "unauthorized", 2),
    (e.ForbiddenError, 403, "forbidden", 2),
    (e.PayloadTooLargeError, 413, "too_large", 2),
    (e.ConflictError, 409, "conflict", 2),
    (e.QueueFullError, 429, "overloaded", 3),
    (e.QuotaExceededError, 429, "quota_exceeded", 3),
    (e.InspectionBusyError, 429, "overloaded", 3),
    (e.NotServedError, 409, "not_served", 3),
    (e.InvariantError, 500, "internal", 1),
    (e.DatabaseUnavailableError, 503, "unavailable", 3),
    (e.Neo4jServerError, 503, "unavailable", 3),
    (e.NotLeaderError, 503, "not_leader", 3),
    (e.TransientError, None, "invalid_input", 1),
    (e.ApiError, None, "invalid_input", 1),
    (e.RegisterRefused, None, "invalid_input", 2),
]


@pytest.mark.parametrize(("cls", "status", "kind", "code"), TABLE, ids=[row[0].__name__ for row in TABLE])
def test_each_error_declares_its_answer(cls: type[e.SliceschedError], status: int | None, kind: str,
                                        code: int) -> None:
    assert (cls.http_status, cls.kind, cls.exit_code) == (status, kind, code)


def test_every_error_class_is_in_the_table() -> None:
    def subclasses(cls: type) -> set[type]:
        return {cls}.union(*(subclasses(s) for s in cls.__subclasses__()))

    mine = {c for c in subclasses(e.SliceschedError) if c.__module__ == e.__name__}
    assert mine - {e.ExecutorError} == {row[0] for row in TABLE}


class _Parser:
    """Stands in for the CLI's parser: every command line runs ``func``."""

    def __init__(self, func: object) -> None:
        self.func = func

    def parse_args(self, _: object) -> _Parser:
        return self


@pytest.mark.parametrize(("exc", "code"), [
    (e.InvariantError("broken"), 1),  # an internal error, no longer "Neo4j unreachable"
    (e.ConflictError("finished"), 2),
    (e.DatabaseUnavailableError("down"), 3),
    (e.Neo4jServerError("not running"), 3),
])
def test_cli_exits_with_the_declared_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          exc: e.SliceschedError, code: int) -> None:
    def fail(_: object) -> int:
        raise exc

    monkeypatch.setattr(cli, "build_parser", lambda: _Parser(fail))
    assert cli.main(["model", "list"]) == code
    assert capsys.readouterr().err == f"error: {exc}\n"


@pytest.mark.parametrize(("exc", "status", "kind"), [
    (e.InvariantError("a policy bug"), 500, "internal"),
    (e.Neo4jServerError("not running"), 503, "unavailable"),
    (e.TransientError("unmapped"), 500, "internal"),
    (e.InvalidInputError("bad"), 400, "invalid_input"),
], ids=["invariant", "neo4j-server", "unmapped", "bad-input"])
def test_the_api_answers_internal_errors_as_5xx_and_bad_input_as_4xx(exc: e.SliceschedError, status: int,
                                                                      kind: str) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from service.api.app import install_error_handlers

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise exc

    answer = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert answer.status_code == status
    assert answer.json()["error"]["kind"] == kind
