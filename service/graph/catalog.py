"""The Cypher query catalog: one query per ``.cypher`` file under ``cypher/``, loaded by name.

A file starts with a comment header; ``// @param NAME: meaning`` lines declare its parameters::

    // Upsert the devices of one cluster.
    // @param rows: [{device_id, host_id, kind, mem_bytes, peak_flops, mem_bw_bytes_per_s}]
    UNWIND $rows AS row
    MERGE (d:Device {device_id: row.device_id}) SET d += row

A parameter declared ``// @param NAME?: meaning`` is optional: a caller may leave it out, and it
reaches the server as null (a query reads null as "no such filter").

Loading fails on a parameter used but not declared (or declared but unused), on two files with
one name, and, through :meth:`QueryCatalog.require`, on a query that code needs but the catalog
lacks. Running a query checks the supplied parameters against the declaration before anything
reaches the server. Files under ``schema/`` may hold several statements separated by ``;``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from typing import Any

from service.domain.error import CatalogError, NotFoundError

_PARAM_DECL = re.compile(r"^//\s*@param\s+([A-Za-z_]\w*)(\?)?\s*:?(.*)$")
_PARAM_USE = re.compile(r"\$([A-Za-z_]\w*)")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_COMMENT = re.compile(r"//[^\n]*")


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    category: str  # schema, write, read, inspect, cleanup
    text: str
    params: tuple[str, ...]
    description: str
    param_help: Mapping[str, str]
    optional: frozenset[str] = frozenset()  # declared ``NAME?``: may be left out (then null)

    @property
    def statements(self) -> list[str]:
        body = _COMMENT.sub("", self.text)
        return [s.strip() for s in body.split(";") if s.strip()]

    def check_params(self, supplied: Mapping[str, Any]) -> None:
        missing = [p for p in self.params if p not in supplied and p not in self.optional]
        extra = [p for p in supplied if p not in self.params]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if extra:
                parts.append(f"undeclared {extra}")
            raise CatalogError(f"query {self.name!r}: parameters {' and '.join(parts)} (declared: {list(self.params)})")

    def bind(self, supplied: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters to send: checked (:meth:`check_params`), an optional one left out as null."""
        self.check_params(supplied)
        return {**{p: None for p in self.optional}, **supplied}


def parse_query(name: str, category: str, text: str) -> Query:
    declared: dict[str, str] = {}
    optional: set[str] = set()
    description: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("//"):
            if stripped:
                break
            continue
        m = _PARAM_DECL.match(stripped)
        if m:
            if m.group(1) in declared:
                raise CatalogError(f"query {name!r}: parameter ${m.group(1)} declared twice")
            declared[m.group(1)] = m.group(3).strip()
            if m.group(2):
                optional.add(m.group(1))
        else:
            description.append(stripped.lstrip("/ ").rstrip())
    body = _STRING.sub("''", _COMMENT.sub("", text))
    used = set(_PARAM_USE.findall(body))
    if not body.strip():
        raise CatalogError(f"query {name!r} has no Cypher body")
    undeclared = sorted(used - set(declared))
    if undeclared:
        raise CatalogError(f"query {name!r} uses undeclared parameters {['$' + u for u in undeclared]}; "
                           f"add '// @param NAME: ...' lines to its header")
    unused = sorted(set(declared) - used)
    if unused:
        raise CatalogError(f"query {name!r} declares parameters it never uses: {unused}")
    return Query(name, category, text, tuple(declared), " ".join(d for d in description if d), declared,
                 frozenset(optional))


class QueryCatalog:
    def __init__(self, queries: Iterable[Query]) -> None:
        self._queries: dict[str, Query] = {}
        for q in queries:
            if q.name in self._queries:
                raise CatalogError(f"two queries are named {q.name!r} ({self._queries[q.name].category}/ and {q.category}/)")
            self._queries[q.name] = q

    @classmethod
    def load(cls, root: Traversable | None = None) -> QueryCatalog:
        """Load every ``.cypher`` file below ``root`` (default: the installed ``cypher`` package)."""
        root = root or resources.files("cypher")
        return cls(cls._walk(root, ""))

    @classmethod
    def _walk(cls, folder: Traversable, category: str) -> Iterable[Query]:
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                yield from cls._walk(entry, category if category else entry.name)
            elif entry.name.endswith(".cypher"):
                yield parse_query(entry.name.removesuffix(".cypher"), category or "root", entry.read_text())

    def get(self, name: str) -> Query:
        try:
            return self._queries[name]
        except KeyError:
            raise NotFoundError(f"no query named {name!r} in the catalog") from None

    def require(self, names: Iterable[str]) -> None:
        missing = sorted(n for n in names if n not in self._queries)
        if missing:
            raise CatalogError(f"the query catalog lacks {missing}: add cypher/<category>/<name>.cypher")

    def by_category(self, category: str) -> list[Query]:
        return [q for q in self._queries.values() if q.category == category]

    def __contains__(self, name: object) -> bool:
        return name in self._queries

    def __len__(self) -> int:
        return len(self._queries)
