"""Named YAML/JSON documents: a built-in shipped with the package, or a user's file.

Cluster specs and tenant mixes are both loaded this way; a bad name or a parse error becomes the
caller's error class with a message that says what was looked for.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from service.domain.error import InvalidInputError


def builtin_documents(package: str, folder: str) -> list[str]:
    root = resources.files(package) / folder
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_document(name_or_path: str, *, package: str, folder: str, what: str,
                  error: type[InvalidInputError] = InvalidInputError) -> tuple[Any, str]:
    """``(parsed document, source)`` for a built-in name or a ``.yaml``/``.yml``/``.json`` path."""
    builtins = builtin_documents(package, folder)
    if name_or_path in builtins:
        text = (resources.files(package) / folder / f"{name_or_path}.yaml").read_text()
        source = name_or_path
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise error(f"no {what} {name_or_path!r}: not a file and not a built-in ({', '.join(builtins)})")
        text, source = path.read_text(), str(path)
    try:
        return (json.loads(text) if source.endswith(".json") else yaml.safe_load(text)), source
    except json.JSONDecodeError as exc:
        raise error(f"{source}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}", culprit=source) from None
    except yaml.YAMLError as exc:
        raise error(f"{source}:{_yaml_problem(exc)}", culprit=source) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's multi-line message as ``line:column: not valid YAML: problem (context)`` on one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"{mark.line + 1}:{mark.column + 1}:"
        problem = exc.problem or "invalid"
        if exc.context:
            context = exc.context
            if exc.context_mark is not None:
                context += f" started at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
            problem += f" ({context})"
    elif isinstance(exc, yaml.reader.ReaderError):
        char = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        where, problem = f" character {exc.position}:", f"{exc.reason} ({char})"
    else:
        where, problem = "", str(exc)
    return f"{where} not valid YAML: {' '.join(problem.split())}"
