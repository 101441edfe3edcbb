"""Phases and the views the server answers (CONTRACT §1, §3, §5, §6).

Every view keeps the object it was read from in ``raw``: a field a newer
server adds is there, never an error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Phase",
    "parse_phase",
    "Scope",
    "Restore",
    "Forward",
    "View",
    "Page",
    "Event",
    "Capabilities",
    "Driver",
    "ServerInfo",
    "TokenInfo",
    "NewToken",
    "WhoAmI",
    "ReplayProgress",
]


class Phase(enum.StrEnum):
    """The phases this SDK knows (CONTRACT §1). The set is open: a server
    newer than this SDK may answer another, which comes back as a plain str
    (treat it as "other"); a Phase compares equal to its string."""

    PROVISIONING = "provisioning"
    READY = "ready"
    STOPPING = "stopping"
    STOPPED = "stopped"
    STARTING = "starting"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    DELETING = "deleting"
    DELETED = "deleted"
    ERROR = "error"


_PHASES: dict[str, Phase] = {p.value: p for p in Phase}


def parse_phase(s: str) -> Phase | str:
    """The Phase named s, or s itself when this SDK does not know it."""
    return _PHASES.get(s, s)


class Scope(enum.StrEnum):
    """The scopes a token may hold: admin holds every scope."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


def _obj(d: Any) -> dict[str, Any]:
    return d if isinstance(d, dict) else {}


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _opt_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@dataclass
class Restore:
    """What a sandbox holds to resume from: held (a retained state is kept),
    consumed (the last one was used by a restore), bytes (its size, where
    the driver says)."""

    held: bool = False
    consumed: bool = False
    bytes: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: RFC 3339: when the held state's retention ends; "" when kept for ever.
    expires_at: str = ""
    #: The reference of the state held (the suspension's restore_ref); "" when none.
    restore_ref: str = ""
    #: The held state was exported ahead: a resume on another node only fetches it.
    movable: bool = False
    #: The size of the exported state, in bytes, once movable.
    movable_bytes: int = 0

    @classmethod
    def from_json(cls, d: Any) -> Restore:
        d = _obj(d)
        return cls(held=d.get("held") is True, consumed=d.get("consumed") is True, bytes=_int(d.get("bytes")), raw=d,
                   expires_at=_str(d.get("expires_at")), restore_ref=_str(d.get("restore_ref")),
                   movable=d.get("movable") is True, movable_bytes=_int(d.get("movable_bytes")))


@dataclass
class IdlePolicy:
    """An idle policy (README "Idle and wake"): once ready with no activity
    for after (a Go duration, "15m", longer than the server's activity
    window), the sandbox is suspended, or stopped (action "stop"; fallback
    "stop" for a driver that cannot suspend, "none" leaves it running)."""

    after: str
    action: str = ""
    fallback: str = ""

    @classmethod
    def from_json(cls, d: Any) -> IdlePolicy | None:
        d = _obj(d)
        if not _str(d.get("after")):
            return None
        return cls(after=_str(d.get("after")), action=_str(d.get("action")), fallback=_str(d.get("fallback")))

    def to_json(self) -> dict[str, str]:
        out = {"after": self.after}
        if self.action:
            out["action"] = self.action
        if self.fallback:
            out["fallback"] = self.fallback
        return out


@dataclass
class Forward:
    """An open TCP forward: from address on torpor's host to port of the
    sandbox (listen is what was asked, address what was bound)."""

    id: str = ""
    listen: str = ""
    address: str = ""
    port: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> Forward:
        d = _obj(d)
        return cls(id=_str(d.get("id")), listen=_str(d.get("listen")), address=_str(d.get("address")), port=_int(d.get("port")), raw=d)


@dataclass
class View:
    """The phase view of one sandbox (CONTRACT §6): what get, list, wait and
    watch answer, and every command with the view as it left it."""

    id: str = ""
    name: str = ""
    phase: Phase | str = ""
    generation: int = 0
    driver: str = ""
    node: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    restore: Restore = field(default_factory=Restore)
    last_outcome: str = ""
    exit_code: int | None = None
    reason: str = ""
    updated_at: str = ""
    seq: int = 0
    forwards: list[Forward] = field(default_factory=list)
    #: Set in a command's answer only: the id of the command of the same
    #: verb already in flight that this one joined (it decides the outcome).
    joined: str = ""
    #: RFC 3339: the time of the sandbox's latest activity (a command's
    #: event, a touch, bytes through a forward); "" when there was none.
    last_active_at: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: The sandbox's expiry policies (RFC 3339, "delete" or "stop", a Go
    #: duration); "" when none.
    expires_at: str = ""
    on_expiry: str = ""
    retain_for: str = ""
    #: Create's wake_on_traffic: a connection to one of its forwards while
    #: it is suspended resumes it.
    wake_on_traffic: bool = False
    #: Its idle policy (create's idle, or the server's --idle-after); None
    #: when none.
    idle: IdlePolicy | None = None
    #: Create's ttl_pauses_while_suspended: time spent suspended moves
    #: expires_at later (expires_at is then the effective expiry);
    #: expiry_paused is set while suspended, expires_at then the value it
    #: had on entering suspended.
    ttl_pauses_while_suspended: bool = False
    expiry_paused: bool = False

    @classmethod
    def from_json(cls, d: Any) -> View:
        d = _obj(d)
        labels = {str(k): str(v) for k, v in _obj(d.get("labels")).items()}
        fwd = d.get("forwards")
        ec = d.get("exit_code")
        return cls(
            id=_str(d.get("id")),
            name=_str(d.get("name")),
            phase=parse_phase(_str(d.get("phase"))),
            generation=_int(d.get("generation")),
            driver=_str(d.get("driver")),
            node=_str(d.get("node")),
            labels=labels,
            restore=Restore.from_json(d.get("restore")),
            last_outcome=_str(d.get("last_outcome")),
            exit_code=ec if isinstance(ec, int) and not isinstance(ec, bool) else None,
            reason=_str(d.get("reason")),
            updated_at=_str(d.get("updated_at")),
            seq=_int(d.get("seq")),
            forwards=[Forward.from_json(f) for f in fwd] if isinstance(fwd, list) else [],
            joined=_str(d.get("joined")),
            last_active_at=_str(d.get("last_active_at")),
            raw=d,
            expires_at=_str(d.get("expires_at")),
            on_expiry=_str(d.get("on_expiry")),
            retain_for=_str(d.get("retain_for")),
            wake_on_traffic=d.get("wake_on_traffic") is True,
            idle=IdlePolicy.from_json(d.get("idle")),
            ttl_pauses_while_suspended=d.get("ttl_pauses_while_suspended") is True,
            expiry_paused=d.get("expiry_paused") is True,
        )


@dataclass
class Page:
    """One page of a list, in creation order; next is the opaque cursor of
    the following page ("" at the end); total is the count of sandboxes the
    filters match, where the server says (else None)."""

    items: list[View] = field(default_factory=list)
    next: str = ""
    total: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> Page:
        d = _obj(d)
        items = d.get("items")
        total = d.get("total")
        return cls(
            items=[View.from_json(v) for v in items] if isinstance(items, list) else [],
            next=_str(d.get("next")),
            total=total if isinstance(total, int) and not isinstance(total, bool) else None,
            raw=d,
        )


@dataclass
class Event:
    """One event of a sandbox's audit history (CONTRACT §3): its seq, type,
    time, actor, command, the phase after it and its data."""

    seq: int = 0
    type: str = ""
    time: str = ""
    actor: str = ""
    command_id: str = ""
    phase: Phase | str = ""
    data: Any = None
    id: str = ""
    correlation_id: str = ""
    causation_id: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> Event:
        d = _obj(d)
        return cls(
            seq=_int(d.get("seq")),
            type=_str(d.get("type")),
            time=_str(d.get("time")),
            actor=_str(d.get("actor")),
            command_id=_str(d.get("command_id")),
            phase=parse_phase(_str(d.get("phase"))),
            data=d.get("data"),
            id=_str(d.get("id")),
            correlation_id=_str(d.get("correlation_id")),
            causation_id=_str(d.get("causation_id")),
            raw=d,
        )


@dataclass
class Capabilities:
    """What a driver can do."""

    suspend: bool = False
    resume_on_another_node: bool = False
    retains: str = ""
    retained_size: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> Capabilities:
        d = _obj(d)
        return cls(
            suspend=d.get("suspend") is True,
            resume_on_another_node=d.get("resume_on_another_node") is True,
            retains=_str(d.get("retains")),
            retained_size=d.get("retained_size") is True,
            raw=d,
        )


@dataclass
class Driver:
    """One driver the server runs, with what it can do."""

    name: str = ""
    capabilities: Capabilities = field(default_factory=Capabilities)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> Driver:
        d = _obj(d)
        return cls(name=_str(d.get("name")), capabilities=Capabilities.from_json(d.get("capabilities")), raw=d)


@dataclass
class ServerInfo:
    """What a server says of itself (GET /v1/server): its node, the
    deadline of its transient phases, the view its reads come from."""

    node: str = ""
    deadline_seconds: float = 0.0
    read_from: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> ServerInfo:
        d = _obj(d)
        ds = d.get("deadline_seconds")
        return cls(
            node=_str(d.get("node")),
            deadline_seconds=float(ds) if isinstance(ds, (int, float)) and not isinstance(ds, bool) else 0.0,
            read_from=_str(d.get("read_from")),
            raw=d,
        )


@dataclass
class TokenInfo:
    """A token as the server tells of it: never its secret."""

    name: str = ""
    scopes: list[str] = field(default_factory=list)
    created_at: str = ""
    expires_at: str | None = None
    created_by: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> TokenInfo:
        d = _obj(d)
        sc = d.get("scopes")
        return cls(
            name=_str(d.get("name")),
            scopes=[str(s) for s in sc] if isinstance(sc, list) else [],
            created_at=_str(d.get("created_at")),
            expires_at=_opt_str(d.get("expires_at")),
            created_by=_str(d.get("created_by")),
            raw=d,
        )


@dataclass
class NewToken(TokenInfo):
    """A token just made, with its secret (token): shown this once."""

    token: str = field(default="", repr=False)

    @classmethod
    def from_json(cls, d: Any) -> NewToken:
        info = TokenInfo.from_json(d)
        return cls(
            name=info.name,
            scopes=info.scopes,
            created_at=info.created_at,
            expires_at=info.expires_at,
            created_by=info.created_by,
            raw=info.raw,
            token=_str(_obj(d).get("token")),
        )


@dataclass
class WhoAmI:
    """Whose token a request came with, and what it may do (GET
    /v1/whoami). A server without authentication (serve --no-auth) answers
    every scope and no name."""

    name: str = ""
    scopes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> WhoAmI:
        d = _obj(d)
        sc = d.get("scopes")
        return cls(name=_str(d.get("name")), scopes=[str(s) for s in sc] if isinstance(sc, list) else [], raw=d)


@dataclass
class ReplayProgress:
    """One line of a replay's progress (POST /v1/replay): phase is fold,
    write, catchup or swap, done of total; the last line's phase is
    "done", with seq (the log's seq the view was rebuilt to), target (where
    it is), events and elapsed_ms. A "failed" line is raised, never
    yielded."""

    view: str = ""
    phase: str = ""
    done: int = 0
    total: int = 0
    seq: int = 0
    target: str = ""
    events: int = 0
    elapsed_ms: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Any) -> ReplayProgress:
        d = _obj(d)
        return cls(
            view=_str(d.get("view")),
            phase=_str(d.get("phase")),
            done=_int(d.get("done")),
            total=_int(d.get("total")),
            seq=_int(d.get("seq")),
            target=_str(d.get("target")),
            events=_int(d.get("events")),
            elapsed_ms=_int(d.get("elapsed_ms")),
            raw=d,
        )
