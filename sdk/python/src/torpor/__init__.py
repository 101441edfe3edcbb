"""torpor: the Python client of torpor's HTTP API.

Sandboxes that suspend and resume, every transition an event::

    import torpor

    c = torpor.Client("http://127.0.0.1:8080", token="torpor_…")
    v = c.create(driver="sim")
    c.wait(v.id, torpor.Phase.READY, timeout=30)
    c.suspend(v.id)

Standard library only; see README.md.
"""

from __future__ import annotations

from ._client import ATTEMPTS, Client, new_key
from ._errors import (
    ERRORS,
    Aborted,
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    TorporError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    error_for,
)
from ._model import (
    Capabilities,
    Driver,
    Event,
    Forward,
    IdlePolicy,
    NewToken,
    Page,
    Phase,
    ReplayProgress,
    Restore,
    Scope,
    ServerInfo,
    TokenInfo,
    View,
    WhoAmI,
    parse_phase,
)
from ._uuid import uuid7
from ._watch import Watch, parse_events

__version__ = "0.1.0"

__all__ = [
    "ATTEMPTS",
    "Aborted",
    "AlreadyExists",
    "Capabilities",
    "Client",
    "DeadlineExceeded",
    "Driver",
    "ERRORS",
    "Event",
    "FailedPrecondition",
    "Forward",
    "IdlePolicy",
    "Internal",
    "InvalidArgument",
    "NewToken",
    "NotFound",
    "Page",
    "PermissionDenied",
    "Phase",
    "ReplayProgress",
    "ResourceExhausted",
    "Restore",
    "Scope",
    "ServerInfo",
    "TokenInfo",
    "TorporError",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "View",
    "Watch",
    "WhoAmI",
    "error_for",
    "new_key",
    "parse_events",
    "parse_phase",
    "uuid7",
]
