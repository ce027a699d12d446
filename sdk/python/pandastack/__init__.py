"""PandaStack Python SDK: hardware-isolated sandboxes for agents.

    from pandastack import Sandbox
    with Sandbox.create() as sbx:
        print(sbx.exec("python3 -c 'print(6*7)'").stdout)

Reads PANDASTACK_API_KEY and PANDASTACK_BASE_URL (default http://127.0.0.1:7070).
"""
from ._async import AsyncSandbox
from ._errors import (BackupNotFound, CommandNotFound, Conflict, ConnectionFailed, DatabaseFailed,
                      DatabaseHibernated, ManagedByDatabase,
                      DatabaseNotFound, DirectoryNotEmpty, ExceedsTemplate, ExecFailed,
                      FileExists, FileNotFound, Forbidden, GuestIOError, HostFull, InvalidArgument,
                      InvalidCwd, IsADirectory, NoSpace, NotADirectory, NotFound,
                      NotImplementedByServer, PandaStackError, PayloadTooLarge, PermissionDenied,
                      QuotaExceeded, RateLimited, SandboxBusy, SandboxFailed, SandboxHibernated, SandboxNotFound,
                      SandboxStopped, SnapshotNotFound, StartFailed, TemplateBuildFailed, TemplateInUse,
                      TemplateNotFound, Timeout,
                      TransitionFailed, Unauthorized, VolumeAttached, VolumeInUse,
                      VolumeNotFound)
from ._models import (CodeError, CodeResult, DatabaseBackup, DatabaseInfo, ExecEvent, ExecResult,
                      Execution, FileEvent, FileInfo, ProcessInfo, SandboxInfo, SnapshotInfo, VolumeInfo,
                      VolumeSnapshotInfo,
                      BuildProgress, TemplateInfo)
from ._sync import Database, Sandbox, Secrets, Template, Volume

__version__ = "0.2.0"  # (sdk/python/pyproject.toml says the same)
__all__ = [
    "Sandbox", "AsyncSandbox", "ExecResult", "ExecEvent", "SandboxInfo", "SnapshotInfo", "FileInfo",
    "FileEvent",
    "ProcessInfo", "PandaStackError", "InvalidArgument", "InvalidCwd", "CommandNotFound",
    "Unauthorized", "Forbidden", "PermissionDenied", "NotFound", "SandboxNotFound",
    "FileNotFound", "TemplateNotFound", "SnapshotNotFound", "Conflict", "SandboxHibernated",
    "SandboxStopped", "SandboxFailed", "SandboxBusy", "IsADirectory", "NotADirectory",
    "FileExists", "DirectoryNotEmpty", "NoSpace", "GuestIOError", "TransitionFailed",
    "StartFailed", "ExecFailed", "PayloadTooLarge", "RateLimited", "Timeout",
    "NotImplementedByServer", "ConnectionFailed", "QuotaExceeded", "HostFull",
    "BackupNotFound", "Database", "DatabaseBackup", "DatabaseInfo", "DatabaseNotFound", "DatabaseHibernated",
    "DatabaseFailed", "ManagedByDatabase",
    "Volume", "VolumeInfo", "VolumeSnapshotInfo", "VolumeNotFound", "VolumeInUse",
    "VolumeAttached", "Execution", "CodeResult", "CodeError",
    "Template", "TemplateInfo", "BuildProgress", "TemplateBuildFailed", "TemplateInUse",
    "ExceedsTemplate", "Secrets",
]
