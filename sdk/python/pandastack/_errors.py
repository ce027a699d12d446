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


class SandboxFailed(SandboxStopped):
    """The sandbox failed (its VM died: ``vm_exited``, or it could not start): it is gone."""


class VolumeNotFound(NotFound):
    """No such volume for this key's tenant (or it was deleted)."""


class VolumeInUse(Conflict):
    """The volume is attached read-write elsewhere (or read-only elsewhere, for a read-write
    attach): a volume is read-write in one sandbox at a time, read-only in any number."""


class VolumeAttached(Conflict):
    """A running or hibernated sandbox holds the volume: kill it first (delete, grow)."""


class DatabaseNotFound(NotFound):
    """No such database for this key's tenant (or it was deleted)."""


class BackupNotFound(NotFound):
    """No such backup of this key's tenant's databases (deleted, or its database was)."""


class DatabaseHibernated(Conflict):
    """The database is hibernated: wake it first."""


class DatabaseFailed(Conflict):
    """The database's sandbox was stopped or failed (its data volume is kept until a delete)."""


class ManagedByDatabase(Conflict):
    """The sandbox runs a managed database: manage it through the database."""


class ExceedsTemplate(InvalidArgument):
    """A create asked for more memory or vCPUs than its template was baked with."""


class InvalidCwd(InvalidArgument):
    """The command's working folder does not exist in the sandbox."""


class CommandNotFound(InvalidArgument):
    """The program (argv[0]) does not exist or cannot be executed in the sandbox."""


class IsADirectory(Conflict):
    """A file operation named a folder."""


class NotADirectory(Conflict):
    """A folder operation named a file (or a path goes through one)."""


class FileExists(Conflict):
    """The path exists already."""


class DirectoryNotEmpty(Conflict):
    """The folder is not empty (remove it with recursive=True)."""


class PermissionDenied(Forbidden):
    """The guest refused access to the path."""


class NoSpace(PandaStackError):
    """The sandbox's disk is full (HTTP 507)."""


class GuestIOError(PandaStackError):
    """The guest's file system refused the operation (EIO: e.g. writing /proc files)."""


class TransitionFailed(PandaStackError):
    """A snapshot, fork, hibernation or wake failed (its reason is in the message)."""


class StartFailed(PandaStackError):
    """The sandbox could not be started."""


class ExecFailed(PandaStackError):
    """The guest could not start the command (e.g. out of processes): try again (HTTP 503)."""


class PayloadTooLarge(PandaStackError):
    """A body, file or command is larger than the API's limit."""


class RateLimited(PandaStackError):
    """Too many commands in the sandbox, or the server is busy."""


class QuotaExceeded(PandaStackError):
    """A tenant quota would be exceeded (HTTP 429, not retried): the message names it."""


class HostFull(PandaStackError):
    """The host has no headroom for more guest memory now (HTTP 503, retried after Retry-After)."""


class Timeout(PandaStackError):
    """A deadline passed."""


class NotImplementedByServer(PandaStackError):
    """The server does not implement this yet (HTTP 501)."""


class TemplateInUse(Conflict):
    """Sandboxes of the template have not ended: it cannot be deleted yet."""


class TemplateBuildFailed(PandaStackError):
    """A template build ended in failure; ``log_tail`` has the end of its log."""

    code = "template_build_failed"

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message, code=self.code, status=0)
        self.log_tail = log_tail


class ConnectionFailed(PandaStackError):
    """The daemon could not be reached."""

    code = "connection_error"


_BY_CODE: Dict[str, Type[PandaStackError]] = {
    "invalid_json": InvalidArgument,
    "invalid_argument": InvalidArgument,
    "invalid_path": InvalidArgument,
    "exceeds_template": ExceedsTemplate,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "sandbox_not_found": SandboxNotFound,
    "file_not_found": FileNotFound,
    "template_not_found": TemplateNotFound,
    "snapshot_not_found": SnapshotNotFound,
    "volume_not_found": VolumeNotFound,
    "volume_in_use": VolumeInUse,
    "volume_attached": VolumeAttached,
    "template_in_use": TemplateInUse,
    "database_not_found": DatabaseNotFound,
    "backup_not_found": BackupNotFound,
    "database_hibernated": DatabaseHibernated,
    "database_failed": DatabaseFailed,
    "managed_by_database": ManagedByDatabase,
    "sandbox_hibernated": SandboxHibernated,
    "sandbox_stopped": SandboxStopped,
    "sandbox_failed": SandboxFailed,
    "invalid_cwd": InvalidCwd,
    "command_not_found": CommandNotFound,
    "is_a_directory": IsADirectory,
    "not_a_directory": NotADirectory,
    "file_exists": FileExists,
    "directory_not_empty": DirectoryNotEmpty,
    "permission_denied": PermissionDenied,
    "no_space": NoSpace,
    "io_error": GuestIOError,
    "snapshot_failed": TransitionFailed,
    "fork_failed": TransitionFailed,
    "backup_failed": TransitionFailed,
    "restore_failed": TransitionFailed,
    "hibernate_failed": TransitionFailed,
    "wake_failed": TransitionFailed,
    "start_failed": StartFailed,
    "exec_failed": ExecFailed,
    "cancelled": Conflict,
    "sandbox_busy": SandboxBusy,
    "body_too_large": PayloadTooLarge,
    "file_too_large": PayloadTooLarge,
    "backup_too_large": PayloadTooLarge,
    "too_many_execs": RateLimited,
    "too_many_requests": RateLimited,
    "too_many_processes": RateLimited,
    "too_many_ports": RateLimited,
    "quota_exceeded": QuotaExceeded,
    "host_full": HostFull,
    "client_too_slow": Conflict,
    "request_timeout": Timeout,
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
