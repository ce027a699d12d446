"""Plain data returned by the SDK."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


def _output(body: Dict[str, Any], name: str) -> bytes:
    data = body.get(name, "")
    if body.get(name + "_encoding") == "base64":
        return base64.b64decode(data)
    return data.encode()


@dataclass
class ExecResult:
    """The outcome of a command: output (text, undecodable bytes replaced), exit code, timing."""

    stdout_bytes: bytes
    stderr_bytes: bytes
    exit_code: int
    timed_out: bool = False
    duration_ms: float = 0.0
    #: True when the stream had more than the 16 MiB kept of it
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def stdout(self) -> str:
        """stdout as text (UTF-8, invalid bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """stderr as text (UTF-8, invalid bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        """True when the command exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_api(cls, body: Dict[str, Any]) -> "ExecResult":
        return cls(_output(body, "stdout"), _output(body, "stderr"), int(body["exit_code"]),
                   bool(body.get("timed_out", False)), float(body.get("duration_ms", 0.0)),
                   bool(body.get("stdout_truncated", False)),
                   bool(body.get("stderr_truncated", False)))


@dataclass
class ExecEvent:
    """One event of a streamed command: kind is "stdout", "stderr", "exit" or "error"."""

    kind: str
    data: bytes = b""
    exit_code: Optional[int] = None
    timed_out: bool = False
    error_code: Optional[str] = None
    message: Optional[str] = None
    duration_ms: float = 0.0

    @property
    def text(self) -> str:
        """The data as text."""
        return self.data.decode("utf-8", "replace")


@dataclass
class SandboxInfo:
    """A sandbox as the API describes it."""

    id: str
    template: str
    state: str
    created_at_ms: int
    expires_at_ms: int
    persistent: bool = False
    metadata: Dict[str, str] = field(default_factory=dict)
    parent: Optional[str] = None
    snapshots: List[str] = field(default_factory=list)
    network: bool = False
    #: {"mode", "cidrs", "domains"} when the sandbox has a network
    egress: Optional[Dict[str, Any]] = None
    auto_wake: bool = False
    ttl_seconds: int = 0
    #: seconds without use before ``on_timeout`` happens (0: no idle timeout)
    idle_timeout_seconds: int = 0
    #: what the TTL or the idle timeout does: "kill" or "hibernate"
    on_timeout: str = "kill"
    #: [{"volume", "mount", "read_only"}]: the volumes attached at create
    volumes: List[Dict[str, Any]] = field(default_factory=list)
    #: its guest's shape: its template's
    memory_mib: int = 0
    vcpus: int = 0
    #: while hibernated: "local" once a synced copy is on the host's data disk (it survives a
    #: reboot), "remote" once it is in the host's object store too (it survives the loss of
    #: that disk), "none" before (None when not hibernated)
    durable: Optional[str] = None

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "SandboxInfo":
        return cls(b["id"], b["template"], b["state"], int(b["created_at_ms"]),
                   int(b["expires_at_ms"]), bool(b.get("persistent", False)),
                   dict(b.get("metadata", {})), b.get("parent"), list(b.get("snapshots", [])),
                   bool(b.get("network", False)), b.get("egress"),
                   bool(b.get("auto_wake", False)), int(b.get("ttl_seconds", 0)),
                   int(b.get("idle_timeout_seconds", 0)), str(b.get("on_timeout", "kill")),
                   list(b.get("volumes", [])), int(b.get("memory_mib", 0)),
                   int(b.get("vcpus", 0)), b.get("durable"))


@dataclass
class SnapshotInfo:
    """One of a tenant's snapshots (``Sandbox.list_snapshots()``)."""
    id: str
    sandbox: str
    template: str
    created_at_ms: int
    #: host storage it holds (RAM file and disk layers); ``memory_bytes`` of it is host RAM
    size_bytes: int
    memory_bytes: int
    #: the name it was taken with (None: none); ``current``: the newest with that name
    name: Optional[str] = None
    current: bool = False
    #: "local" once a synced copy is on the host's data disk (it survives a reboot), "remote" once
    #: it is in the host's object store too (it survives the loss of the disk), "none" while it
    #: is on tmpfs only (the copies are made in the background after the snapshot answers)
    durable: str = "none"

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "SnapshotInfo":
        return cls(b["id"], b["sandbox"], b["template"], int(b["created_at_ms"]),
                   int(b["size_bytes"]), int(b["memory_bytes"]), b.get("name"),
                   bool(b.get("current", False)), str(b.get("durable", "none")))


@dataclass
class VolumeInfo:
    """A volume as the API describes it."""

    id: str
    name: str
    status: str
    size_mib: int
    created_at_ms: int
    metadata: Dict[str, str] = field(default_factory=dict)
    #: [{"sandbox", "mount", "read_only"}]: the sandboxes holding it
    attachments: List[Dict[str, Any]] = field(default_factory=list)
    #: its snapshots, oldest first
    snapshots: List["VolumeSnapshotInfo"] = field(default_factory=list)
    #: "" (made empty), or what it is a copy of: "fork:<sandbox>:<volume>",
    #: "snapshot:<snapshot>:<volume>", "volume-snapshot:<vsnap>:<volume>"
    origin: str = ""
    #: "remote" once its file, detached, is in the host's object store too (the loss of the data
    #: disk keeps it), "local" while a sandbox holds it or before that upload (None: deleted)
    durable: Optional[str] = None

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "VolumeInfo":
        return cls(b["id"], b.get("name", ""), b["status"], int(b["size_mib"]),
                   int(b["created_at_ms"]), dict(b.get("metadata", {})),
                   list(b.get("attachments", [])),
                   [VolumeSnapshotInfo.from_api(s) for s in b.get("snapshots", [])],
                   b.get("origin", ""), b.get("durable"))


@dataclass
class VolumeSnapshotInfo:
    """A point-in-time copy of a volume (``Volume.create(from_snapshot=...)`` makes a new
    volume of it)."""

    id: str
    volume: str
    size_mib: int
    created_at_ms: int

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "VolumeSnapshotInfo":
        return cls(b["id"], b["volume"], int(b["size_mib"]), int(b["created_at_ms"]))


@dataclass
class FileInfo:
    """A file or folder in the sandbox."""

    name: str
    type: str  # file, directory, symlink, other
    size: int
    mode: int
    mtime_ms: int

    @property
    def is_dir(self) -> bool:
        return self.type == "directory"

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "FileInfo":
        return cls(b["name"], b["type"], int(b["size"]), int(b["mode"]), int(b["mtime_ms"]))


@dataclass
class ProcessInfo:
    """A background process."""

    pid: int
    command: str
    running: bool
    exit_code: int
    started_at_ms: int

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "ProcessInfo":
        return cls(int(b["pid"]), b["command"], bool(b["running"]), int(b["exit_code"]),
                   int(b["started_at_ms"]))


@dataclass
class FileEvent:
    """A change in a watched folder: type is "create", "write", "remove", "rename", "chmod" or
    "overflow" (changes were lost: the guest's queue overflowed); ``name`` is relative to the
    folder, ``path`` absolute."""

    type: str
    name: str
    path: str
    is_dir: bool = False


def event_from_sse(event: str, data: Dict[str, Any]) -> Union[ExecEvent, FileEvent]:
    """An ExecEvent from one server-sent event of an exec or process stream (a FileEvent from a
    folder watch's changes; its start and end are ExecEvents "ready" and "end")."""
    if event == "change":
        return FileEvent(data["type"], data["name"], data["path"], bool(data.get("is_dir", False)))
    if event in ("ready", "end"):
        return ExecEvent(event)
    if event in ("stdout", "stderr"):
        raw = data.get("data", "")
        payload = base64.b64decode(raw) if data.get("encoding") == "base64" else raw.encode()
        return ExecEvent(event, payload)
    if event == "exit":
        return ExecEvent("exit", exit_code=int(data["exit_code"]),
                         timed_out=bool(data.get("timed_out", False)),
                         duration_ms=float(data.get("duration_ms", 0.0)))
    return ExecEvent("error", error_code=data.get("code"), message=data.get("message"))


@dataclass
class DatabaseInfo:
    """A managed PostgreSQL database as the API describes it. ``password`` (and the password in
    ``connection_uri``) is there only in the answers of ``Database.create`` and
    ``rotate_password``: the platform stores no copy."""

    id: str
    name: str
    status: str  # running, hibernated, starting, failed (failure_reason), deleted
    host: str
    port: int
    user: str
    database: str
    connection_uri: str
    sandbox: str
    volume: str
    created_at_ms: int
    metadata: Dict[str, str] = field(default_factory=dict)
    password: str = ""
    backups: List["DatabaseBackup"] = field(default_factory=list)
    restored_from: str = ""
    failure_reason: str = ""

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "DatabaseInfo":
        return cls(b["id"], b["name"], b["status"], b.get("host", ""), int(b.get("port", 0)),
                   b["user"], b["database"], b.get("connection_uri", ""), b.get("sandbox", ""),
                   b.get("volume", ""), int(b["created_at_ms"]), dict(b.get("metadata", {})),
                   b.get("password", ""),
                   [DatabaseBackup.from_api(x) for x in b.get("backups", [])],
                   b.get("restored_from", ""), b.get("failure_reason", ""))


@dataclass
class DatabaseBackup:
    """A backup of a database: ``pg_dump`` in its custom format, kept on the host with the
    database (deleted with it). Restore it with ``Database.create(name, from_backup=id)``."""

    id: str
    database: str
    bytes: int
    created_at_ms: int

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "DatabaseBackup":
        return cls(b["id"], b["database"], int(b["bytes"]), int(b["created_at_ms"]))


@dataclass
class CodeResult:
    """One result of a code run: the last expression's value (``is_main_result``) or a figure."""

    text: str
    png: Optional[bytes] = None
    json: Any = None
    is_main_result: bool = False

    @classmethod
    def from_api(cls, r: Dict[str, Any]) -> "CodeResult":
        png = base64.b64decode(r["png"]) if r.get("png") else None
        return cls(r.get("text", ""), png, r.get("json"), bool(r.get("is_main_result")))


@dataclass
class CodeError:
    """The exception a run raised (the context lives on)."""

    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    """What a run of code produced. ``text`` is the main result's text (None without one)."""

    stdout: str
    stderr: str
    results: List[CodeResult]
    error: Optional[CodeError]
    execution_count: int
    timed_out: bool = False

    @property
    def text(self) -> Optional[str]:
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "Execution":
        e = b.get("error")
        err = CodeError(e["name"], e["value"], e["traceback"]) if e else None
        return cls(b.get("stdout", ""), b.get("stderr", ""),
                   [CodeResult.from_api(r) for r in b.get("results", [])], err,
                   int(b.get("execution_count", 0)), bool(b.get("timed_out")))



@dataclass
class TemplateInfo:
    """A template as the API describes it: a shipped one (``kind`` "shipped") or one of yours
    (``kind`` "custom": ``status`` building, ready or failed)."""

    name: str
    kind: str
    status: str
    from_: str = ""
    packages: List[str] = field(default_factory=list)
    run: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    build_ms: int = 0
    size_bytes: int = 0
    error: str = ""
    log_tail: str = ""
    #: its sandboxes' shape
    memory_mib: int = 0
    vcpus: int = 0

    @classmethod
    def from_api(cls, b: Dict[str, Any]) -> "TemplateInfo":
        return cls(b["name"], b.get("kind", "custom"), b.get("status", "ready"), b.get("from", ""),
                   list(b.get("packages", [])), list(b.get("run", [])), dict(b.get("env", {})),
                   int(b.get("build_ms", 0)), int(b.get("size_bytes", 0)), b.get("error", ""),
                   b.get("log_tail", ""), int(b.get("memory_mib", 0)), int(b.get("vcpus", 0)))


@dataclass
class BuildProgress:
    """One step of a template build, as ``Template.build(on_progress=...)`` gets it: a stage
    change (``line`` empty) or a line of the build's log."""

    stage: str
    percent: int
    line: str = ""
