#!/usr/bin/env python3
"""Sandbox tools for an LLM agent (pandastack.tools): what a model's tool calls get back —
compact text, exit code first, output cut deterministically, never an exception for the
command's own failure or a bad argument. Hand `kit.anthropic()` or `kit.openai()` to the model
and its tool calls to `kit.call_anthropic(...)` / `kit.call_openai(...)`; here the calls are
made directly."""
from pandastack.tools import Toolkit


def main() -> None:
    with Toolkit(metadata={"agent": "example"}, max_output_chars=2000) as kit:
        print([t["name"] for t in kit.anthropic()])
        print(kit.call("run_command", {"command": "echo hello from the tool"}))
        print(kit.call("run_command", {"command": "seq 1 100000"}))  # long output, cut
        print(kit.call("run_command", {"command": "ls /nonexistent"}))  # a result, not an error
        print(kit.call("run_python", {"code": "import math\nmath.factorial(20)"}))
        print(kit.call("run_command", {"command": 42}))  # the model's mistake: an answer too
        kit.sandbox.kill()
        print(kit.call("run_command", {"command": "true"}))  # gone: an error string with its code


if __name__ == "__main__":
    main()
