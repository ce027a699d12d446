"""A scripted stand-in for the `anthropic` package (no PyPI here): `Anthropic().messages.create`
answers like the Messages API does — objects with `.content` blocks (`text`, `tool_use`) and
`.stop_reason` — from a script instead of a model. The first turn asks for the toolkit's
`run_python`; the next one reads the `tool_result` the caller sent back and answers with it, so a
loop that drops or mangles tool results fails its test."""
import itertools
from types import SimpleNamespace

_ids = itertools.count(1)

FIB = "a, b = 0, 1\nfor _ in range(20):\n    a, b = b, a + b\na"


def _block(**kw):
    return SimpleNamespace(**kw)


class _Messages:
    def create(self, *, model, max_tokens, messages, tools=(), **_):
        assert model and max_tokens > 0
        names = {t["name"] for t in tools}
        last = messages[-1]["content"]
        results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"] \
            if isinstance(last, list) else []
        if not results:
            assert "run_python" in names, names
            return SimpleNamespace(stop_reason="tool_use", content=[
                _block(type="text", text="I'll compute it."),
                _block(type="tool_use", id=f"toolu_{next(_ids):02d}", name="run_python",
                       input={"code": FIB, "timeout_seconds": None})])
        text = results[0]["content"][0]["text"]
        value = text.split("result:\n", 1)[1].split("\n", 1)[0] if "result:\n" in text else "?"
        return SimpleNamespace(stop_reason="end_turn", content=[
            _block(type="text", text=f"The 20th Fibonacci number is {value}.")])


class Anthropic:
    def __init__(self, **_):
        self.messages = _Messages()
