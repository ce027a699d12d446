"""Typed errors: every API error code maps to an exception class carrying code, message, status."""
from __future__ import annotations

from typing import Dict, Optional, Type


class PandaStackError(Exception):
    """An error answered by the API (or a transport failure, code ``connection_error``)."""

    code: str = "error"

    def __init__(self, message: str, code: Optional[str] = None, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(PandaStackError):
    """The request was malformed (invalid_json, invalid_argument, invalid_path)."""


class Unauthorized(PandaStackError):
    """The API key is missing, unknown or revoked."""


class Forbidden(PandaStackError):
    """The key may not do this (admin routes)."""


class NotFound(PandaStackError):
    """Something named in the request does not exist."""


class SandboxNotFound(NotFound):
    """No such sandbox for this key's tenant."""


class FileNotFound(NotFound):
    """No such file or folder in the sandbox."""


class TemplateNotFound(NotFound):
    """No such template."""


class SnapshotNotFound(NotFound):
    """No such snapshot for this tenant."""


class Conflict(PandaStackError):
    """The sandbox is not in a state that allows this."""


class SandboxHibernated(Conflict):
    """The sandbox is hibernated: wake it first."""


class SandboxStopped(Conflict):
    """The sandbox was stopped (killed or reaped)."""


class SandboxBusy(Conflict):
    """A transition (snapshot, fork, hibernate, wake) is in progress: retry."""


class PayloadTooLarge(PandaStackError):
    """A body, file or command is larger than the API's limit."""


class RateLimited(PandaStackError):
    """Too many commands in the sandbox, or the server is busy."""


class Timeout(PandaStackError):
    """A deadline passed."""


class NotImplementedByServer(PandaStackError):
    """The server does not implement this yet (HTTP 501)."""


class ConnectionFailed(PandaStackError):
    """The daemon could not be reached."""

    code = "connection_error"


_BY_CODE: Dict[str, Type[PandaStackError]] = {
    "invalid_json": InvalidArgument,
    "invalid_argument": InvalidArgument,
    "invalid_path": InvalidArgument,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "sandbox_not_found": SandboxNotFound,
    "file_not_found": FileNotFound,
    "template_not_found": TemplateNotFound,
    "snapshot_not_found": SnapshotNotFound,
    "sandbox_hibernated": SandboxHibernated,
    "sandbox_stopped": SandboxStopped,
    "sandbox_failed": SandboxStopped,
    "sandbox_busy": SandboxBusy,
    "body_too_large": PayloadTooLarge,
    "file_too_large": PayloadTooLarge,
    "too_many_execs": RateLimited,
    "too_many_requests": RateLimited,
    "timeout": Timeout,
    "not_implemented": NotImplementedByServer,
}


def error_for(code: str, message: str, status: int) -> PandaStackError:
    """The exception for an API error code (unknown codes by status class)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = {404: NotFound, 409: Conflict, 413: PayloadTooLarge, 429: RateLimited}.get(
            status, PandaStackError)
    return cls(message, code=code, status=status)
