"""Sandbox tools for LLM agents: one object that owns a sandbox and hands a model its tools.

    from pandastack.tools import Toolkit
    with Toolkit() as kit:
        tools = kit.anthropic()          # or kit.openai(), kit.langchain()
        ...                              # the model answers with a tool call
        text = kit.call(name, arguments) # a string for the model, never an exception

Each tool's answer is deterministic text: the exit status (or the error) first, then the output,
each stream cut to ``max_output_chars`` (its head and tail kept, what was cut counted). A
command's own failure is a result, not an exception; so is a sandbox in trouble (``error=CODE``).
Images the code interpreter makes come back in each framework's own image shape
(``call_anthropic``); ``call`` counts them in its text.

The sandbox is made at the first call (``per_call=True``: one per call, killed after it) with the
options given (template, TTL, network, egress allowlist, volumes, metadata) and killed by
``close()``. ``AsyncToolkit`` is the same for asyncio.
"""
from __future__ import annotations

import asyncio
import base64
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._async import AsyncSandbox
from ._errors import PandaStackError
from ._models import Execution, ExecResult, FileInfo
from ._sync import Sandbox

__all__ = ["Toolkit", "AsyncToolkit", "ToolResult", "TOOL_NAMES"]

#: Every tool a toolkit can offer, in the order offered.
TOOL_NAMES = ("run_python", "run_command", "read_file", "write_file", "list_files")

_STR = {"type": "string"}
_OPT_INT = {"type": ["integer", "null"]}

# Strict schemas: every property required (OpenAI's strict mode), optional ones nullable.
_SPECS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "run_python": (
        "Run Python code in a persistent interpreter inside an isolated Linux sandbox. Variables, "
        "imports and the working folder persist between calls. The value of the last expression "
        "is returned, with stdout, stderr and any exception's traceback; matplotlib figures come "
        "back as images. Use it for calculations, data analysis and plots.",
        {"code": {**_STR, "description": "Python source to run"},
         "timeout_seconds": {**_OPT_INT, "description": "Stop the run after this many seconds "
                             "(null: the toolkit's default)"}}),
    "run_command": (
        "Run a shell command (bash -c) in an isolated Linux sandbox (Debian, as root, no "
        "network unless configured). Returns the exit code first, then stdout and stderr, "
        "long output cut in the middle. Files persist between calls.",
        {"command": {**_STR, "description": "The shell command line"},
         "timeout_seconds": {**_OPT_INT, "description": "Kill it after this many seconds "
                             "(null: the toolkit's default)"}}),
    "read_file": (
        "Read a text file from the sandbox. Returns its contents (long files cut in the middle).",
        {"path": {**_STR, "description": "Absolute path of the file"}}),
    "write_file": (
        "Write a text file in the sandbox (parent folders are made; an existing file is "
        "replaced).",
        {"path": {**_STR, "description": "Absolute path of the file"},
         "content": {**_STR, "description": "The whole new contents"}}),
    "list_files": (
        "List a folder in the sandbox: one entry per line, folders ending in '/', with sizes.",
        {"path": {**_STR, "description": "Absolute path of the folder"}}),
}


def _schema(props: Dict[str, Any]) -> Dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


@dataclass
class ToolResult:
    """What a tool call produced: ``text`` for the model, and the images it made (PNG bytes)."""

    text: str
    images: List[bytes] = field(default_factory=list)
    is_error: bool = False


def _clip(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: its head and tail, and how much was left out."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return (text[:head] + f"\n[... {len(text) - limit} characters omitted ...]\n"
            + (text[-tail:] if tail else ""))


def _check_args(name: str, args: Any) -> Union[Dict[str, Any], str]:
    """The arguments as a dict, or why they do not fit the tool's schema (for the model)."""
    if isinstance(args, (str, bytes)):
        try:
            args = json.loads(args or "{}")
        except ValueError as e:
            return f"arguments are not JSON: {e}"
    if args is None:
        args = {}
    if not isinstance(args, Mapping):
        return "arguments must be a JSON object"
    props = _SPECS[name][1]
    extra = sorted(set(args) - set(props))
    if extra:
        return f"unknown argument(s): {', '.join(extra)}"
    out: Dict[str, Any] = {}
    for key, spec in props.items():
        v = args.get(key)  # a nullable argument left out is null
        if spec["type"] == "string":
            if not isinstance(v, str):
                return f"argument '{key}' must be a string"
        elif v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            return f"argument '{key}' must be a positive integer or null"
        out[key] = v
    return out


def _exec_text(r: ExecResult, limit: int) -> str:
    head = f"exit_code={r.exit_code}" + (" (timed out)" if r.timed_out else "")
    return f"{head}\nstdout:\n{_clip(r.stdout, limit)}\nstderr:\n{_clip(r.stderr, limit)}"


def _code_result(e: Execution, limit: int) -> ToolResult:
    lines = []
    if e.timed_out:
        lines.append("status=timed_out")
    elif e.error:
        lines.append(f"status=error {e.error.name}: {e.error.value}")
    else:
        lines.append("status=ok")
    images = [r.png for r in e.results if r.png]
    if e.text is not None:
        lines.append("result:\n" + _clip(e.text, limit))
    if e.stdout:
        lines.append("stdout:\n" + _clip(e.stdout, limit))
    if e.stderr:
        lines.append("stderr:\n" + _clip(e.stderr, limit))
    if e.error and e.error.traceback:
        lines.append("traceback:\n" + _clip(e.error.traceback, limit))
    if images:
        lines.append(f"images: {len(images)} (PNG)")
    return ToolResult("\n".join(lines), images, is_error=bool(e.error) or e.timed_out)


def _list_text(entries: Sequence[FileInfo], limit: int) -> str:
    rows = sorted(entries, key=lambda f: f.name)
    text = "\n".join((f.name + "/") if f.is_dir else f"{f.name} ({f.size} bytes)" for f in rows)
    return _clip(text or "(empty)", limit)


def _read_text(data: bytes, limit: int) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"(binary file: {len(data)} bytes, not shown)"
    return _clip(text, limit)


def _error(e: PandaStackError) -> ToolResult:
    return ToolResult(f"error={e.code}: {e.message}", is_error=True)


class _Base:
    def __init__(self, *, template: str = "base", tools: Sequence[str] = TOOL_NAMES,
                 per_call: bool = False, ttl_seconds: Optional[int] = 3600,
                 timeout_seconds: int = 60, max_output_chars: int = 4000,
                 network: Optional[bool] = None, allow: Optional[Sequence[str]] = None,
                 volumes: Optional[Sequence[Any]] = None,
                 metadata: Optional[Mapping[str, str]] = None,
                 api_key: Optional[str] = None, base_url: Optional[str] = None) -> None:
        unknown = [t for t in tools if t not in _SPECS]
        if unknown:
            raise ValueError(f"unknown tool(s) {unknown}; there are {list(TOOL_NAMES)}")
        if max_output_chars < 100:
            raise ValueError("max_output_chars must be at least 100")
        self.tools = [t for t in TOOL_NAMES if t in tools]
        self.per_call = per_call
        self.timeout_seconds = timeout_seconds
        self.max_output_chars = max_output_chars
        self._create: Dict[str, Any] = dict(
            template=template, ttl_seconds=ttl_seconds, network=network, allow=allow,
            volumes=volumes, metadata=dict(metadata or {"pandastack.toolkit": "1"}),
            api_key=api_key, base_url=base_url)

    # -- schemas ----------------------------------------------------------------------------

    def anthropic(self) -> List[Dict[str, Any]]:
        """The tools for Anthropic's Messages API: ``[{name, description, input_schema}]``."""
        return [{"name": n, "description": _SPECS[n][0], "input_schema": _schema(_SPECS[n][1])}
                for n in self.tools]

    def openai(self) -> List[Dict[str, Any]]:
        """The tools for OpenAI's Chat Completions API (strict function schemas)."""
        return [{"type": "function",
                 "function": {"name": n, "description": _SPECS[n][0],
                              "parameters": _schema(_SPECS[n][1]), "strict": True}}
                for n in self.tools]

    def _check(self, name: str, arguments: Any) -> Union[Tuple[str, Dict[str, Any]], ToolResult]:
        if name not in self.tools:
            return ToolResult(f"error=unknown_tool: no tool '{name}' (there are "
                              f"{', '.join(self.tools)})", is_error=True)
        args = _check_args(name, arguments)
        if isinstance(args, str):
            return ToolResult(f"error=invalid_arguments: {args}", is_error=True)
        return name, args

    def _timeout(self, args: Dict[str, Any]) -> int:
        return args.get("timeout_seconds") or self.timeout_seconds

    @staticmethod
    def _anthropic_block(block: Any, result: ToolResult) -> Dict[str, Any]:
        content: List[Dict[str, Any]] = [{"type": "text", "text": result.text}]
        for png in result.images:
            content.append({"type": "image", "source": {
                "type": "base64", "media_type": "image/png",
                "data": base64.b64encode(png).decode()}})
        out = {"type": "tool_result", "tool_use_id": _field(block, "id"), "content": content}
        if result.is_error:
            out["is_error"] = True
        return out


def _field(obj: Any, key: str) -> Any:
    return obj[key] if isinstance(obj, Mapping) else getattr(obj, key)


def _tool_uses(content: Any) -> List[Any]:
    return [b for b in (content or []) if _field(b, "type") == "tool_use"]


class Toolkit(_Base):
    """Sandbox tools for a model, synchronous. See the module's docstring."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._sbx: Optional[Sandbox] = None
        self._lock = threading.Lock()  # calls from several threads make one sandbox

    @property
    def sandbox(self) -> Sandbox:
        """The session's sandbox (made on first use)."""
        with self._lock:
            if self._sbx is None:
                self._sbx = Sandbox.create(**self._create)
            return self._sbx

    def run(self, name: str, arguments: Any = None) -> ToolResult:
        """Runs tool ``name`` with ``arguments`` (a dict or its JSON text)."""
        checked = self._check(name, arguments)
        if isinstance(checked, ToolResult):
            return checked
        sbx = Sandbox.create(**self._create) if self.per_call else None
        try:
            return self._run(sbx or self.sandbox, *checked)
        except PandaStackError as e:
            return _error(e)
        finally:
            if sbx is not None:
                sbx.__exit__(None, None, None)  # killed, its connections closed

    def _run(self, sbx: Sandbox, name: str, a: Dict[str, Any]) -> ToolResult:
        limit = self.max_output_chars
        if name == "run_python":
            return _code_result(sbx.run_code(a["code"], timeout_seconds=self._timeout(a)), limit)
        if name == "run_command":
            r = sbx.exec(["bash", "-c", a["command"]], timeout_seconds=self._timeout(a))
            return ToolResult(_exec_text(r, limit), is_error=r.exit_code != 0)
        if name == "read_file":
            return ToolResult(_read_text(sbx.files.read(a["path"]), limit))
        if name == "write_file":
            sbx.files.write(a["path"], a["content"])
            return ToolResult(f"wrote {len(a['content'].encode())} bytes to {a['path']}")
        return ToolResult(_list_text(sbx.files.list(a["path"]), limit))

    def call(self, name: str, arguments: Any = None) -> str:
        """Runs a tool; its text for the model (never raises for the command's own failure)."""
        return self.run(name, arguments).text

    def call_anthropic(self, content: Any) -> List[Dict[str, Any]]:
        """Runs every ``tool_use`` block of an assistant message's ``content`` (dicts or the
        ``anthropic`` SDK's objects); the ``tool_result`` blocks for the next user message, with
        images as Anthropic image blocks."""
        return [self._anthropic_block(b, self.run(_field(b, "name"), _field(b, "input")))
                for b in _tool_uses(content)]

    def call_openai(self, tool_calls: Any) -> List[Dict[str, Any]]:
        """Runs an assistant message's ``tool_calls`` (Chat Completions); the ``tool`` messages."""
        out = []
        for tc in tool_calls or []:
            fn = _field(tc, "function")
            out.append({"role": "tool", "tool_call_id": _field(tc, "id"),
                        "content": self.call(_field(fn, "name"), _field(fn, "arguments"))})
        return out

    def langchain(self) -> List[Any]:
        """The tools as LangChain ``StructuredTool``s (needs ``langchain-core``)."""
        try:
            from langchain_core.tools import StructuredTool  # type: ignore
        except ImportError as e:  # pragma: no cover - depends on the user's environment
            raise ImportError("Toolkit.langchain() needs langchain-core installed") from e
        return [StructuredTool.from_function(
            func=(lambda n: lambda **kw: self.call(n, kw))(n), name=n, description=_SPECS[n][0],
            args_schema=_schema(_SPECS[n][1])) for n in self.tools]

    def close(self) -> None:
        """Kills the session's sandbox (if one was made)."""
        sbx, self._sbx = self._sbx, None
        if sbx is not None:
            sbx.__exit__(None, None, None)  # killed, its connections closed

    def __enter__(self) -> "Toolkit":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncToolkit(_Base):
    """Sandbox tools for a model, for asyncio: ``await kit.call(name, args)``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._sbx: Optional[AsyncSandbox] = None
        self._lock: Optional[asyncio.Lock] = None  # concurrent calls make one sandbox

    async def sandbox(self) -> AsyncSandbox:
        """The session's sandbox (made on first use)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._sbx is None:
                self._sbx = await AsyncSandbox.create(**self._create)
            return self._sbx

    async def run(self, name: str, arguments: Any = None) -> ToolResult:
        checked = self._check(name, arguments)
        if isinstance(checked, ToolResult):
            return checked
        sbx = await AsyncSandbox.create(**self._create) if self.per_call else None
        try:
            return await self._run(sbx or await self.sandbox(), *checked)
        except PandaStackError as e:
            return _error(e)
        finally:
            if sbx is not None:
                await sbx.__aexit__(None, None, None)  # killed, its connections closed

    async def _run(self, sbx: AsyncSandbox, name: str, a: Dict[str, Any]) -> ToolResult:
        limit = self.max_output_chars
        if name == "run_python":
            return _code_result(await sbx.run_code(a["code"], timeout_seconds=self._timeout(a)),
                                limit)
        if name == "run_command":
            r = await sbx.exec(["bash", "-c", a["command"]], timeout_seconds=self._timeout(a))
            return ToolResult(_exec_text(r, limit), is_error=r.exit_code != 0)
        if name == "read_file":
            return ToolResult(_read_text(await sbx.files.read(a["path"]), limit))
        if name == "write_file":
            await sbx.files.write(a["path"], a["content"])
            return ToolResult(f"wrote {len(a['content'].encode())} bytes to {a['path']}")
        return ToolResult(_list_text(await sbx.files.list(a["path"]), limit))

    async def call(self, name: str, arguments: Any = None) -> str:
        return (await self.run(name, arguments)).text

    async def call_anthropic(self, content: Any) -> List[Dict[str, Any]]:
        return [self._anthropic_block(b, await self.run(_field(b, "name"), _field(b, "input")))
                for b in _tool_uses(content)]

    async def call_openai(self, tool_calls: Any) -> List[Dict[str, Any]]:
        out = []
        for tc in tool_calls or []:
            fn = _field(tc, "function")
            out.append({"role": "tool", "tool_call_id": _field(tc, "id"),
                        "content": await self.call(_field(fn, "name"), _field(fn, "arguments"))})
        return out

    async def close(self) -> None:
        sbx, self._sbx = self._sbx, None
        if sbx is not None:
            await sbx.__aexit__(None, None, None)  # killed, its connections closed

    async def __aenter__(self) -> "AsyncToolkit":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

