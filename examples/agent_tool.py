#!/usr/bin/env python3
"""The shape of a tool an LLM agent calls: run a command, get back a compact, model-friendly text
(exit code first, output truncated), never an exception for the command's own failure."""
from typing import Optional

from pandastack import PandaStackError, Sandbox

MAX_CHARS = 2000


def _clip(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    return text[:MAX_CHARS] + f"\n[... {len(text) - MAX_CHARS} more characters]"


def run_command(sbx: Sandbox, command: str, timeout_seconds: int = 60) -> str:
    """Tool: run `command` in the agent's sandbox."""
    try:
        r = sbx.exec(command, timeout_seconds=timeout_seconds)
    except PandaStackError as e:  # the sandbox itself is in trouble: say so, with the code
        return f"error={e.code}: {e.message}"
    head = f"exit_code={r.exit_code}" + (" (timed out)" if r.timed_out else "")
    return f"{head}\nstdout:\n{_clip(r.stdout)}\nstderr:\n{_clip(r.stderr)}"


def main(sandbox_id: Optional[str] = None) -> None:
    with Sandbox.create(metadata={"agent": "example"}) as sbx:
        print(run_command(sbx, "echo hello from the tool"))
        print(run_command(sbx, "seq 1 100000"))  # long output, truncated
        print(run_command(sbx, "ls /nonexistent"))  # a failing command is a result, not an error
        sbx.kill()
        print(run_command(sbx, "true"))  # the sandbox is gone: an error string with its code


if __name__ == "__main__":
    main()
