#!/usr/bin/env python3
"""Regenerates tools_golden.json: what Qwen 2.5's real chat template
(qwen2.5-tools.jinja, from llama.cpp's models/templates, MIT) writes for
conversations with tools, tool calls and tool results, rendered with Jinja2
as transformers' apply_chat_template does (its tojson: json.dumps with
ensure_ascii=False). TestRenderToolsGolden compares Parley's chatml family.
Run from this folder: python3 tools_golden.py (Debian python3-jinja2).
"""
import json

from jinja2.sandbox import ImmutableSandboxedEnvironment

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, \"now\"",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": {}}}

CONVERSATIONS = {
    "tools": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather?"}],
    "call-and-result": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks"},
    ],
    "two-calls": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "Sure.", "tool_calls": [CALL, CALL2]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "done"},
    ],
}


def tojson(x, indent=None):
    return json.dumps(x, ensure_ascii=False, indent=indent)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    tmpl = env.from_string(open("qwen2.5-tools.jinja").read())
    cases = []
    for name, msgs in CONVERSATIONS.items():
        gen = msgs[-1]["role"] != "assistant"
        cases.append({"conversation": name, "messages": msgs, "tools": TOOLS, "add_generation_prompt": gen,
                      "want": tmpl.render(messages=msgs, tools=TOOLS, add_generation_prompt=gen)})
    json.dump(cases, open("tools_golden.json", "w"), indent=1, ensure_ascii=False)
    print(len(cases), "cases")


if __name__ == "__main__":
    main()
