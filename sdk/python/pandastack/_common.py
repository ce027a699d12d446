"""What the sync and async clients share: configuration, request bodies, response handling."""
from __future__ import annotations

import base64
import json
import os
import random
import urllib.parse
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from ._errors import ConnectionFailed, PandaStackError, Timeout, Unauthorized, error_for
from ._models import ExecEvent, event_from_sse

# What the API buffers of a non-streamed command's output, per stream (the async client, which
# runs commands over the stream, keeps the same cap).
MAX_OUTPUT = 16 << 20
# The server's file limit per request; larger files go in parts of FILE_PART bytes (?offset=).
FILE_LIMIT = 64 << 20
FILE_PART = 32 << 20
# The server's default command timeout (exec without timeout_seconds).
DEFAULT_EXEC_TIMEOUT = 60
# Retries of requests the server refused for now (429 busy, 503) before giving up.
RETRIES = 3
# How long a command waits, retrying, while its sandbox runs its most commands at once.
EXEC_QUEUE_SECONDS = 120.0

DEFAULT_BASE_URL = "http://127.0.0.1:7070"
Command = Union[str, Sequence[str]]


def config(api_key: Optional[str], base_url: Optional[str]) -> Tuple[str, str]:
    """The key and base URL: arguments first, then PANDASTACK_API_KEY / PANDASTACK_BASE_URL."""
    key = api_key or os.environ.get("PANDASTACK_API_KEY", "")
    if not key:
        raise Unauthorized("no API key: pass api_key= or set PANDASTACK_API_KEY",
                           code="unauthorized")
    url = (base_url or os.environ.get("PANDASTACK_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
    return key, url


def headers(key: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {key}", "User-Agent": "pandastack-python/0.2"}


def code_body(code: str, context: Optional[str], env: Optional[Mapping[str, str]],
              timeout_seconds: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"code": code}
    if context:
        body["context"] = context
    if env:
        body["env"] = dict(env)
    if timeout_seconds is not None:
        body["timeout_seconds"] = int(timeout_seconds)
    return body


def exec_body(cmd: Command, timeout_seconds: Optional[int], env: Optional[Mapping[str, str]],
              cwd: Optional[str], stdin: Union[str, bytes, None]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"cmd": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
    if timeout_seconds is not None:
        body["timeout_seconds"] = int(timeout_seconds)
    if env:
        body["env"] = dict(env)
    if cwd:
        body["cwd"] = cwd
    if stdin is not None:
        if isinstance(stdin, (bytes, bytearray)):
            try:
                body["stdin"] = bytes(stdin).decode("utf-8")
            except UnicodeDecodeError:  # binary: sent as base64
                body["stdin"] = base64.b64encode(bytes(stdin)).decode()
                body["stdin_encoding"] = "base64"
        else:
            body["stdin"] = stdin
    return body


def exec_timeout(timeout_seconds: Optional[float], base: float) -> httpx.Timeout:
    """The HTTP timeout for a command: the command's own timeout plus a margin (the server answers
    by then, whatever the guest does), never less than the client's default."""
    t = float(timeout_seconds if timeout_seconds is not None else DEFAULT_EXEC_TIMEOUT) + 30.0
    return httpx.Timeout(max(t, base), connect=10.0)


def sid(sandbox_id: str) -> str:
    """A sandbox id for a URL path: never empty, escaped."""
    if not isinstance(sandbox_id, str) or not sandbox_id:
        raise ValueError("a sandbox id is a non-empty string (sbx_...)")
    return urllib.parse.quote(sandbox_id, safe="")


def retry_after(response: httpx.Response, attempt: int, waited: float = 0.0) -> Optional[float]:
    """Seconds to wait before retrying a refused request, or None to give up. `waited`: seconds
    spent waiting on this request so far."""
    # Only what the server says to retry (Retry-After): a quota refusal stands until use drops.
    if response.status_code not in (429, 503) or "Retry-After" not in response.headers:
        return None
    # A sandbox running its most commands at once: a burst of calls queues here (jittered, so
    # they go in as its commands end) for up to EXEC_QUEUE_SECONDS rather than failing.
    if response.status_code == 429 and waited < EXEC_QUEUE_SECONDS:
        try:
            busy = response.json().get("error", {}).get("code") == "too_many_execs"
        except ValueError:
            busy = False
        if busy:
            return random.uniform(0.1, 0.6)
    if attempt >= RETRIES:
        return None
    try:
        return min(float(response.headers.get("Retry-After", "1")), 5.0)
    except ValueError:
        return 1.0


def egress_body(mode: Optional[str], allow: Optional[Sequence[str]]) -> Dict[str, Any]:
    """{"mode", "cidrs"}: an allowlist when CIDRs are given and no mode is named."""
    cidrs = list(allow or [])
    return {"mode": mode or ("allowlist" if cidrs else "deny_all"), "cidrs": cidrs}


def volume_body(v: Any) -> Dict[str, Any]:
    """A volume to attach: {"volume": id or Volume, "mount": path, "read_only": bool}, or a
    (volume, mount) / (volume, mount, read_only) tuple."""
    if isinstance(v, Mapping):
        d = dict(v)
    else:
        t = tuple(v)
        d = {"volume": t[0], "mount": t[1]}
        if len(t) > 2:
            d["read_only"] = bool(t[2])
    vol = d.get("volume")
    if not isinstance(vol, str) and hasattr(vol, "id"):
        d["volume"] = vol.id
    return d


def create_body(template: str, ttl_seconds: Optional[int], metadata: Optional[Mapping[str, str]],
                persistent: bool, auto_wake: bool, from_snapshot: Optional[str],
                network: Optional[bool] = None, egress: Optional[str] = None,
                allow: Optional[Sequence[str]] = None, idle_timeout_seconds: Optional[int] = None,
                on_timeout: Optional[str] = None,
                volumes: Optional[Sequence[Any]] = None, memory_mib: Optional[int] = None,
                vcpus: Optional[int] = None,
                secrets: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"template": template, "persistent": persistent,
                            "auto_wake": auto_wake}
    if secrets:
        body["secrets"] = list(secrets)
    if memory_mib is not None:
        body["memory_mib"] = int(memory_mib)
    if vcpus is not None:
        body["vcpus"] = int(vcpus)
    if volumes:
        body["volumes"] = [volume_body(v) for v in volumes]
    if idle_timeout_seconds is not None:
        body["idle_timeout_seconds"] = int(idle_timeout_seconds)
    if on_timeout is not None:
        body["on_timeout"] = on_timeout
    if network is not None:
        body["network"] = bool(network)
    if egress is not None or allow:
        body["egress"] = egress_body(egress, allow)
    if ttl_seconds is not None:
        body["ttl_seconds"] = int(ttl_seconds)
    if metadata:
        body["metadata"] = dict(metadata)
    if from_snapshot:
        body["from_snapshot"] = from_snapshot
        del body["template"]
    return body


def list_params(state: Optional[str], metadata: Optional[Mapping[str, str]]) -> Dict[str, str]:
    params: Dict[str, str] = {}
    if state:
        params["state"] = state
    for k, v in (metadata or {}).items():
        params[f"metadata.{k}"] = v
    return params


def raise_for(response: httpx.Response) -> None:
    """Raises the typed error for a non-2xx response."""
    if response.status_code < 300:
        return
    try:
        err = response.json()["error"]
        code, message = err["code"], err["message"]
    except Exception:  # not our error shape
        code, message = "http_error", f"HTTP {response.status_code}: {response.text[:200]}"
    raise error_for(code, message, response.status_code)


def transport_error(e: Exception) -> PandaStackError:
    if isinstance(e, httpx.TimeoutException) and not isinstance(e, httpx.ConnectTimeout):
        return Timeout(f"no answer from the PandaStack daemon in time: {e}", code="timeout")
    return ConnectionFailed(f"cannot reach the PandaStack daemon: {e}")


class OutputCap:
    """A command's output as the API buffers it: at most MAX_OUTPUT bytes per stream, with a flag
    saying what was cut."""

    def __init__(self) -> None:
        self.out, self.err = bytearray(), bytearray()
        self.out_truncated = self.err_truncated = False

    def add(self, kind: str, data: bytes) -> None:
        buf = self.out if kind == "stdout" else self.err
        room = MAX_OUTPUT - len(buf)
        if len(data) > room:
            if kind == "stdout":
                self.out_truncated = True
            else:
                self.err_truncated = True
            data = data[:max(room, 0)]
        buf += data


class SseParser:
    """Feeds raw bytes of a text/event-stream, returns the ExecEvents they complete. The server
    sends each event's data on one line, so an event is complete at its data line. Parsing whole
    chunks (not a line reader's strings) keeps up with tens of MB/s of output: the server cancels
    a command whose client falls 16 MiB behind."""

    def __init__(self) -> None:
        self.event = ""
        self.buf = b""

    def feed_bytes(self, chunk: bytes) -> List[Any]:
        self.buf += chunk
        out: List[Any] = []
        start = 0
        while True:
            nl = self.buf.find(b"\n", start)
            if nl < 0:
                break
            line = self.buf[start:nl]
            start = nl + 1
            if line.startswith(b"event: "):
                self.event = line[7:].decode().rstrip("\r")
            elif line.startswith(b"data: "):
                event, self.event = self.event, ""
                out.append(event_from_sse(event, json.loads(line[6:])))
        self.buf = self.buf[start:]
        return out


def egress_query(after: int, limit: int, kind: Optional[str], verdict: Optional[str]) -> str:
    """The query string of an egress log page."""
    q = {"after": str(int(after)), "limit": str(int(limit))}
    if kind is not None:
        q["kind"] = kind
    if verdict is not None:
        q["verdict"] = verdict
    return urllib.parse.urlencode(q)
