"""PandaStack Python SDK: hardware-isolated sandboxes for agents.

    from pandastack import Sandbox
    with Sandbox.create() as sbx:
        print(sbx.exec("python3 -c 'print(6*7)'").stdout)

Reads PANDASTACK_API_KEY and PANDASTACK_BASE_URL (default http://127.0.0.1:7070).
"""
from ._async import AsyncSandbox
from ._errors import (Conflict, ConnectionFailed, FileNotFound, Forbidden, InvalidArgument,
                      NotFound, NotImplementedByServer, PandaStackError, PayloadTooLarge,
                      RateLimited, SandboxBusy, SandboxHibernated, SandboxNotFound,
                      SandboxStopped, SnapshotNotFound, TemplateNotFound, Timeout, Unauthorized)
from ._models import ExecEvent, ExecResult, FileInfo, ProcessInfo, SandboxInfo
from ._sync import Sandbox

__version__ = "0.1.0"
__all__ = [
    "Sandbox", "AsyncSandbox", "ExecResult", "ExecEvent", "SandboxInfo", "FileInfo",
    "ProcessInfo", "PandaStackError", "InvalidArgument", "Unauthorized", "Forbidden", "NotFound",
    "SandboxNotFound", "FileNotFound", "TemplateNotFound", "SnapshotNotFound", "Conflict",
    "SandboxHibernated", "SandboxStopped", "SandboxBusy", "PayloadTooLarge", "RateLimited",
    "Timeout", "NotImplementedByServer", "ConnectionFailed",
]
