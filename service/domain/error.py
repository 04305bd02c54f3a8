"""Domain errors. Each names its culprit; the CLI and the API map them to messages once."""

from __future__ import annotations


class SliceschedError(Exception):
    """Base of every error this project raises on purpose (bad input, bad state)."""


class InvalidInputError(SliceschedError):
    """Input that can never be accepted as given: the message says which item and why."""

    def __init__(self, message: str, *, culprit: str | None = None) -> None:
        super().__init__(message)
        self.culprit = culprit


class InvalidGraphError(InvalidInputError):
    """An operator graph that is not a well-formed DAG of positive-sized tensors."""


class InvalidClusterError(InvalidInputError):
    """A cluster spec with unknown kinds, duplicate ids, bad sizes or dangling links."""


class InvariantError(SliceschedError):
    """The program broke one of its own invariants (a bug, not bad input): the message says which."""


class NotFoundError(SliceschedError):
    """A named object (model, query, device, ...) that does not exist."""


class CatalogError(SliceschedError):
    """The Cypher query catalog is inconsistent: a missing query or an undeclared parameter."""


class ReadOnlyViolationError(SliceschedError):
    """A write was attempted through a read-only inspection path."""


class DatabaseUnavailableError(SliceschedError):
    """Neo4j cannot be reached now; nothing was changed. Retry after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
