"""What the sync and async clients share: configuration, request bodies, response handling."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from ._errors import ConnectionFailed, PandaStackError, Unauthorized, error_for
from ._models import ExecEvent, event_from_sse

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
    return {"Authorization": f"Bearer {key}", "User-Agent": "pandastack-python/0.1"}


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
        body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
    return body


def egress_body(mode: Optional[str], allow: Optional[Sequence[str]]) -> Dict[str, Any]:
    """{"mode", "cidrs"}: an allowlist when CIDRs are given and no mode is named."""
    cidrs = list(allow or [])
    return {"mode": mode or ("allowlist" if cidrs else "deny_all"), "cidrs": cidrs}


def create_body(template: str, ttl_seconds: Optional[int], metadata: Optional[Mapping[str, str]],
                persistent: bool, auto_wake: bool, from_snapshot: Optional[str],
                network: Optional[bool] = None, egress: Optional[str] = None,
                allow: Optional[Sequence[str]] = None, idle_timeout_seconds: Optional[int] = None,
                on_timeout: Optional[str] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"template": template, "persistent": persistent,
                            "auto_wake": auto_wake}
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
    return ConnectionFailed(f"cannot reach the PandaStack daemon: {e}")


class SseParser:
    """Feeds lines of a text/event-stream, returns the ExecEvents they complete. The server sends
    each event's data on one line, so an event is complete at its data line (blank separator
    lines, which some line readers drop, are not needed)."""

    def __init__(self) -> None:
        self.event = ""

    def feed(self, line: str) -> Iterable[ExecEvent]:
        line = line.rstrip("\r\n")
        if line.startswith("event: "):
            self.event = line[7:]
        elif line.startswith("data: "):
            event, self.event = self.event, ""
            return (event_from_sse(event, json.loads(line[6:])),)
        return ()
