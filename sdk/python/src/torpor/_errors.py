"""The contract's error codes (CONTRACT §2) as exception classes."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "TorporError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "FailedPrecondition",
    "Aborted",
    "ResourceExhausted",
    "AlreadyExists",
    "Unimplemented",
    "Unavailable",
    "DeadlineExceeded",
    "Internal",
    "ERRORS",
    "error_for",
]


class TorporError(Exception):
    """An error with a contract code: what the server answered, or what the
    SDK says on its behalf (status None: no answer came).

    A code this SDK does not know comes as a TorporError itself; every known
    code has its subclass (``except torpor.NotFound``).
    """

    code: str
    status: int | None
    message: str
    #: The view the answer carried beside its error (a torpor.View): a
    #: command sent with wait=True whose outcome was not in the view by its
    #: timeout (DeadlineExceeded) says where the sandbox is. None otherwise.
    view: Any = None

    def __init__(self, code: str, status: int | None, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.status = status
        self.message = message


class InvalidArgument(TorporError):
    """INVALID_ARGUMENT (400): the request is wrong, whatever the state."""


class Unauthenticated(TorporError):
    """UNAUTHENTICATED (401): no token, or one unknown, revoked or expired."""


class PermissionDenied(TorporError):
    """PERMISSION_DENIED (403): the token lacks the route's scope."""


class NotFound(TorporError):
    """NOT_FOUND (404): no such sandbox (or route, forward, token)."""


class FailedPrecondition(TorporError):
    """FAILED_PRECONDITION (409): the sandbox's phase does not allow it."""


class Aborted(TorporError):
    """ABORTED (409): a concurrent change; safe to retry (the SDK does)."""


class ResourceExhausted(TorporError):
    """RESOURCE_EXHAUSTED (429): past a rate or a limit."""


class AlreadyExists(TorporError):
    """ALREADY_EXISTS (409): a name in use."""


class Unimplemented(TorporError):
    """UNIMPLEMENTED (501): the driver lacks the capability."""


class Unavailable(TorporError):
    """UNAVAILABLE (503): the server cannot serve now, or did not answer."""


class DeadlineExceeded(TorporError):
    """DEADLINE_EXCEEDED (504): a wait (or a call) ran out of time."""


class Internal(TorporError):
    """INTERNAL (500)."""


#: The exception class of each contract code.
ERRORS: dict[str, type[TorporError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "UNAUTHENTICATED": Unauthenticated,
    "PERMISSION_DENIED": PermissionDenied,
    "NOT_FOUND": NotFound,
    "FAILED_PRECONDITION": FailedPrecondition,
    "ABORTED": Aborted,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "ALREADY_EXISTS": AlreadyExists,
    "UNIMPLEMENTED": Unimplemented,
    "UNAVAILABLE": Unavailable,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "INTERNAL": Internal,
}

# The code of an answer whose body carries none, by its status.
_STATUS_CODES: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_for(code: str, status: int | None, message: str) -> TorporError:
    """The exception of code: its class, or TorporError for a code unknown."""
    return ERRORS.get(code, TorporError)(code, status, message)


def answer_error(status: int, reason: str, data: bytes, what: str) -> TorporError:
    """The error of an answer with a status of 300 or more: the contract
    error of its body, else one of the status's code."""
    try:
        body = json.loads(data)
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and isinstance(err.get("code"), str) and err["code"]:
            e = error_for(err["code"], status, str(err.get("message", "")))
            if isinstance(body.get("view"), dict):
                e.view = body["view"]  # the client makes it a View
            return e
    except ValueError:
        pass
    code = _STATUS_CODES.get(status, "INTERNAL")
    return error_for(code, status, f"{what}: {status} {reason}".rstrip())


def retryable(err: TorporError) -> bool:
    """Whether a call that failed with err is worth sending again (under the
    same idempotency key): no answer, UNAVAILABLE or ABORTED."""
    return err.code in ("UNAVAILABLE", "ABORTED")
