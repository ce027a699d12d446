"""The synchronous client: ``Sandbox``."""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Union, Sequence, overload

import httpx

from . import _common as c
import json

from ._errors import (NotFound, PandaStackError, PayloadTooLarge, SandboxStopped,
                      TemplateBuildFailed, error_for)
from ._models import (BuildProgress, DatabaseBackup, DatabaseInfo, ExecEvent, ExecResult, Execution, FileEvent,
                      FileInfo, ProcessInfo, SandboxInfo, SnapshotInfo, TemplateInfo, VolumeInfo,
                      VolumeSnapshotInfo)


class _Http:
    def __init__(self, api_key: Optional[str], base_url: Optional[str], timeout: float) -> None:
        key, url = c.config(api_key, base_url)
        self.key, self.url = key, url
        self.timeout = timeout
        self.client = httpx.Client(base_url=url, headers=c.headers(key),
                                   timeout=httpx.Timeout(timeout, connect=10.0))

    def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        attempt, waited = 0, 0.0
        while True:
            try:
                r = self.client.request(method, path, **kw)
            except httpx.TransportError as e:
                raise c.transport_error(e) from e
            wait = c.retry_after(r, attempt, waited)
            if wait is None:
                break
            time.sleep(wait)  # the server refused it for now (busy): nothing was done
            waited += wait
            attempt += 1
        c.raise_for(r)
        return r

    def sse(self, method: str, path: str, **kw: Any) -> Iterator[ExecEvent]:
        """The events of a stream; an error event (the sandbox was stopped meanwhile, ...) raises
        its typed error, so a plain `for` loop does not end quietly."""
        parser = c.SseParser()
        on_open = kw.pop("on_open", None)
        try:
            with self.client.stream(method, path, **kw) as r:
                if on_open is not None:
                    on_open(r)
                if r.status_code >= 300:
                    r.read()
                    c.raise_for(r)
                for chunk in r.iter_bytes():
                    for ev in parser.feed_bytes(chunk):
                        if getattr(ev, "kind", None) == "error":
                            raise error_for(ev.error_code or "internal", ev.message or "", 0)
                        yield ev
        except httpx.TransportError as e:
            raise c.transport_error(e) from e


class Filesystem:
    """Files in the sandbox (``sandbox.filesystem``)."""

    def __init__(self, sbx: "Sandbox") -> None:
        self._s = sbx

    def _path(self, sub: str = "") -> str:
        return f"/v1/sandboxes/{c.sid(self._s.id)}/files{sub}"

    def write(self, path: str, data: Union[str, bytes], mode: Optional[int] = None) -> None:
        """Writes a whole file (parents are created). ``mode`` (e.g. ``0o755``) sets its
        permissions; without it a new file is 0644 and an existing one keeps its mode. A file
        over the server's 64 MiB per request goes in parts of 32 MiB."""
        content = data.encode() if isinstance(data, str) else data
        params = {"path": path, **({"mode": format(mode, "o")} if mode is not None else {})}
        if len(content) <= c.FILE_LIMIT:
            self._s._http.call("PUT", self._path(), params=params, content=content)
            return
        view = memoryview(content)
        for off in range(0, len(content), c.FILE_PART):
            self._put_part(path, params, off, bytes(view[off:off + c.FILE_PART]))

    def _put_part(self, path: str, params: Dict[str, str], off: int, part: bytes) -> None:
        self._s._http.call("PUT", self._path(), params={**params, "offset": str(off)} if off
                           else params, content=part)

    def read(self, path: str) -> bytes:
        """Reads a whole file (one over 64 MiB in parts of 32 MiB)."""
        try:
            return self._s._http.call("GET", self._path(), params={"path": path}).content
        except PayloadTooLarge:
            size = self.stat(path).size
            return b"".join(self._get_part(path, off) for off in range(0, size, c.FILE_PART))

    def _get_part(self, path: str, off: int) -> bytes:
        return self._s._http.call("GET", self._path(), params={
            "path": path, "offset": str(off), "length": str(c.FILE_PART)}).content

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """Reads a whole file as text."""
        return self.read(path).decode(encoding)

    def list(self, path: str) -> List[FileInfo]:
        """The entries of a folder."""
        r = self._s._http.call("GET", self._path("/list"), params={"path": path})
        return [FileInfo.from_api(e) for e in r.json()["entries"]]

    def stat(self, path: str) -> FileInfo:
        """One path's type, size, mode and modification time."""
        return FileInfo.from_api(
            self._s._http.call("GET", self._path("/stat"), params={"path": path}).json())

    def exists(self, path: str) -> bool:
        """True when the path exists."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, or a folder (with ``recursive=True`` when not empty)."""
        params = {"path": path, **({"recursive": "1"} if recursive else {})}
        self._s._http.call("DELETE", self._path(), params=params)

    def mkdir(self, path: str, parents: bool = True) -> None:
        """Makes a folder."""
        self._s._http.call("POST", self._path("/mkdir"), json={"path": path, "parents": parents})

    def rename(self, src: str, dst: str) -> None:
        """Renames (moves) a path."""
        self._s._http.call("POST", self._path("/rename"), json={"from": src, "to": dst})

    def watch(self, path: str, recursive: bool = False) -> "FileWatch":
        """Watches the folder ``path`` (with ``recursive``, its subfolders too, those made later
        included). Returns once the watch is in place, so every later change is reported: iterate
        the result for FileEvents; it ends when the folder goes, or after ``close()`` (or at the
        end of its ``with`` block)."""
        params = {"path": path, **({"recursive": "1"} if recursive else {})}
        return FileWatch(lambda opened: self._s._http.sse("GET", self._path("/watch"),
                                                          params=params, on_open=opened))

    def upload(self, local_path: str, remote_path: str) -> None:
        """Copies a local file into the sandbox (a large one 32 MiB at a time: never whole in
        memory)."""
        with open(local_path, "rb") as f:
            if os.fstat(f.fileno()).st_size <= c.FILE_LIMIT:
                self.write(remote_path, f.read())
                return
            off = 0
            while True:
                part = f.read(c.FILE_PART)
                if not part:
                    return
                self._put_part(remote_path, {"path": remote_path}, off, part)
                off += len(part)

    def download(self, remote_path: str, local_path: str) -> None:
        """Copies a file from the sandbox to a local path (a large one 32 MiB at a time)."""
        size = self.stat(remote_path).size
        with open(local_path, "wb") as f:
            if size <= c.FILE_LIMIT:
                f.write(self.read(remote_path))
                return
            for off in range(0, size, c.FILE_PART):
                f.write(self._get_part(remote_path, off))


class FileWatch:
    """A folder watch in place (``Filesystem.watch``): iterate it for FileEvents."""

    def __init__(self, open_events: Any) -> None:
        self._closed = False
        self._response: Any = None

        def opened(r: Any) -> None:
            self._response = r
        self._events = open_events(opened)
        first = next(self._events, None)  # "ready"; a refused watch raises its error here
        if getattr(first, "kind", None) != "ready":
            raise PandaStackError("the watch ended before it started", "internal")

    def __iter__(self) -> Iterator[FileEvent]:
        try:
            for ev in self._events:
                if isinstance(ev, FileEvent):
                    yield ev
        except Exception:
            if self._closed:  # close() from another thread cut the stream: the end, not an error
                return
            raise

    def close(self) -> None:
        """Stops watching (closes the stream). Safe from another thread: an iteration blocked
        waiting for the next event there ends."""
        self._closed = True
        stream = getattr(self._response, "extensions", {}).get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked read
            except OSError:
                pass
        try:
            self._events.close()  # type: ignore[attr-defined]
        except ValueError:
            pass  # being iterated in another thread: that iteration ends now

    def __enter__(self) -> "FileWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Processes:
    """Background processes (``sandbox.process``)."""

    def __init__(self, sbx: "Sandbox") -> None:
        self._s = sbx

    def start(self, cmd: c.Command, env: Optional[Mapping[str, str]] = None,
              cwd: Optional[str] = None, timeout_seconds: Optional[int] = None) -> int:
        """Starts a command in the background; returns its pid."""
        body = c.exec_body(cmd, timeout_seconds, env, cwd, None)
        return int(self._s._http.call("POST", f"/v1/sandboxes/{c.sid(self._s.id)}/processes",
                                      json=body).json()["pid"])

    def list(self) -> List[ProcessInfo]:
        """Running and recently exited background processes."""
        r = self._s._http.call("GET", f"/v1/sandboxes/{c.sid(self._s.id)}/processes")
        return [ProcessInfo.from_api(p) for p in r.json()["processes"]]

    def kill(self, pid: int, signal: Optional[int] = None) -> None:
        """Signals the process's group (default SIGKILL; signals are 1..64)."""
        params = {"signal": str(signal)} if signal is not None else None
        self._s._http.call("DELETE", f"/v1/sandboxes/{c.sid(self._s.id)}/processes/{pid}", params=params)

    def stream(self, pid: int) -> Iterator[ExecEvent]:
        """Its output from the start, then live, then the exit event."""
        return self._s._http.sse("GET", f"/v1/sandboxes/{c.sid(self._s.id)}/processes/{pid}/stream")


class Sandbox:
    """A PandaStack sandbox: a microVM driven through the REST API.

    >>> with Sandbox.create() as sbx:
    ...     print(sbx.exec("echo hello").stdout)
    """

    def __init__(self, info: SandboxInfo, http: _Http) -> None:
        self.info = info
        self._http = http
        self.filesystem = Filesystem(self)
        self.files = self.filesystem
        self.process = Processes(self)

    # -- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def create(cls, template: str = "base", ttl_seconds: Optional[int] = None,
               metadata: Optional[Mapping[str, str]] = None, persistent: bool = False,
               auto_wake: bool = False, from_snapshot: Optional[str] = None, *,
               network: Optional[bool] = None, egress: Optional[str] = None,
               allow: Optional[Sequence[str]] = None,
               idle_timeout_seconds: Optional[int] = None, on_timeout: Optional[str] = None,
               volumes: Optional[Sequence[Any]] = None,
               memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
               secrets: Optional[Sequence[str]] = None,
               api_key: Optional[str] = None, base_url: Optional[str] = None,
               timeout: float = 300.0) -> "Sandbox":
        """Creates a sandbox (restored from the template's snapshot) and returns it running.

        ``network=False`` creates it without a network; ``egress`` is ``"deny_all"``,
        ``"allow_all"`` or ``"allowlist"`` and ``allow`` the allowlist's IPv4 addresses/CIDRs
        (an allowlist when only ``allow`` is given); by default the daemon's policy applies.

        Timeouts: ``ttl_seconds`` from now, and ``idle_timeout_seconds`` without a command, file
        or process call, stream or running background process; either ends in ``on_timeout``
        (``"kill"``, or ``"hibernate"``: the default when ``persistent``). A hibernated sandbox
        created with ``auto_wake=True`` wakes on its next exec, file or process call.

        ``volumes``: volumes to attach and mount before the call returns, each
        ``{"volume": id_or_Volume, "mount": "/data", "read_only": False}`` or a
        ``(volume, mount[, read_only])`` tuple (at most 4).

        ``memory_mib``, ``vcpus``: the guest's shape is its template's (baked into its
        snapshot); asking for more raises ``ExceedsTemplate``.

        ``secrets``: names of your secrets (``Secrets.create``) its processes get as environment
        variables holding placeholders; its egress proxy puts the values into HTTPS requests to
        each secret's hosts only (the value never enters the sandbox)."""
        http = _Http(api_key, base_url, timeout)
        body = c.create_body(template, ttl_seconds, metadata, persistent, auto_wake, from_snapshot,
                             network, egress, allow, idle_timeout_seconds, on_timeout,
                             volumes, memory_mib, vcpus, secrets)
        return cls(SandboxInfo.from_api(http.call("POST", "/v1/sandboxes", json=body).json()), http)

    @classmethod
    def get(cls, sandbox_id: str, *, api_key: Optional[str] = None,
            base_url: Optional[str] = None, timeout: float = 300.0) -> "Sandbox":
        """An existing sandbox of this key's tenant."""
        http = _Http(api_key, base_url, timeout)
        return cls(SandboxInfo.from_api(http.call("GET", f"/v1/sandboxes/{c.sid(sandbox_id)}").json()),
                   http)

    @classmethod
    def list(cls, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None, *,
             api_key: Optional[str] = None, base_url: Optional[str] = None) -> List[SandboxInfo]:
        """This tenant's sandboxes, filtered by state and metadata entries."""
        http = _Http(api_key, base_url, 60.0)
        r = http.call("GET", "/v1/sandboxes", params=c.list_params(state, metadata))
        return [SandboxInfo.from_api(s) for s in r.json()["sandboxes"]]

    @classmethod
    def list_snapshots(cls, *, api_key: Optional[str] = None,
                       base_url: Optional[str] = None) -> List[SnapshotInfo]:
        """This tenant's snapshots, oldest first."""
        http = _Http(api_key, base_url, 60.0)
        return [SnapshotInfo.from_api(s) for s in http.call("GET", "/v1/snapshots").json()["snapshots"]]

    @classmethod
    def delete_snapshot(cls, snapshot_id: str, *, api_key: Optional[str] = None,
                        base_url: Optional[str] = None) -> None:
        """Deletes one of this tenant's snapshots (``snapshot()``): creates from it are refused
        afterwards (``NotFound``); sandboxes created from it keep running."""
        http = _Http(api_key, base_url, 60.0)
        http.call("DELETE", f"/v1/snapshots/{snapshot_id}")

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        """The state when last seen (``refresh()`` to update)."""
        return self.info.state

    def refresh(self) -> SandboxInfo:
        """Reads the sandbox's current info."""
        self.info = SandboxInfo.from_api(self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}").json())
        return self.info

    def _post(self, action: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/{action}", json=body).json()

    def kill(self) -> None:
        """Stops the sandbox and releases everything it holds."""
        self.info = SandboxInfo.from_api(
            self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}").json())

    def hibernate(self, memory: bool = True) -> None:
        """Saves the sandbox and stops its VM; ``wake()`` brings it back. ``memory=False`` keeps
        only its disk: the wake boots the guest afresh on it (files stay, processes do not)."""
        self.info = SandboxInfo.from_api(self._post("hibernate", None if memory else {"memory": False}))

    def wake(self) -> None:
        """Restores a hibernated sandbox."""
        self.info = SandboxInfo.from_api(self._post("wake"))

    def snapshot(self, name: Optional[str] = None) -> str:
        """Snapshots the running sandbox; the id (or ``name``, which then stands for this newest
        snapshot taken with it) can be passed to ``create(from_snapshot=...)``."""
        return str(self._post("snapshots", {"name": name} if name else None)["snapshot_id"])

    @overload
    def fork(self, *, inherit_secrets: bool = False) -> "Sandbox": ...

    @overload
    def fork(self, count: int, *, inherit_secrets: bool = False) -> List["Sandbox"]: ...

    def fork(self, count: Optional[int] = None, *,
             inherit_secrets: bool = False) -> Union["Sandbox", List["Sandbox"]]:
        """A copy of the running sandbox (memory, processes and disk); it keeps running.

        ``fork()`` returns one ``Sandbox``; ``fork(count=N)`` returns a list of N (1..16).
        ``inherit_secrets``: the children's requests carry this sandbox's secrets too."""
        body: Dict[str, Any] = {"count": 1 if count is None else count}
        if inherit_secrets:
            body["inherit_secrets"] = True
        kids = self._post("fork", body)["sandboxes"]
        forks = [Sandbox(SandboxInfo.from_api(k), self._http) for k in kids]
        return forks[0] if count is None else forks

    def publish_template(self, name: str) -> "Template":
        """Makes this running sandbox (its disk and memory, now) a template of yours: every
        sandbox of ``Sandbox.create(template=name)`` starts from this instant."""
        info = self._http.call("POST", f"/v1/sandboxes/{self.id}/template", json={"name": name})
        # (a client of its own: it outlives this sandbox's)
        return Template(TemplateInfo.from_api(info.json()), _Http(self._http.key, self._http.url, 60.0))

    def set_ttl(self, ttl_seconds: int) -> None:
        """Sets the time to live from now."""
        self.info = SandboxInfo.from_api(self._http.call(
            "PATCH", f"/v1/sandboxes/{c.sid(self.id)}", json={"ttl_seconds": ttl_seconds}).json())

    def set_egress(self, mode: Optional[str] = None, allow: Optional[Sequence[str]] = None) -> None:
        """Replaces the egress policy (``deny_all``, ``allow_all``, or an allowlist of CIDRs)."""
        self.info = SandboxInfo.from_api(self._http.call(
            "PATCH", f"/v1/sandboxes/{c.sid(self.id)}", json={"egress": c.egress_body(mode, allow)}).json())

    def expose_port(self, port: int) -> Dict[str, Any]:
        """Forwards guest TCP ``port`` from the host; returns ``{port, host, host_port, address}``.
        The exposure is recorded: it is forwarded again after a wake (maybe on another host port)."""
        return dict(self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/ports",
                                    json={"port": port}).json())

    def unexpose_port(self, port: int) -> None:
        """Stops forwarding guest ``port``."""
        self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}/ports/{int(port)}")

    def ports(self) -> List[Dict[str, Any]]:
        """Exposed guest ports and their host addresses (``host_port`` None while not running)."""
        return list(self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/ports").json()["ports"])

    def metrics(self, from_ms: Optional[int] = None, to_ms: Optional[int] = None) -> List[Dict[str, Any]]:
        """The sandbox's CPU, memory and disk use over time: ``[{timestamp_ms, cpu_used_pct,
        cpu_count, mem_used_bytes, mem_total_bytes, disk_used_bytes, disk_total_bytes}]``."""
        q = "&".join(f"{k}={int(v)}" for k, v in (("from_ms", from_ms), ("to_ms", to_ms)) if v is not None)
        return list(self._http.call(
            "GET", f"/v1/sandboxes/{c.sid(self.id)}/metrics" + (f"?{q}" if q else "")).json()["metrics"])

    def egress_log(self, after: int = 0, limit: int = 100, kind: Optional[str] = None,
                   verdict: Optional[str] = None) -> Dict[str, Any]:
        """What the sandbox's network answered, let out and refused: ``{entries, next_after,
        dropped, lost}``, oldest first; pass ``next_after`` as ``after`` for the next page.
        ``kind``: "dns" or "connection"; ``verdict``: "allowed" or "denied"."""
        return dict(self._http.call(
            "GET", f"/v1/sandboxes/{c.sid(self.id)}/egress?" + c.egress_query(after, limit, kind, verdict)).json())

    def preview(self, port: int, ttl_seconds: Optional[int] = None, public: bool = False) -> Dict[str, Any]:
        """Serves guest ``port`` at a preview URL of the daemon; returns ``{port, url, path_url,
        token, public, created_at_ms, expires_at_ms}`` (``url`` carries the token: a link to hand
        out). Calling it again for the port makes a new URL and revokes the old one."""
        body: Dict[str, Any] = {"port": port, "public": public}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        return dict(self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/previews", json=body).json())

    def previews(self) -> List[Dict[str, Any]]:
        """The sandbox's preview URLs."""
        return list(self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/previews").json()["previews"])

    def close_preview(self, port: int) -> None:
        """Revokes the preview URL of ``port`` (its next request is refused)."""
        self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}/previews/{int(port)}")

    def set_metadata(self, metadata: Mapping[str, str]) -> None:
        """Replaces the sandbox's metadata."""
        self.info = SandboxInfo.from_api(self._http.call(
            "PATCH", f"/v1/sandboxes/{c.sid(self.id)}", json={"metadata": dict(metadata)}).json())

    def events(self) -> List[Dict[str, Any]]:
        """The sandbox's audit events, oldest first."""
        return list(self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/events").json()["events"])

    # -- commands -------------------------------------------------------------------------------

    def exec(self, cmd: c.Command, timeout_seconds: Optional[int] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             stdin: Union[str, bytes, None] = None) -> ExecResult:
        """Runs a command (a shell string, or an argv list) to completion."""
        body = c.exec_body(cmd, timeout_seconds, env, cwd, stdin)
        # The HTTP timeout follows the command's (an exec of an hour works).
        r = self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/exec", json=body,
                            timeout=c.exec_timeout(timeout_seconds, self._http.timeout))
        return ExecResult.from_api(r.json())

    def exec_stream(self, cmd: c.Command, timeout_seconds: Optional[int] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    stdin: Union[str, bytes, None] = None) -> Iterator[ExecEvent]:
        """Runs a command; yields stdout/stderr events as they come, then the exit event.
        Closing the iterator early kills the command in the guest. A stream the server ends with
        an error (the sandbox stopped or hibernated meanwhile) raises that typed error."""
        body = c.exec_body(cmd, timeout_seconds, env, cwd, stdin)
        return self._http.sse("POST", f"/v1/sandboxes/{c.sid(self.id)}/exec/stream", json=body,
                              timeout=c.exec_timeout(timeout_seconds, self._http.timeout))

    # -- code interpreter -------------------------------------------------------------------------

    def run_code(self, code: str, context: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None,
                 timeout_seconds: Optional[int] = None) -> Execution:
        """Runs Python in a context that keeps its variables between runs ("default" unless
        ``context`` names one from ``create_code_context``). The last expression's value is the
        main result (``.text``); an exception is ``.error`` (not raised); a run past its timeout is
        interrupted (``.timed_out``) and the context keeps its state."""
        body = c.code_body(code, context, env, timeout_seconds)
        r = self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/code", json=body,
                            timeout=c.exec_timeout(timeout_seconds, self._http.timeout))
        return Execution.from_api(r.json())

    def create_code_context(self, cwd: Optional[str] = None) -> str:
        """A new context (its own variables; ``cwd`` its working folder): its id."""
        body = {"cwd": cwd} if cwd else {}
        r = self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/code/contexts", json=body)
        return str(r.json()["id"])

    def code_contexts(self) -> List[str]:
        """The ids of the contexts running in the sandbox."""
        r = self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/code/contexts")
        return [x["id"] for x in r.json()["contexts"]]

    def delete_code_context(self, context: str) -> None:
        """Ends a context; its variables go."""
        self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}/code/contexts/{context}")

    # -- context manager ------------------------------------------------------------------------

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except (SandboxStopped, NotFound):
            pass
        except PandaStackError:
            pass
        self._http.client.close()

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.state!r})"


class Volume:
    """A volume: data that outlives sandboxes (an ext4 file system on the host's disk), attached
    at a sandbox's create (``Sandbox.create(volumes=[(vol, "/data")])``): read-write in one
    sandbox at a time, read-only in any number.

    >>> vol = Volume.create(size_mib=1024, name="repo")
    >>> with Sandbox.create(volumes=[(vol, "/data")]) as sbx:
    ...     sbx.exec("git clone ... /data/repo")
    """

    def __init__(self, info: VolumeInfo, http: _Http) -> None:
        self.info = info
        self._http = http

    @property
    def id(self) -> str:
        return self.info.id

    @classmethod
    def create(cls, size_mib: Optional[int] = None, name: str = "",
               metadata: Optional[Mapping[str, str]] = None, *, from_snapshot: Any = None,
               api_key: Optional[str] = None, base_url: Optional[str] = None) -> "Volume":
        """A new empty volume of ``size_mib``, or (``from_snapshot``: a snapshot or its id) a
        copy of a volume snapshot (``size_mib`` defaults to the snapshot's; larger grows it)."""
        http = _Http(api_key, base_url, 120.0)
        body: Dict[str, Any] = {"name": name}
        if size_mib is not None:
            body["size_mib"] = int(size_mib)
        if from_snapshot is not None:
            body["from_snapshot"] = getattr(from_snapshot, "id", from_snapshot)
        if metadata:
            body["metadata"] = dict(metadata)
        return cls(VolumeInfo.from_api(http.call("POST", "/v1/volumes", json=body).json()), http)

    @classmethod
    def get(cls, volume_id: str, *, api_key: Optional[str] = None,
            base_url: Optional[str] = None) -> "Volume":
        http = _Http(api_key, base_url, 60.0)
        return cls(VolumeInfo.from_api(http.call("GET", f"/v1/volumes/{c.sid(volume_id)}").json()),
                   http)

    @classmethod
    def list(cls, metadata: Optional[Mapping[str, str]] = None, *, api_key: Optional[str] = None,
             base_url: Optional[str] = None) -> List[VolumeInfo]:
        http = _Http(api_key, base_url, 60.0)
        params = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
        return [VolumeInfo.from_api(v)
                for v in http.call("GET", "/v1/volumes", params=params).json()["volumes"]]

    def refresh(self) -> VolumeInfo:
        self.info = VolumeInfo.from_api(self._http.call("GET", f"/v1/volumes/{self.id}").json())
        return self.info

    def update(self, size_mib: Optional[int] = None,
               metadata: Optional[Mapping[str, str]] = None) -> VolumeInfo:
        """Grows it (only larger, while no sandbox holds it) and/or replaces its metadata."""
        body: Dict[str, Any] = {}
        if size_mib is not None:
            body["size_mib"] = int(size_mib)
        if metadata is not None:
            body["metadata"] = dict(metadata)
        self.info = VolumeInfo.from_api(
            self._http.call("PATCH", f"/v1/volumes/{self.id}", json=body).json())
        return self.info

    def delete(self) -> None:
        """Deletes it, its data and its snapshots (``VolumeAttached`` while a sandbox holds
        it)."""
        self._http.call("DELETE", f"/v1/volumes/{self.id}")

    def snapshot(self) -> VolumeSnapshotInfo:
        """A point-in-time copy. Held read-write by a running sandbox, its file system is frozen
        (and so flushed) in the guest for the copy."""
        return VolumeSnapshotInfo.from_api(
            self._http.call("POST", f"/v1/volumes/{self.id}/snapshots", json={}).json())

    def snapshots(self) -> List[VolumeSnapshotInfo]:
        return [VolumeSnapshotInfo.from_api(s) for s in
                self._http.call("GET", f"/v1/volumes/{self.id}/snapshots").json()["snapshots"]]

    def delete_snapshot(self, snapshot: Any) -> None:
        sid = getattr(snapshot, "id", snapshot)
        self._http.call("DELETE", f"/v1/volumes/{self.id}/snapshots/{c.sid(sid)}")

    def __repr__(self) -> str:
        return f"Volume({self.id!r}, size_mib={self.info.size_mib})"


class Secrets:
    """Tenant secrets: a value and the hosts it may be sent to. The value goes in and never comes
    back (answers carry ``{name, hosts, version, created_at_ms, updated_at_ms, expires_at_ms}``).
    A sandbox created with ``secrets=[name]`` gets a placeholder; its egress proxy puts the value
    into HTTPS request headers to ``hosts`` (and, opted in, ``inject_into=["headers", "query",
    "body"]``, ``allow_plain_http=True``).

    >>> Secrets.create("GITHUB_TOKEN", token, hosts=["api.github.com"], ttl_seconds=3600)
    """

    @staticmethod
    def create(name: str, value: str, hosts: Sequence[str], ttl_seconds: Optional[int] = None, *,
               inject_into: Optional[Sequence[str]] = None,
               allow_plain_http: Optional[bool] = None,
               api_key: Optional[str] = None, base_url: Optional[str] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"name": name, "value": value, "hosts": list(hosts)}
        if ttl_seconds is not None:
            body["ttl_seconds"] = int(ttl_seconds)
        if inject_into is not None:
            body["inject_into"] = list(inject_into)
        if allow_plain_http is not None:
            body["allow_plain_http"] = bool(allow_plain_http)
        return dict(_Http(api_key, base_url, 60.0).call("POST", "/v1/secrets", json=body).json())

    @staticmethod
    def list(*, api_key: Optional[str] = None, base_url: Optional[str] = None) -> List[Dict[str, Any]]:
        return list(_Http(api_key, base_url, 60.0).call("GET", "/v1/secrets").json()["secrets"])

    @staticmethod
    def get(name: str, *, api_key: Optional[str] = None,
            base_url: Optional[str] = None) -> Dict[str, Any]:
        return dict(_Http(api_key, base_url, 60.0).call("GET", f"/v1/secrets/{c.sid(name)}").json())

    @staticmethod
    def update(name: str, value: Optional[str] = None, hosts: Optional[Sequence[str]] = None,
               ttl_seconds: Optional[int] = None, *,
               inject_into: Optional[Sequence[str]] = None,
               allow_plain_http: Optional[bool] = None, api_key: Optional[str] = None,
               base_url: Optional[str] = None) -> Dict[str, Any]:
        """Rotates the value (``version`` + 1) and/or replaces hosts, the expiry or where the
        value may go."""
        body: Dict[str, Any] = {}
        if inject_into is not None:
            body["inject_into"] = list(inject_into)
        if allow_plain_http is not None:
            body["allow_plain_http"] = bool(allow_plain_http)
        if value is not None:
            body["value"] = value
        if hosts is not None:
            body["hosts"] = list(hosts)
        if ttl_seconds is not None:
            body["ttl_seconds"] = int(ttl_seconds)
        return dict(_Http(api_key, base_url, 60.0).call(
            "PATCH", f"/v1/secrets/{c.sid(name)}", json=body).json())

    @staticmethod
    def delete(name: str, *, api_key: Optional[str] = None, base_url: Optional[str] = None) -> None:
        _Http(api_key, base_url, 60.0).call("DELETE", f"/v1/secrets/{c.sid(name)}")


class Template:
    """Templates: the shipped ones and your own, built from a shipped one plus Debian packages,
    files, environment variables and shell commands run as root in its guest, then baked once:
    every sandbox of it is a restore, in milliseconds.

    >>> t = Template.build("ml", packages=["python3-numpy"], run=["mkdir /workspace/data"],
    ...                    on_progress=lambda p: print(p.stage, p.percent, p.line))
    >>> sbx = Sandbox.create(template="ml")
    """

    def __init__(self, info: TemplateInfo, http: _Http) -> None:
        self.info = info
        self._http = http

    @property
    def name(self) -> str:
        return self.info.name

    @classmethod
    def build(cls, name: str, *, from_: str = "base", packages: Sequence[str] = (),
              files: Optional[Mapping[str, str]] = None, run: Sequence[str] = (),
              env: Optional[Mapping[str, str]] = None, network: bool = True,
              memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
              on_progress: Optional[Any] = None, timeout: float = 1800.0,
              api_key: Optional[str] = None, base_url: Optional[str] = None,
              dockerfile: Optional[str] = None, context: Optional[Any] = None,
              build_args: Optional[Mapping[str, str]] = None) -> "Template":
        """Builds template ``name`` and waits for it: ``on_progress(BuildProgress)`` gets each
        stage change and each log line. Raises ``TemplateBuildFailed`` (with the log's tail)
        when the build fails; ``Conflict`` while one of that name is being built or exists.
        ``memory_mib``, ``vcpus``: every sandbox of it gets this shape (by default the host's).
        ``dockerfile`` (with ``context`` and ``build_args``): the build's steps come from it
        instead of ``from_``, ``files``, ``run`` and ``env``. ``context``: a folder (uploaded as
        a tar, its ``.dockerignore`` applied by the build), a tar's bytes, a key
        ``upload_context`` answered ("sha256:..."), or a mapping of relative path -> text."""
        http = _Http(api_key, base_url, timeout)
        body: Dict[str, Any] = {"name": name, "packages": list(packages), "network": network}
        if dockerfile is not None:
            if context is None or isinstance(context, Mapping):
                ctx: Any = dict(context or {})
            elif isinstance(context, str) and context.startswith("sha256:"):
                ctx = context
            else:
                ctx = cls.upload_context(context, api_key=api_key, base_url=base_url)
            body.update(dockerfile=dockerfile, context=ctx, build_args=dict(build_args or {}))
        else:
            body.update({"from": from_, "files": dict(files or {}), "run": list(run),
                         "env": dict(env or {})})
        if memory_mib is not None:
            body["memory_mib"] = int(memory_mib)
        if vcpus is not None:
            body["vcpus"] = int(vcpus)
        http.call("POST", "/v1/templates", json=body)
        return cls._follow(http, name, on_progress)

    @staticmethod
    def upload_context(context: Any, *, api_key: Optional[str] = None,
                       base_url: Optional[str] = None, timeout: float = 600.0) -> str:
        """Uploads a Dockerfile build's context: ``context`` a folder (made a gzip tar here) or
        a tar's bytes (plain or gzip). Its key ("sha256:..."), for ``build(context=...)``; the
        daemon keeps it for your builds (the least recently used go first)."""
        if isinstance(context, (bytes, bytearray)):
            data = bytes(context)
        else:
            import io
            import tarfile
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
                root = os.fspath(context)
                for entry in sorted(os.listdir(root)):
                    t.add(os.path.join(root, entry), arcname=entry)
            data = buf.getvalue()
        http = _Http(api_key, base_url, timeout)
        r = http.call("POST", "/v1/build-contexts", content=data,
                      headers={"Content-Type": "application/x-tar"})
        return r.json()["context"]

    @classmethod
    def import_image(cls, name: str, archive: Any, *, network: bool = True,
                     memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
                     disk_mib: Optional[int] = None, start: bool = True,
                     on_progress: Optional[Any] = None, timeout: float = 1800.0,
                     api_key: Optional[str] = None,
                     base_url: Optional[str] = None) -> "Template":
        """Imports an image as template ``name`` and waits for it. ``archive``: the path of a
        ``docker save IMAGE`` archive or an OCI image layout tar, or its bytes. The image's
        layers are its root file system (unpacked in a builder microVM, every digest checked);
        its Env, WorkingDir and User are kept, and its Entrypoint/Cmd runs in every sandbox when
        it exposes a port (``start=False``: never). ``disk_mib``: its root disk (by default 4x
        the archive + 1 GiB, at least 2 GiB). Raises ``TemplateBuildFailed`` with the reason
        (a digest mismatch, an entry escaping the image, ...)."""
        http = _Http(api_key, base_url, timeout)
        if isinstance(archive, (bytes, bytearray)):
            data = bytes(archive)
        else:
            with open(archive, "rb") as f:
                data = f.read()
        params: Dict[str, Any] = {"network": "true" if network else "false",
                                  "start": "true" if start else "false"}
        for k, v in (("memory_mib", memory_mib), ("vcpus", vcpus), ("disk_mib", disk_mib)):
            if v is not None:
                params[k] = str(int(v))
        http.call("PUT", f"/v1/templates/{c.sid(name)}/image", params=params, content=data,
                  headers={"Content-Type": "application/x-tar"})
        return cls._follow(http, name, on_progress)

    @classmethod
    def pull(cls, name: str, image: str, *, registry_secret: Optional[str] = None,
             network: bool = True, memory_mib: Optional[int] = None,
             vcpus: Optional[int] = None, disk_mib: Optional[int] = None, start: bool = True,
             on_progress: Optional[Any] = None, timeout: float = 1800.0,
             api_key: Optional[str] = None, base_url: Optional[str] = None) -> "Template":
        """Pulls ``image`` (``python:3.12-slim``, ``ghcr.io/org/app:1``, ...) from its registry
        and imports it as template ``name`` (as ``import_image`` does with an archive), waiting
        for it. ``registry_secret``: a secret of yours (``user:password`` or a token) whose
        hosts name the registry."""
        http = _Http(api_key, base_url, timeout)
        body: Dict[str, Any] = {"name": name, "image": image, "network": network,
                                "start": "auto" if start else "none"}
        for k, v in (("memory_mib", memory_mib), ("vcpus", vcpus), ("disk_mib", disk_mib),
                     ("registry_secret", registry_secret)):
            if v is not None:
                body[k] = v
        http.call("POST", "/v1/templates", json=body)
        return cls._follow(http, name, on_progress)

    @classmethod
    def _follow(cls, http: "_Http", name: str, on_progress: Optional[Any]) -> "Template":
        """A build's (or an import's) progress until it ends."""
        stage, percent, end = "queued", 0, None
        try:
            with http.client.stream("GET", f"/v1/templates/{c.sid(name)}/build") as r:
                if r.status_code >= 300:
                    r.read()
                    c.raise_for(r)
                event = ""
                for line in r.iter_lines():
                    line = line.rstrip("\r\n")  # (older httpx keeps the line ends)
                    if line.startswith("event: "):
                        event = line[7:]
                        continue
                    if not line.startswith("data: "):
                        continue
                    data = json.loads(line[6:])
                    if event == "stage":
                        stage, percent = data["stage"], int(data["percent"])
                        if on_progress:
                            on_progress(BuildProgress(stage, percent))
                    elif event == "log" and on_progress:
                        on_progress(BuildProgress(stage, percent, data["line"]))
                    elif event == "end":
                        end = data
        except httpx.TransportError as e:
            raise c.transport_error(e) from e
        if end is None:
            raise PandaStackError("the build's progress stream ended early", code="stream_ended")
        info = TemplateInfo.from_api(end)
        if info.status != "ready":
            raise TemplateBuildFailed(info.error or "the build failed", info.log_tail)
        return cls(info, http)

    @classmethod
    def get(cls, name: str, *, api_key: Optional[str] = None,
            base_url: Optional[str] = None) -> "Template":
        http = _Http(api_key, base_url, 60.0)
        return cls(TemplateInfo.from_api(http.call("GET", f"/v1/templates/{c.sid(name)}").json()),
                   http)

    @classmethod
    def list(cls, *, api_key: Optional[str] = None,
             base_url: Optional[str] = None) -> List[TemplateInfo]:
        http = _Http(api_key, base_url, 60.0)
        return [TemplateInfo.from_api(t)
                for t in http.call("GET", "/v1/templates").json()["templates"]]

    def delete(self) -> None:
        """Deletes it (``TemplateInUse`` while sandboxes of it have not ended)."""
        self._http.call("DELETE", f"/v1/templates/{c.sid(self.name)}")

    def __repr__(self) -> str:
        return f"Template({self.name!r}, status={self.info.status!r})"


class Database:
    """A managed PostgreSQL database: a restore of the ``postgres`` template (its server already
    running) with a role, database and password of its own, reachable on a host port.

    >>> db = Database.create("shop")
    >>> db.connection_uri            # with the password: shown this once
    'postgresql://shop:...@127.0.0.1:41234/shop'
    """

    def __init__(self, info: DatabaseInfo, http: _Http) -> None:
        self.info = info
        self._http = http

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def connection_uri(self) -> str:
        return self.info.connection_uri

    @classmethod
    def create(cls, name: str, metadata: Optional[Mapping[str, str]] = None, *,
               from_backup: Optional[str] = None, api_key: Optional[str] = None,
               base_url: Optional[str] = None) -> "Database":
        """A new database; ``from_backup`` (a ``bk_...`` id of one of your databases' backups)
        fills it with that backup's tables and rows."""
        http = _Http(api_key, base_url, 900.0)
        body: Dict[str, Any] = {"name": name}
        if metadata:
            body["metadata"] = dict(metadata)
        if from_backup:
            body["from_backup"] = from_backup
        return cls(DatabaseInfo.from_api(http.call("POST", "/v1/databases", json=body).json()),
                   http)

    @classmethod
    def get(cls, database_id: str, *, api_key: Optional[str] = None,
            base_url: Optional[str] = None) -> "Database":
        http = _Http(api_key, base_url, 60.0)
        return cls(DatabaseInfo.from_api(
            http.call("GET", f"/v1/databases/{c.sid(database_id)}").json()), http)

    @classmethod
    def list(cls, *, api_key: Optional[str] = None,
             base_url: Optional[str] = None) -> List[DatabaseInfo]:
        http = _Http(api_key, base_url, 60.0)
        return [DatabaseInfo.from_api(d)
                for d in http.call("GET", "/v1/databases").json()["databases"]]

    def _action(self, what: str) -> DatabaseInfo:
        password = self.info.password
        self.info = DatabaseInfo.from_api(
            self._http.call("POST", f"/v1/databases/{self.id}/{what}", json={}).json())
        if not self.info.password and password:  # the URI as this object knew it
            self.info.password = password
            self.info.connection_uri = self.info.connection_uri.replace(
                f"{self.info.user}@", f"{self.info.user}:{password}@", 1)
        return self.info

    def hibernate(self) -> DatabaseInfo:
        return self._action("hibernate")

    def wake(self) -> DatabaseInfo:
        """Resumes it: the same credentials work, maybe on another host port (see ``info``)."""
        return self._action("wake")

    def rotate_password(self) -> DatabaseInfo:
        """A new password (the old one stops working); ``info.password`` has it, once."""
        self.info.password = ""
        return self._action("rotate-password")

    def backup(self) -> DatabaseBackup:
        """A consistent logical backup (``pg_dump``) of the running database, kept on the host."""
        return DatabaseBackup.from_api(
            self._http.call("POST", f"/v1/databases/{self.id}/backups", json={}).json())

    def backups(self) -> List[DatabaseBackup]:
        return [DatabaseBackup.from_api(b) for b in
                self._http.call("GET", f"/v1/databases/{self.id}/backups").json()["backups"]]

    def delete_backup(self, backup_id: str) -> None:
        self._http.call("DELETE", f"/v1/databases/{self.id}/backups/{c.sid(backup_id)}")

    def logs(self, lines: int = 200) -> str:
        return self._http.call("GET", f"/v1/databases/{self.id}/logs",
                               params={"lines": int(lines)}).json()["log"]

    def delete(self) -> None:
        """Deletes it: its server and its data."""
        self._http.call("DELETE", f"/v1/databases/{self.id}")

    def __repr__(self) -> str:
        return f"Database({self.id!r}, status={self.info.status!r})"
