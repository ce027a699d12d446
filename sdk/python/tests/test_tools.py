"""The agent toolkit (pandastack.tools) against a real daemon: run by test_sdk.py, whose module
set-up starts the daemon (PANDASTACK_API_KEY / PANDASTACK_BASE_URL)."""
import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from pandastack import Sandbox
from pandastack.tools import TOOL_NAMES, AsyncToolkit, Toolkit

JSON_TYPES = {"string", "integer", "number", "boolean", "object", "array", "null"}


def check_strict_schema(test, schema):
    """The rules of OpenAI's strict function schemas (a subset of JSON Schema) and of Anthropic's
    input_schema: an object, every property typed and required, no other properties."""
    test.assertEqual(schema["type"], "object")
    test.assertIs(schema["additionalProperties"], False)
    test.assertEqual(sorted(schema["required"]), sorted(schema["properties"]))
    for name, prop in schema["properties"].items():
        types = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
        test.assertTrue(set(types) <= JSON_TYPES, (name, types))
        test.assertTrue(prop.get("description"), name)
    json.dumps(schema)  # plain JSON


class ToolkitTest(unittest.TestCase):

    def test_schemas_fit_anthropic_and_openai(self):
        kit = Toolkit()
        tools = kit.anthropic()
        self.assertEqual([t["name"] for t in tools], list(TOOL_NAMES))
        for t in tools:
            self.assertEqual(set(t), {"name", "description", "input_schema"})
            self.assertRegex(t["name"], r"^[a-zA-Z0-9_-]{1,64}$")
            self.assertGreater(len(t["description"]), 40)
            check_strict_schema(self, t["input_schema"])
        for t in kit.openai():
            self.assertEqual(t["type"], "function")
            self.assertEqual(set(t["function"]), {"name", "description", "parameters", "strict"})
            self.assertIs(t["function"]["strict"], True)
            check_strict_schema(self, t["function"]["parameters"])
        only = Toolkit(tools=["run_command"])
        self.assertEqual([t["name"] for t in only.anthropic()], ["run_command"])
        with self.assertRaises(ValueError):
            Toolkit(tools=["rm_rf"])
        self.assertIsNone(kit._sbx)  # no sandbox until a call needs one

    def test_a_session_keeps_its_sandbox_and_answers_are_text(self):
        with Toolkit(max_output_chars=300) as kit:
            out = kit.call("run_command", {"command": "echo hi; echo oops >&2; exit 3",
                                           "timeout_seconds": None})
            self.assertEqual(out, "exit_code=3\nstdout:\nhi\n\nstderr:\noops\n")
            self.assertEqual(kit.call("write_file", {"path": "/tmp/a/n.txt", "content": "42\n"}),
                             "wrote 3 bytes to /tmp/a/n.txt")
            self.assertEqual(kit.call("read_file", '{"path": "/tmp/a/n.txt"}'), "42\n")
            self.assertEqual(kit.call("list_files", {"path": "/tmp/a"}), "n.txt (3 bytes)")
            self.assertEqual(kit.call("run_python", {"code": "x = 6 * 7", "timeout_seconds": None}),
                             "status=ok")
            self.assertEqual(kit.call("run_python", {"code": "print('p'); x", "timeout_seconds": 30}),
                             "status=ok\nresult:\n42\nstdout:\np\n")
            err = kit.call("run_python", {"code": "1/0", "timeout_seconds": None})
            self.assertTrue(err.startswith("status=error ZeroDivisionError: division by zero\n"), err)
            self.assertIn("traceback:", err)
            # Long output: head and tail kept, the cut counted, the same every time.
            long1 = kit.call("run_command", {"command": "seq 1 5000", "timeout_seconds": None})
            long2 = kit.call("run_command", {"command": "seq 1 5000", "timeout_seconds": None})
            self.assertEqual(long1, long2)
            self.assertRegex(long1, r"\[\.\.\. \d+ characters omitted \.\.\.\]")
            self.assertIn("\n5000\n", long1)
            self.assertLess(len(long1), 2 * 300 + 200)
            # A nullable argument may be left out (models often do).
            self.assertEqual(kit.call("run_command", {"command": "echo $((1+1))"}),
                             "exit_code=0\nstdout:\n2\n\nstderr:\n")
            timed = kit.call("run_command", {"command": "sleep 5", "timeout_seconds": 1})
            self.assertTrue(timed.startswith("exit_code="), timed)
            self.assertIn("(timed out)", timed)
            sid = kit.sandbox.id
            # The model's mistakes are answers too, never exceptions.
            self.assertTrue(kit.call("nope", {}).startswith("error=unknown_tool:"))
            for bad in ({"command": 1, "timeout_seconds": None}, {"timeout_seconds": 3},
                        {"command": "x", "timeout_seconds": None, "shell": "sh"},
                        {"command": "x", "timeout_seconds": -1}, "{not json", [1]):
                self.assertTrue(kit.call("run_command", bad).startswith("error=invalid_arguments:"),
                                bad)
            self.assertTrue(kit.call("read_file", {"path": "/nope"}).startswith("error=file_not_found"))
            self.assertEqual(kit.call("read_file", {"path": "/bin/true"})[:14], "(binary file: ")
        self.assertEqual(Sandbox.get(sid).state, "stopped")  # close() killed it
        # A sandbox that is gone is an error string with its code.
        gone = Toolkit()
        gone.call("run_command", {"command": "true", "timeout_seconds": None})
        gone.sandbox.kill()
        self.assertTrue(gone.call("run_command", {"command": "true", "timeout_seconds": None})
                        .startswith("error=sandbox_stopped"))

    def test_per_call_sandboxes_share_nothing(self):
        with Toolkit(per_call=True, tools=["write_file", "read_file"]) as kit:
            kit.call("write_file", {"path": "/tmp/x", "content": "1"})
            self.assertTrue(kit.call("read_file", {"path": "/tmp/x"}).startswith("error=file_not_found"))
            self.assertIsNone(kit._sbx)
        left = [s for s in Sandbox.list(state="running", metadata={"pandastack.toolkit": "1"})]
        self.assertEqual(left, [])

    def test_an_anthropic_tool_loop_with_a_scripted_model(self):
        # A scripted model: the assistant turns a real model would send, in Anthropic's shape.
        turns = [
            [{"type": "text", "text": "Let me plot it."},
             {"type": "tool_use", "id": "toolu_01", "name": "run_python", "input": {
                 "code": "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nsum([1, 4, 9])",
                 "timeout_seconds": 120}},
             {"type": "tool_use", "id": "toolu_02", "name": "run_command",
              "input": {"command": "nproc >/dev/null && echo ok", "timeout_seconds": None}}],
            [{"type": "text", "text": "The sum is 14."}],
        ]
        messages = [{"role": "user", "content": "Plot 1, 4, 9 and sum them."}]
        with Toolkit(template="code-interpreter") as kit:
            tools = kit.anthropic()
            self.assertTrue(tools)
            for content in turns:  # client.messages.create(model=..., tools=tools, messages=...)
                messages.append({"role": "assistant", "content": content})
                results = kit.call_anthropic(content)
                if not results:
                    break
                messages.append({"role": "user", "content": results})
        results = messages[2]["content"]
        self.assertEqual([r["tool_use_id"] for r in results], ["toolu_01", "toolu_02"])
        plot = results[0]["content"]
        self.assertEqual(plot[0]["type"], "text")
        self.assertIn("result:\n14\n", plot[0]["text"])
        self.assertIn("images: 1 (PNG)", plot[0]["text"])
        self.assertEqual((plot[1]["type"], plot[1]["source"]["media_type"]), ("image", "image/png"))
        self.assertEqual(base64.b64decode(plot[1]["source"]["data"])[:8], b"\x89PNG\r\n\x1a\n")
        self.assertNotIn("is_error", results[0])
        self.assertEqual(results[1]["content"], [{"type": "text", "text":
                                                  "exit_code=0\nstdout:\nok\n\nstderr:\n"}])

    def test_openai_tool_calls(self):
        with Toolkit(tools=["run_command"]) as kit:
            calls = [{"id": "call_1", "type": "function", "function": {
                "name": "run_command",
                "arguments": json.dumps({"command": "echo $((2+3))", "timeout_seconds": None})}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "read_file", "arguments": "{}"}}]
            out = kit.call_openai(calls)
        self.assertEqual(out[0], {"role": "tool", "tool_call_id": "call_1",
                                  "content": "exit_code=0\nstdout:\n5\n\nstderr:\n"})
        self.assertTrue(re.match(r"error=unknown_tool: no tool 'read_file'", out[1]["content"]))


class AsyncToolkitTest(unittest.IsolatedAsyncioTestCase):

    async def test_async_tools(self):
        async with AsyncToolkit(tools=["run_command", "run_python"]) as kit:
            a, b = await asyncio.gather(
                kit.call("run_command", {"command": "echo a", "timeout_seconds": None}),
                kit.call("run_python", {"code": "2 ** 10", "timeout_seconds": None}))
            self.assertEqual(a, "exit_code=0\nstdout:\na\n\nstderr:\n")
            self.assertEqual(b, "status=ok\nresult:\n1024")
            sid = (await kit.sandbox()).id
        self.assertEqual(Sandbox.get(sid).state, "stopped")


class PackagingTest(unittest.TestCase):
    """`pip install ./sdk/python` in a fresh venv (offline: Debian's httpx through
    --system-site-packages), then the README's agent loop, verbatim, outside the source tree."""

    def test_pip_install_and_the_readme_agent_loop(self):
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.path.join(here, "..", "..", "..")
        with tempfile.TemporaryDirectory(prefix="pst-venv-", dir="/var/tmp") as tmp:
            src = os.path.join(tmp, "sdk")
            shutil.copytree(os.path.join(root, "sdk", "python"), src,
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                          "tests"))
            venv = os.path.join(tmp, "venv")
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                           check=True, capture_output=True)
            py = os.path.join(venv, "bin", "python")
            r = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                                src], capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            block = readme_block(os.path.join(root, "README.md"), "anthropic-loop")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = os.path.join(here, "fakes")  # the scripted `anthropic` only
            r = subprocess.run([py, "-c", block], cwd=tmp, env=env, capture_output=True,
                               text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, "The 20th Fibonacci number is 6765.\n")
            r = subprocess.run([py, "-c", "import pandastack, sys; print(pandastack.__file__)"],
                               cwd=tmp, env=env, capture_output=True, text=True)
            self.assertTrue(r.stdout.startswith(venv), r.stdout)  # the installed copy


def readme_block(path, name):
    with open(path) as f:
        text = f.read()
    block = text.split(f"<!-- {name} -->\n", 1)[1].split(f"<!-- /{name} -->", 1)[0]
    return block.split("```python\n", 1)[1].split("```", 1)[0]
