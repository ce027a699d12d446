"""The asynchronous client: ``AsyncSandbox`` (natively async on httpx.AsyncClient).

Commands run over the streaming endpoint, so cancelling the task that awaits ``exec`` (or leaving
an ``exec_stream`` loop) closes the connection and the server kills the command in the guest.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Union, Sequence, overload

import httpx

from . import _common as c
from ._errors import NotFound, PandaStackError, PayloadTooLarge, SandboxStopped, error_for
from ._models import (ExecEvent, ExecResult, Execution, FileEvent, FileInfo, ProcessInfo, SandboxInfo,
                      SnapshotInfo)


class _AsyncHttp:
    def __init__(self, api_key: Optional[str], base_url: Optional[str], timeout: float) -> None:
        key, url = c.config(api_key, base_url)
        self.timeout = timeout
        self.client = httpx.AsyncClient(base_url=url, headers=c.headers(key),
                                        timeout=httpx.Timeout(timeout, connect=10.0))

    async def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        attempt, waited = 0, 0.0
        while True:
            try:
                r = await self.client.request(method, path, **kw)
            except httpx.TransportError as e:
                raise c.transport_error(e) from e
            wait = c.retry_after(r, attempt, waited)
            if wait is None:
                break
            await asyncio.sleep(wait)  # refused for now (busy): nothing was done
            waited += wait
            attempt += 1
        c.raise_for(r)
        return r

    async def sse(self, method: str, path: str, **kw: Any) -> AsyncIterator[ExecEvent]:
        """The events of a stream; an error event raises its typed error."""
        parser = c.SseParser()
        try:
            async with self.client.stream(method, path, **kw) as r:
                if r.status_code >= 300:
                    await r.aread()
                    c.raise_for(r)
                async for chunk in r.aiter_bytes():
                    for ev in parser.feed_bytes(chunk):
                        if getattr(ev, "kind", None) == "error":
                            raise error_for(ev.error_code or "internal", ev.message or "", 0)
                        yield ev
        except httpx.TransportError as e:
            raise c.transport_error(e) from e


class AsyncFilesystem:
    """Files in the sandbox (``sandbox.filesystem``)."""

    def __init__(self, sbx: "AsyncSandbox") -> None:
        self._s = sbx

    def _path(self, sub: str = "") -> str:
        return f"/v1/sandboxes/{c.sid(self._s.id)}/files{sub}"

    async def write(self, path: str, data: Union[str, bytes], mode: Optional[int] = None) -> None:
        """Writes a whole file (parents are created); ``mode`` e.g. ``0o755``. A file over the
        server's 64 MiB per request goes in parts of 32 MiB."""
        content = data.encode() if isinstance(data, str) else data
        params = {"path": path, **({"mode": format(mode, "o")} if mode is not None else {})}
        if len(content) <= c.FILE_LIMIT:
            await self._s._http.call("PUT", self._path(), params=params, content=content)
            return
        view = memoryview(content)
        for off in range(0, len(content), c.FILE_PART):
            await self._s._http.call("PUT", self._path(),
                                     params={**params, "offset": str(off)} if off else params,
                                     content=bytes(view[off:off + c.FILE_PART]))

    async def read(self, path: str) -> bytes:
        """Reads a whole file (one over 64 MiB in parts of 32 MiB)."""
        try:
            return (await self._s._http.call("GET", self._path(), params={"path": path})).content
        except PayloadTooLarge:
            size = (await self.stat(path)).size
            parts = []
            for off in range(0, size, c.FILE_PART):
                parts.append((await self._s._http.call("GET", self._path(), params={
                    "path": path, "offset": str(off), "length": str(c.FILE_PART)})).content)
            return b"".join(parts)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """Reads a whole file as text."""
        return (await self.read(path)).decode(encoding)

    async def list(self, path: str) -> List[FileInfo]:
        """The entries of a folder."""
        r = await self._s._http.call("GET", self._path("/list"), params={"path": path})
        return [FileInfo.from_api(e) for e in r.json()["entries"]]

    async def stat(self, path: str) -> FileInfo:
        """One path's type, size, mode and modification time."""
        r = await self._s._http.call("GET", self._path("/stat"), params={"path": path})
        return FileInfo.from_api(r.json())

    async def remove(self, path: str, recursive: bool = False) -> None:
        """Removes a file, or a folder (with ``recursive=True`` when not empty)."""
        params = {"path": path, **({"recursive": "1"} if recursive else {})}
        await self._s._http.call("DELETE", self._path(), params=params)

    async def mkdir(self, path: str, parents: bool = True) -> None:
        """Makes a folder."""
        await self._s._http.call("POST", self._path("/mkdir"),
                                 json={"path": path, "parents": parents})

    async def rename(self, src: str, dst: str) -> None:
        """Renames (moves) a path."""
        await self._s._http.call("POST", self._path("/rename"), json={"from": src, "to": dst})

    async def watch(self, path: str, recursive: bool = False) -> AsyncFileWatch:
        """Watches the folder ``path`` (with ``recursive``, its subfolders too, those made later
        included). Returns once the watch is in place, so every later change is reported:
        ``async for`` the result for FileEvents; it ends when the folder goes, or after
        ``close()`` (or at the end of its ``async with`` block)."""
        params = {"path": path, **({"recursive": "1"} if recursive else {})}
        return await AsyncFileWatch(self._s._http.sse("GET", self._path("/watch"),
                                                      params=params))._start()


class AsyncFileWatch:
    """A folder watch in place (``AsyncFilesystem.watch``): ``async for`` it for FileEvents."""

    def __init__(self, events: AsyncIterator[Any]) -> None:
        self._events = events
        self._closed = asyncio.Event()

    async def _start(self) -> "AsyncFileWatch":
        first = await self._events.__anext__()  # "ready"; a refused watch raises its error here
        if getattr(first, "kind", None) != "ready":
            raise PandaStackError("the watch ended before it started", "internal")
        return self

    async def __aiter__(self) -> AsyncIterator[FileEvent]:
        # Each next event raced against close(): another task's close ends this iteration.
        while not self._closed.is_set():
            nxt = asyncio.ensure_future(self._events.__anext__())
            stop = asyncio.ensure_future(self._closed.wait())
            done, _ = await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
            if nxt not in done:
                nxt.cancel()
                try:
                    await nxt
                except BaseException:  # noqa: BLE001 (the stream is being ended)
                    pass
                return
            stop.cancel()
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                return
            if isinstance(ev, FileEvent):
                yield ev

    async def close(self) -> None:
        """Stops watching (closes the stream). Safe from another task: an ``async for`` waiting
        for the next event there ends."""
        self._closed.set()
        try:
            await self._events.aclose()  # type: ignore[attr-defined]
        except RuntimeError:
            pass  # its next event is being awaited by another task, which now ends it

    async def __aenter__(self) -> "AsyncFileWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncProcesses:
    """Background processes (``sandbox.process``)."""

    def __init__(self, sbx: "AsyncSandbox") -> None:
        self._s = sbx

    async def start(self, cmd: c.Command, env: Optional[Mapping[str, str]] = None,
                    cwd: Optional[str] = None, timeout_seconds: Optional[int] = None) -> int:
        """Starts a command in the background; returns its pid."""
        body = c.exec_body(cmd, timeout_seconds, env, cwd, None)
        r = await self._s._http.call("POST", f"/v1/sandboxes/{c.sid(self._s.id)}/processes", json=body)
        return int(r.json()["pid"])

    async def list(self) -> List[ProcessInfo]:
        """Running and recently exited background processes."""
        r = await self._s._http.call("GET", f"/v1/sandboxes/{c.sid(self._s.id)}/processes")
        return [ProcessInfo.from_api(p) for p in r.json()["processes"]]

    async def kill(self, pid: int, signal: Optional[int] = None) -> None:
        """Signals the process's group (default SIGKILL; signals are 1..64)."""
        params = {"signal": str(signal)} if signal is not None else None
        await self._s._http.call("DELETE", f"/v1/sandboxes/{c.sid(self._s.id)}/processes/{pid}",
                                 params=params)

    def stream(self, pid: int) -> AsyncIterator[ExecEvent]:
        """Its output from the start, then live, then the exit event."""
        return self._s._http.sse("GET", f"/v1/sandboxes/{c.sid(self._s.id)}/processes/{pid}/stream")


class AsyncSandbox:
    """A PandaStack sandbox, async.

    >>> async with await AsyncSandbox.create() as sbx:
    ...     print((await sbx.exec("echo hello")).stdout)
    """

    def __init__(self, info: SandboxInfo, http: _AsyncHttp) -> None:
        self.info = info
        self._http = http
        self.filesystem = AsyncFilesystem(self)
        self.files = self.filesystem
        self.process = AsyncProcesses(self)

    @classmethod
    async def create(cls, template: str = "base", ttl_seconds: Optional[int] = None,
                     metadata: Optional[Mapping[str, str]] = None, persistent: bool = False,
                     auto_wake: bool = False, from_snapshot: Optional[str] = None, *,
                     network: Optional[bool] = None, egress: Optional[str] = None,
                     allow: Optional[Sequence[str]] = None,
                     idle_timeout_seconds: Optional[int] = None,
                     on_timeout: Optional[str] = None,
                     volumes: Optional[Sequence[Any]] = None,
                     memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
                     secrets: Optional[Sequence[str]] = None,
                     api_key: Optional[str] = None, base_url: Optional[str] = None,
                     timeout: float = 300.0) -> "AsyncSandbox":
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
        http = _AsyncHttp(api_key, base_url, timeout)
        body = c.create_body(template, ttl_seconds, metadata, persistent, auto_wake, from_snapshot,
                             network, egress, allow, idle_timeout_seconds, on_timeout,
                             volumes, memory_mib, vcpus, secrets)
        r = await http.call("POST", "/v1/sandboxes", json=body)
        return cls(SandboxInfo.from_api(r.json()), http)

    @classmethod
    async def get(cls, sandbox_id: str, *, api_key: Optional[str] = None,
                  base_url: Optional[str] = None, timeout: float = 300.0) -> "AsyncSandbox":
        """An existing sandbox of this key's tenant."""
        http = _AsyncHttp(api_key, base_url, timeout)
        r = await http.call("GET", f"/v1/sandboxes/{c.sid(sandbox_id)}")
        return cls(SandboxInfo.from_api(r.json()), http)

    @classmethod
    async def list(cls, state: Optional[str] = None, metadata: Optional[Mapping[str, str]] = None,
                   *, api_key: Optional[str] = None,
                   base_url: Optional[str] = None) -> List[SandboxInfo]:
        """This tenant's sandboxes, filtered by state and metadata entries."""
        http = _AsyncHttp(api_key, base_url, 60.0)
        try:
            r = await http.call("GET", "/v1/sandboxes", params=c.list_params(state, metadata))
            return [SandboxInfo.from_api(s) for s in r.json()["sandboxes"]]
        finally:
            await http.client.aclose()

    @classmethod
    async def list_snapshots(cls, *, api_key: Optional[str] = None,
                             base_url: Optional[str] = None) -> List[SnapshotInfo]:
        """This tenant's snapshots, oldest first."""
        http = _AsyncHttp(api_key, base_url, 60.0)
        try:
            r = await http.call("GET", "/v1/snapshots")
            return [SnapshotInfo.from_api(s) for s in r.json()["snapshots"]]
        finally:
            await http.client.aclose()

    @classmethod
    async def delete_snapshot(cls, snapshot_id: str, *, api_key: Optional[str] = None,
                              base_url: Optional[str] = None) -> None:
        """Deletes one of this tenant's snapshots (``snapshot()``): creates from it are refused
        afterwards (``NotFound``); sandboxes created from it keep running."""
        http = _AsyncHttp(api_key, base_url, 60.0)
        try:
            await http.call("DELETE", f"/v1/snapshots/{snapshot_id}")
        finally:
            await http.client.aclose()

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def state(self) -> str:
        return self.info.state

    async def refresh(self) -> SandboxInfo:
        """Reads the sandbox's current info."""
        r = await self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}")
        self.info = SandboxInfo.from_api(r.json())
        return self.info

    async def _post(self, action: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        return (await self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/{action}",
                                      json=body)).json()

    async def kill(self) -> None:
        """Stops the sandbox and releases everything it holds."""
        r = await self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}")
        self.info = SandboxInfo.from_api(r.json())

    async def hibernate(self, memory: bool = True) -> None:
        """Saves the sandbox and stops its VM; ``wake()`` brings it back. ``memory=False`` keeps
        only its disk: the wake boots the guest afresh on it (files stay, processes do not)."""
        self.info = SandboxInfo.from_api(
            await self._post("hibernate", None if memory else {"memory": False}))

    async def wake(self) -> None:
        """Restores a hibernated sandbox."""
        self.info = SandboxInfo.from_api(await self._post("wake"))

    async def snapshot(self, name: Optional[str] = None) -> str:
        """Snapshots the running sandbox; returns the snapshot id (``name``: it then stands for
        this newest snapshot taken with it)."""
        return str((await self._post("snapshots", {"name": name} if name else None))["snapshot_id"])

    @overload
    async def fork(self, *, inherit_secrets: bool = False) -> "AsyncSandbox": ...

    @overload
    async def fork(self, count: int, *,
                   inherit_secrets: bool = False) -> List["AsyncSandbox"]: ...

    async def fork(self, count: Optional[int] = None, *,
                   inherit_secrets: bool = False) -> Union["AsyncSandbox", List["AsyncSandbox"]]:
        """A copy of the running sandbox; it keeps running. ``fork()`` returns one
        ``AsyncSandbox``; ``fork(count=N)`` returns a list of N (1..16). ``inherit_secrets``: the
        children's requests carry this sandbox's secrets too."""
        body: Dict[str, Any] = {"count": 1 if count is None else count}
        if inherit_secrets:
            body["inherit_secrets"] = True
        kids = (await self._post("fork", body))["sandboxes"]
        forks = [AsyncSandbox(SandboxInfo.from_api(k), self._http) for k in kids]
        return forks[0] if count is None else forks

    async def set_egress(self, mode: Optional[str] = None,
                         allow: Optional[Sequence[str]] = None) -> None:
        """Replaces the egress policy (``deny_all``, ``allow_all``, or an allowlist of CIDRs)."""
        r = await self._http.call("PATCH", f"/v1/sandboxes/{c.sid(self.id)}",
                                  json={"egress": c.egress_body(mode, allow)})
        self.info = SandboxInfo.from_api(r.json())

    async def expose_port(self, port: int) -> Dict[str, Any]:
        """Forwards guest TCP ``port`` from the host; returns ``{port, host, host_port, address}``."""
        r = await self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/ports", json={"port": port})
        return dict(r.json())

    async def unexpose_port(self, port: int) -> None:
        """Stops forwarding guest ``port``."""
        await self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}/ports/{int(port)}")

    async def ports(self) -> List[Dict[str, Any]]:
        """Exposed guest ports and their host addresses (``host_port`` None while not running)."""
        return list((await self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/ports")).json()["ports"])

    async def metrics(self, from_ms: Optional[int] = None,
                      to_ms: Optional[int] = None) -> List[Dict[str, Any]]:
        """The sandbox's CPU, memory and disk use over time (see ``Sandbox.metrics``)."""
        q = "&".join(f"{k}={int(v)}" for k, v in (("from_ms", from_ms), ("to_ms", to_ms)) if v is not None)
        r = await self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/metrics" + (f"?{q}" if q else ""))
        return list(r.json()["metrics"])

    async def egress_log(self, after: int = 0, limit: int = 100, kind: Optional[str] = None,
                         verdict: Optional[str] = None) -> Dict[str, Any]:
        """The sandbox's egress log (see ``Sandbox.egress_log``)."""
        r = await self._http.call(
            "GET", f"/v1/sandboxes/{c.sid(self.id)}/egress?" + c.egress_query(after, limit, kind, verdict))
        return dict(r.json())

    async def preview(self, port: int, ttl_seconds: Optional[int] = None,
                      public: bool = False) -> Dict[str, Any]:
        """Serves guest ``port`` at a preview URL (see ``Sandbox.preview``)."""
        body: Dict[str, Any] = {"port": port, "public": public}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        r = await self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/previews", json=body)
        return dict(r.json())

    async def previews(self) -> List[Dict[str, Any]]:
        """The sandbox's preview URLs."""
        r = await self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/previews")
        return list(r.json()["previews"])

    async def close_preview(self, port: int) -> None:
        """Revokes the preview URL of ``port``."""
        await self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}/previews/{int(port)}")

    async def set_ttl(self, ttl_seconds: int) -> None:
        """Sets the time to live from now."""
        r = await self._http.call("PATCH", f"/v1/sandboxes/{c.sid(self.id)}",
                                  json={"ttl_seconds": ttl_seconds})
        self.info = SandboxInfo.from_api(r.json())

    async def events(self) -> List[Dict[str, Any]]:
        """The sandbox's audit events, oldest first."""
        return list((await self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/events")).json()["events"])

    def exec_stream(self, cmd: c.Command, timeout_seconds: Optional[int] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    stdin: Union[str, bytes, None] = None) -> AsyncIterator[ExecEvent]:
        """Runs a command; yields stdout/stderr events as they come, then the exit event."""
        body = c.exec_body(cmd, timeout_seconds, env, cwd, stdin)
        return self._http.sse("POST", f"/v1/sandboxes/{c.sid(self.id)}/exec/stream", json=body,
                              timeout=c.exec_timeout(timeout_seconds, self._http.timeout))

    async def exec(self, cmd: c.Command, timeout_seconds: Optional[int] = None,
                   env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                   stdin: Union[str, bytes, None] = None) -> ExecResult:
        """Runs a command to completion. Cancelling the awaiting task kills it in the guest.
        Output is kept like the sync client's: 16 MiB per stream, then ``*_truncated``."""
        cap = c.OutputCap()
        async for ev in self.exec_stream(cmd, timeout_seconds, env, cwd, stdin):
            if ev.kind in ("stdout", "stderr"):
                cap.add(ev.kind, ev.data)
            elif ev.kind == "exit":
                return ExecResult(bytes(cap.out), bytes(cap.err), ev.exit_code or 0, ev.timed_out,
                                  ev.duration_ms, cap.out_truncated, cap.err_truncated)
        raise PandaStackError("the command's stream ended without an exit event", code="internal")

    # -- code interpreter -------------------------------------------------------------------------

    async def run_code(self, code: str, context: Optional[str] = None,
                 env: Optional[Mapping[str, str]] = None,
                 timeout_seconds: Optional[int] = None) -> Execution:
        """Runs Python in a context that keeps its variables between runs ("default" unless
        ``context`` names one from ``create_code_context``). The last expression's value is the
        main result (``.text``); an exception is ``.error`` (not raised); a run past its timeout is
        interrupted (``.timed_out``) and the context keeps its state."""
        body = c.code_body(code, context, env, timeout_seconds)
        r = await self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/code", json=body,
                            timeout=c.exec_timeout(timeout_seconds, self._http.timeout))
        return Execution.from_api(r.json())

    async def create_code_context(self, cwd: Optional[str] = None) -> str:
        """A new context (its own variables; ``cwd`` its working folder): its id."""
        body = {"cwd": cwd} if cwd else {}
        r = await self._http.call("POST", f"/v1/sandboxes/{c.sid(self.id)}/code/contexts", json=body)
        return str(r.json()["id"])

    async def code_contexts(self) -> List[str]:
        """The ids of the contexts running in the sandbox."""
        r = await self._http.call("GET", f"/v1/sandboxes/{c.sid(self.id)}/code/contexts")
        return [x["id"] for x in r.json()["contexts"]]

    async def delete_code_context(self, context: str) -> None:
        """Ends a context; its variables go."""
        await self._http.call("DELETE", f"/v1/sandboxes/{c.sid(self.id)}/code/contexts/{context}")

    async def aclose(self) -> None:
        """Closes the HTTP client (the sandbox keeps running)."""
        await self._http.client.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.kill()
        except (SandboxStopped, NotFound):
            pass
        except PandaStackError:
            pass
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, state={self.state!r})"
