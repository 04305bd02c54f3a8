"""The text check of inspection Cypher: comments, strings and case cannot hide a refused clause,
and strings or names that merely spell one are not refused."""

from __future__ import annotations

import pytest

from service.domain.error import ReadOnlyViolationError
from service.graph.guard import check_plan, check_text, tokens

REFUSED = {
    "LOAD CSV FROM 'http://127.0.0.1:9/x' AS row RETURN row": "LOAD CSV",
    "load csv with headers from 'file:///etc/passwd' as r return r": "LOAD CSV",
    "LOAD/**/CSV FROM 'http://x' AS r RETURN r": "LOAD CSV",
    "MATCH (n) WITH n LIMIT 1 LOAD CSV FROM 'http://x' AS r RETURN r": "LOAD CSV",
    "TERMINATE TRANSACTIONS 'neo4j-transaction-1'": "TERMINATE",
    "/* hi */ terminate transactions 'x'": "TERMINATE",
    "SHOW TRANSACTIONS": "SHOW TRANSACTIONS",
    "show transactions yield transactionId as t terminate transactions t": "SHOW TRANSACTIONS",
    "SHOW SETTINGS": "SHOW SETTINGS",
    "SHOW USERS": "SHOW USERS",
    "SHOW PROCEDURES": "SHOW PROCEDURES",
    "CALL db.clearQueryCaches()": "db.clearQueryCaches",
    "CALL dbms.listConfig()": "dbms.listConfig",
    "cAlL dbms.listConfig() YIELD name RETURN name": "dbms.listConfig",
    "CALL DB.LABELS()": "DB.LABELS",  # names are compared exactly: another spelling is not on the list
    "CALL `dbms`.`listConfig`()": "dbms.listConfig",
    "CALL `dbms.listConfig`()": "dbms.listConfig",
    "CALL\tdbms . listConfig ( )": "dbms.listConfig",
    "MATCH (n) // comment\nCALL dbms.listConfig() YIELD name RETURN name": "dbms.listConfig",
    "MATCH (n) // a comment ends at a carriage return too\rCALL db.clearQueryCaches()": "db.clearQueryCaches",
    "RETURN '//' AS s UNION CALL dbms.listConfig() YIELD name RETURN name AS s": "dbms.listConfig",
    "RETURN '\\'' AS s UNION CALL dbms.listConfig() YIELD name RETURN name AS s": "dbms.listConfig",
    "RETURN 1 AS x /* a */ UNION /* b */ CALL dbms.components() YIELD name RETURN name AS x": "dbms.components",
    "MATCH (n) CALL { CALL db.clearQueryCaches() YIELD value RETURN value } RETURN value": "db.clearQueryCaches",
    "CREATE USER x SET PASSWORD 'password1'": "CREATE USER",
    "create database other": "CREATE DATABASE",
    "CREATE INDEX i FOR (n:X) ON (n.p)": "CREATE INDEX",
    "DROP CONSTRAINT tenant_id": "DROP",
    "GRANT ROLE admin TO x": "GRANT",
    "ALTER USER neo4j SET PASSWORD 'x'": "ALTER",
    "START DATABASE neo4j": "START",
    "STOP DATABASE neo4j": "STOP",
    "EXPLAIN SHOW TRANSACTIONS": "SHOW TRANSACTIONS",
    "USE system SHOW USERS": "USE system",
    "USE `system` MATCH (n) RETURN n": "USE system",
    "CYPHER runtime=slotted MATCH (n) RETURN n": "CYPHER",
}

ALLOWED = [
    "MATCH (n) WHERE n.note = 'LOAD CSV FROM http://x' RETURN n",
    "MATCH (n) WHERE n.note CONTAINS \"CALL dbms.listConfig()\" RETURN n  // TERMINATE TRANSACTIONS",
    "MATCH (n) /* SHOW TRANSACTIONS */ RETURN count(n)",
    "MATCH (call:Call) RETURN call.load, call.show AS show_it",
    "MATCH (n:`LOAD CSV`) RETURN n",
    "MATCH (n) CALL { WITH n RETURN n.x AS x } RETURN x",
    "MATCH (n) CALL (n) { RETURN n.x AS x } RETURN x",
    "CALL db.labels()",
    "CALL db.labels() YIELD label RETURN label ORDER BY label",
    "CALL `db`.`labels`()",
    "call db.schema.visualization()",
    "SHOW INDEXES",
    "SHOW RANGE INDEXES YIELD name, state",
    "show constraints",
    "EXPLAIN MATCH (n) RETURN n",
    "PROFILE MATCH (n) RETURN n LIMIT 1",
    "MATCH (n) WHERE n.tenant_id = $tenant_id RETURN n",
    "MATCH (n) RETURN n.x + $`CALL` AS y",
]


@pytest.mark.parametrize("query", sorted(REFUSED))
def test_refused_text_names_what_was_refused(query: str) -> None:
    with pytest.raises(ReadOnlyViolationError, match="inspection refused") as err:
        check_text(query)
    assert REFUSED[query] in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("query", ALLOWED)
def test_allowed_text_passes(query: str) -> None:
    start = check_text(query)
    assert query[start:].split()[0].upper() not in ("EXPLAIN", "PROFILE")


def test_tokens_skip_comments_and_keep_strings_whole() -> None:
    toks = tokens("MATCH /* x */ (n) // y\nWHERE n.a = 'it''s' RETURN `a``b`")
    assert [t.text for t in toks][:3] == ["MATCH", "(", "n"]
    assert [t.kind for t in toks if t.kind in ("string", "quoted")] == ["string", "string", "quoted"]
    assert toks[-1].name == "a`b"


def plan(*ops: tuple[str, str]) -> dict:
    node: dict = {}
    for op, details in reversed(ops):
        node = {"operatorType": op, "args": {"Details": details}, "children": [node] if node else []}
    return node


@pytest.mark.parametrize("ops,what", [
    ((("ProduceResults@neo4j", "r"), ("LoadCSV@neo4j", "r")), "LOAD CSV"),
    ((("ProduceResults@neo4j", ""), ("ProcedureCall@neo4j", "dbms.listConfig() :: (name :: STRING)")),
     "dbms.listConfig"),
    ((("ProduceResults@neo4j", ""), ("ShowTransactions@neo4j", "")), "ShowTransactions"),
    ((("ProduceResults@neo4j", ""), ("TerminateTransactions@neo4j", "")), "TerminateTransactions"),
    ((("AdministrationCommand@system", ""),), "system database"),
])
def test_refused_plans(ops: tuple[tuple[str, str], ...], what: str) -> None:
    with pytest.raises(ReadOnlyViolationError, match=what):
        check_plan(plan(*ops), "neo4j")


def test_allowed_plans() -> None:
    check_plan(plan(("ProduceResults@neo4j", ""), ("ProcedureCall@neo4j", "db.labels() :: (label :: STRING)")), "neo4j")
    check_plan(plan(("ProduceResults@neo4j", ""), ("ShowIndexes@neo4j", "allIndexes")), "neo4j")
    with pytest.raises(ReadOnlyViolationError):
        check_plan(None, "neo4j")
