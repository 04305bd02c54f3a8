"""Domain errors: the project's one hierarchy, and its one mapping to HTTP answers and exit codes.

Each class declares, as class attributes, what the API answers for it (``http_status``, ``kind``)
and what the CLI exits with (``exit_code``); a subclass inherits its parent's unless it says
otherwise. The table, as the API (service/api/app.py) and the CLI (service/cli/main.py) read it:

=========================  ===========  ===============  ====
class                      HTTP status  kind             exit
=========================  ===========  ===============  ====
SliceschedError (other)    500 [1]      internal         1
InvalidInputError [3]      400          invalid_input    2
CatalogError               400          invalid_input    2
NotFoundError              404          not_found        2
ReadOnlyViolationError     403          read_only        2
UnauthorizedError          401          unauthorized     2
ForbiddenError             403          forbidden        2
PayloadTooLargeError       413          too_large        2
ConflictError              409          conflict         2
QueueFullError             429          overloaded       3
QuotaExceededError [4]     429          quota_exceeded   3
InspectionBusyError [4]    429          overloaded       3
NotServedError             409          not_served       3
InvariantError             500          internal         1
DatabaseUnavailableError   503          unavailable      3
Neo4jServerError           503          unavailable      3
NotLeaderError [4]         503          not_leader       3
ExecutorError [2]          --           --               1
RegisterRefused [2]        --           --               2
=========================  ===========  ===============  ====

Exit codes: 1 an internal or otherwise unexpected failure, 2 a bad input (the caller can fix the
call), 3 Neo4j cannot be reached or started; 130 (interrupted) is the CLI's own.
[1] ``http_status`` None: the API has no answer of its own for it; it logs it with its traceback
as unmapped and answers 500 ``internal``: a failure the caller cannot fix is never a 4xx. [2] Raised by the executor daemon, a client of
the API, never by the service. [3] And its subclasses InvalidGraphError and InvalidClusterError.
[4] The answer carries ``Retry-After`` (whole seconds) from ``retry_after_s``.
"""

from __future__ import annotations

from typing import ClassVar

EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


class SliceschedError(Exception):
    """Base of every error this project raises on purpose (bad input, bad state)."""

    #: The API's answer: a 4xx/5xx status; None: unmapped (logged, then 400 ``invalid_input``).
    http_status: ClassVar[int | None] = None
    #: ``error.kind`` in the API's JSON answer.
    kind: ClassVar[str] = "invalid_input"
    #: The CLI's exit code for it.
    exit_code: ClassVar[int] = EXIT_INTERNAL


class InvalidInputError(SliceschedError):
    """Input that can never be accepted as given: the message says which item and why."""

    http_status = 400
    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, culprit: str | None = None) -> None:
        super().__init__(message)
        self.culprit = culprit


class InvalidGraphError(InvalidInputError):
    """An operator graph that is not a well-formed DAG of positive-sized tensors."""


class InvalidClusterError(InvalidInputError):
    """A cluster spec with unknown kinds, duplicate ids, bad sizes or dangling links."""


class InvariantError(SliceschedError):
    """The program broke one of its own invariants (a bug, not bad input): the message says which."""

    http_status = 500
    kind = "internal"


class NotFoundError(SliceschedError):
    """A named object (model, query, device, ...) that does not exist."""

    http_status = 404
    kind = "not_found"
    exit_code = EXIT_BAD_INPUT


class CatalogError(SliceschedError):
    """The Cypher query catalog is inconsistent: a missing query or an undeclared parameter."""

    http_status = 400
    exit_code = EXIT_BAD_INPUT


class ReadOnlyViolationError(SliceschedError):
    """A write was attempted through a read-only inspection path."""

    http_status = 403
    kind = "read_only"
    exit_code = EXIT_BAD_INPUT


class UnauthorizedError(SliceschedError):
    """No key, or a key nobody holds."""

    http_status = 401
    kind = "unauthorized"
    exit_code = EXIT_BAD_INPUT


class ForbiddenError(SliceschedError):
    """The key is valid but its role may not do this."""

    http_status = 403
    kind = "forbidden"
    exit_code = EXIT_BAD_INPUT


class PayloadTooLargeError(SliceschedError):
    """A request body larger than its route takes: refused before it was read (the API's 413)."""

    http_status = 413
    kind = "too_large"
    exit_code = EXIT_BAD_INPUT


class ConflictError(SliceschedError):
    """The operation contradicts the current state (an expired lease, a finished request)."""

    http_status = 409
    kind = "conflict"
    exit_code = EXIT_BAD_INPUT


class QueueFullError(SliceschedError):
    """A model's queue holds as many requests as it may: nothing was accepted; retry later."""

    http_status = 429
    kind = "overloaded"
    exit_code = EXIT_UNAVAILABLE


class QuotaExceededError(SliceschedError):
    """Work beyond a tenant's or project's quota: nothing was accepted; ``retry_after_s`` says
    when the same work would fit (the API's ``Retry-After``)."""

    http_status = 429
    kind = "quota_exceeded"
    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InspectionBusyError(SliceschedError):
    """As many inspection queries run as may at once (their worker threads and Neo4j connections
    are the lease path's too): nothing ran; ``retry_after_s`` says when to ask again."""

    http_status = 429
    kind = "overloaded"
    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotServedError(SliceschedError):
    """No executor serves the model now (no replica of it: it is not live), so a caller waiting
    for the answer would wait until one does. Nothing was accepted; retry later."""

    http_status = 409
    kind = "not_served"
    exit_code = EXIT_UNAVAILABLE


class DatabaseUnavailableError(SliceschedError):
    """Neo4j cannot be reached now; nothing was changed. Retry after ``retry_after_s``."""

    http_status = 503
    kind = "unavailable"
    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Neo4jServerError(SliceschedError):
    """The managed Neo4j server could not be installed, started or reached."""

    http_status = 503
    kind = "unavailable"
    exit_code = EXIT_UNAVAILABLE


class NotLeaderError(SliceschedError):
    """This service process does not lead (leader election on): it is the standby, or its term
    ended and another process took over, so it changes nothing (a deposed leader's write is
    refused by the fencing token, :mod:`service.live.leader`). Nothing was changed; retry after
    ``retry_after_s``, at the service's address, which the leader answers."""

    http_status = 503
    kind = "not_leader"
    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# ---- the executor daemon's errors (it is a client of the API) --------------------------------------
class ExecutorError(SliceschedError):
    """Base of the executor daemon's errors about its calls to the service."""


class TransientError(ExecutorError):
    """A call that may succeed later: no connection, a timeout, a 5xx or an unreadable answer."""


class ApiError(ExecutorError):
    """A 4xx answer: the service refused the call as made."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class RegisterRefused(ExecutorError):
    """The service refused the registration (4xx): retrying cannot help."""

    exit_code = EXIT_BAD_INPUT
