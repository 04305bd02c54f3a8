"""What ad-hoc inspection Cypher may do beyond reading the graph: almost nothing.

A read transaction makes the server refuse writes, but a read transaction still runs
``LOAD CSV`` (files and URLs), procedures (``db.clearQueryCaches``, ``dbms.listConfig``) and
administration commands (``SHOW TRANSACTIONS`` shows other sessions' queries, ``TERMINATE
TRANSACTIONS`` kills the service's own writes). Two checks refuse them, each on its own enough
for the cases known today; together they fail closed:

1. :func:`check_text`, before anything reaches the server: a tokenizer that knows comments,
   string literals, backtick identifiers and parameters (so ``'LOAD CSV'`` in a ``WHERE`` is a
   string, and ``LOAD/**/CSV`` or a keyword after a ``//`` comment's line break is still code),
   then keyword rules on the tokens. Where a token's role is unclear it is refused.
2. :func:`check_plan`, on the server's own ``EXPLAIN`` of the query: operators ``LoadCSV``,
   ``ProcedureCall`` of a procedure outside the allow-list, ``Show*`` other than indexes and
   constraints, ``Terminate*``, and anything planned on another database (administration
   commands run on ``system``) are refused.

Allowed: ``CALL { ... }`` subqueries, the read-only schema procedures in
:data:`ALLOWED_PROCEDURES`, ``SHOW INDEXES`` and ``SHOW CONSTRAINTS`` (schema metadata of this
database, no data and nothing about other sessions), and an ``EXPLAIN``/``PROFILE`` prefix.
Refused as well: ``USE`` (another database, e.g. ``system``) and ``CYPHER`` query options.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from service.domain.error import ReadOnlyViolationError

ALLOWED_PROCEDURES = frozenset({
    "db.labels", "db.relationshipTypes", "db.propertyKeys",
    "db.schema.visualization", "db.schema.nodeTypeProperties", "db.schema.relTypeProperties",
})
ALLOWED_SHOW_OPERATORS = frozenset({"ShowIndexes", "ShowConstraints"})
_SHOW_TARGETS = frozenset({"INDEX", "INDEXES", "CONSTRAINT", "CONSTRAINTS"})
# Words between SHOW and INDEXES/CONSTRAINTS: "SHOW RANGE INDEXES", "SHOW NODE UNIQUE CONSTRAINTS".
_SHOW_QUALIFIERS = frozenset({"ALL", "RANGE", "TEXT", "POINT", "LOOKUP", "FULLTEXT", "VECTOR", "BTREE", "NODE",
                              "RELATIONSHIP", "REL", "UNIQUE", "UNIQUENESS", "KEY", "EXIST", "EXISTENCE", "EXISTS",
                              "PROPERTY", "PROP", "TYPE"})
# Statements that are administration or schema commands when they open a query.
_ADMIN_OPENERS = frozenset({"DROP", "ALTER", "GRANT", "DENY", "REVOKE", "START", "STOP", "RENAME", "ENABLE",
                            "DEALLOCATE", "REALLOCATE", "DRYRUN", "TERMINATE"})
_CREATE_ADMIN = frozenset({"USER", "ROLE", "DATABASE", "COMPOSITE", "ALIAS", "INDEX", "CONSTRAINT", "OR", "RANGE",
                           "TEXT", "POINT", "LOOKUP", "FULLTEXT", "VECTOR", "BTREE", "SERVER"})
_ALLOWED_HINT = ("inspection may read the graph, use CALL {...} subqueries, SHOW INDEXES, SHOW CONSTRAINTS and "
                 f"the procedures {', '.join(sorted(ALLOWED_PROCEDURES))}")

# One alternative per token kind, tried in order at each position. A line comment ends at any
# line break Neo4j might honour (ending it early only makes more text code, which fails closed).
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n\r\x0b\x0c\x85\u2028\u2029]*|/\*.*?\*/)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<param>\$(?:[^\W\d]\w*|\d+|`(?:[^`]|``)*`))
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<number>0[xX][0-9a-fA-F]+|0[oO][0-7]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<word>[^\W\d]\w*)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # word, quoted, string, param, number, other
    text: str
    start: int

    @property
    def upper(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def name(self) -> str | None:
        """The identifier this token spells (a word, or a backtick-quoted name unquoted)."""
        if self.kind == "word":
            return self.text
        if self.kind == "quoted":
            return self.text[1:-1].replace("``", "`")
        return None


def tokens(text: str) -> list[Token]:
    """The significant tokens of ``text`` (no spaces, no comments)."""
    out = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "other"
        if kind not in ("space", "comment"):
            out.append(Token(kind, m.group(), m.start()))
    return out


def refuse(what: str) -> ReadOnlyViolationError:
    return ReadOnlyViolationError(f"inspection refused: {what} ({_ALLOWED_HINT})")


def check_text(text: str) -> int:
    """Refuse (:class:`ReadOnlyViolationError`) a query that loads CSV, calls a procedure outside
    the allow-list, runs an administration command or switches database. Returns the offset of
    the statement after an ``EXPLAIN``/``PROFILE`` prefix (where a server-side ``EXPLAIN`` goes)."""
    toks = tokens(text)
    first = 0
    if toks and toks[0].upper in ("EXPLAIN", "PROFILE"):
        first = 1
    if first < len(toks) and toks[first].upper == "CYPHER":
        raise refuse("CYPHER query options")
    _check_opener(toks[first:])
    for i, tok in enumerate(toks):
        word = tok.upper
        if not word or _is_name_position(toks, i):
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        if word == "LOAD" and nxt is not None and nxt.upper == "CSV":
            raise refuse("LOAD CSV reads files and URLs")
        if word == "CALL" and nxt is not None:
            _check_call(toks, i)
        elif word == "USE" and nxt is not None and nxt.name is not None:
            raise refuse(f"USE {nxt.name}: inspection runs on the service's database only")
        elif word == "TERMINATE":
            raise refuse("TERMINATE is an administration command")
        elif word == "SHOW" and not (nxt is not None and nxt.text == ":"):
            _check_show(toks, i)
    return toks[first].start if first < len(toks) else len(text)


def _is_name_position(toks: list[Token], i: int) -> bool:
    """A property key (``n.call``), a label or type (``:Load``) or a parameter: never a keyword."""
    return i > 0 and toks[i - 1].text in (".", ":")


def _check_opener(toks: list[Token]) -> None:
    if not toks:
        return
    word = toks[0].upper
    if word in _ADMIN_OPENERS:
        raise refuse(f"{word} is an administration command")
    if word == "CREATE" and len(toks) > 1 and toks[1].upper in _CREATE_ADMIN:
        raise refuse(f"CREATE {toks[1].upper} is an administration or schema command")


def _check_call(toks: list[Token], i: int) -> None:
    """``CALL {`` and ``CALL (vars) {`` are subqueries; ``CALL name.space(...)`` is a procedure."""
    nxt = toks[i + 1]
    if nxt.text in ("{", "("):
        return
    if nxt.name is None:
        return  # a variable named call ("RETURN call, x"): no procedure follows
    parts = [nxt.name]
    j = i + 2
    while j + 1 < len(toks) and toks[j].text == "." and toks[j + 1].name is not None:
        parts.append(toks[j + 1].name or "")
        j += 2
    name = ".".join(parts)
    if name not in ALLOWED_PROCEDURES:
        raise refuse(f"procedure {name}")


def _check_show(toks: list[Token], i: int) -> None:
    j = i + 1
    while j < len(toks) and toks[j].upper in _SHOW_QUALIFIERS:
        j += 1
    if j < len(toks) and toks[j].upper in _SHOW_TARGETS:
        return
    shown = " ".join(t.text.upper() for t in toks[i + 1: j + 1]) or "(nothing)"
    raise refuse(f"SHOW {shown} is an administration command")


# ---- the server's plan -------------------------------------------------------------------------
def operators(plan: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """``(operator, database, details)`` of every operator in an ``EXPLAIN`` plan, root first."""
    op, _, database = str(plan.get("operatorType", "")).partition("@")
    args = plan.get("args") or plan.get("arguments") or {}
    yield op, database, str(args.get("Details", ""))
    for child in plan.get("children") or ():
        yield from operators(child)


def check_plan(plan: Mapping[str, Any] | None, database: str) -> None:
    """Refuse a plan that loads CSV, calls a procedure outside the allow-list, runs an
    administration command (``Show*`` but indexes and constraints, ``Terminate*``, anything on
    another database such as ``system``). No plan at all is refused too."""
    if not plan:
        raise refuse("the server returned no plan to check")
    for op, db, details in operators(plan):
        if db and db != database:
            raise refuse(f"{op} runs on the {db} database (an administration command)")
        if op == "LoadCSV":
            raise refuse("LOAD CSV reads files and URLs")
        if op.startswith("ProcedureCall"):
            name = details.partition("(")[0].strip()
            if name not in ALLOWED_PROCEDURES:
                raise refuse(f"procedure {name or '(unnamed)'}")
        if (op.startswith("Show") and op not in ALLOWED_SHOW_OPERATORS) or op.startswith("Terminate") \
                or "Administration" in op:
            raise refuse(f"{op} is an administration command")
