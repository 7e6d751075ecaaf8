#!/usr/bin/env python3
"""Regenerates golden.json: the prompts that the real Hugging Face chat
templates in hf_templates.json produce, rendered by Jinja2 the way
transformers' apply_chat_template does (sandboxed, trim_blocks,
lstrip_blocks, raise_exception). The Go tests compare chat.Template.Render
against these strings, so "reproduces the real format" is checked against
the templates themselves rather than against our reading of them.

Run from this folder: python3 golden.py  (needs Debian's python3-jinja2).
A leading bos_token is stripped from every output: Parley's tokenizer adds
BOS, the template must not.
"""
import json

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

BOS, EOS = "<s>", "</s>"

CONVERSATIONS = {
    "user": [("user", "Hello")],
    "system": [("system", "You are a helpful assistant"), ("user", "Hello")],
    "multi": [
        ("system", "You are a helpful assistant"),
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "Who are you"),
        ("assistant", "   I am an assistant   "),
        ("user", "Another question"),
    ],
    "multi-nosys": [
        ("user", "Hello"),
        ("assistant", "Hi there"),
        ("user", "Who are you"),
        ("assistant", "   I am an assistant   "),
        ("user", "Another question"),
    ],
    "finished": [("user", "Hello"), ("assistant", "Hi there")],
    "unicode": [("user", "Ça va? 日本語 🌍\n  indented\t")],
    "whitespace": [
        ("system", "  padded system \n"),
        ("user", "\n spaced user \t"),
        ("assistant", " reply "),
        ("user", "again "),
    ],
    # Python's str.strip (Jinja's trim) also strips U+001C..U+001F.
    "separators": [("user", "\x1c\x1f hi \x1e"), ("assistant", "\x1dok\x1f")],
}

# family -> indexes into hf_templates.json whose output Parley must match.
FAMILIES = {
    "chatml": [1, 6],
    "llama3": [23],
    "llama2": [12, 28],
    "mistral": [10],
    "gemma": [21, 22],
    "phi3": [29, 30, 31],
    "zephyr": [2],
}

# Where Parley deliberately differs from one template of a family:
# (index, what) -> why. The case is left out of golden.json.
EXCEPTIONS = {
    # Older Phi-3 templates drop system messages silently; Parley renders them
    # as the newer Phi-3 template (31) does.
    (29, "system"): "older Phi-3 templates ignore the system role",
    (30, "system"): "older Phi-3 templates ignore the system role",
    # Phi-3 (31) appends eos_token when there is no generation prompt; Parley
    # never renders an end-of-sequence marker, so that a rendered history stays
    # a prefix of the next turn's prompt (KV-cache reuse).
    (31, "no-generation-prompt"): "no trailing eos_token",
}


def raise_exception(msg):
    raise TemplateError(msg)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    templates = json.load(open("hf_templates.json"))
    out = []
    for family, indexes in FAMILIES.items():
        for idx in indexes:
            tmpl = env.from_string(templates[idx]["template"])
            for conv, msgs in CONVERSATIONS.items():
                for gen in (True, False):
                    if gen and msgs[-1][0] != "user":
                        continue
                    if not gen and msgs[-1][0] != "assistant":
                        continue
                    if (idx, "system") in EXCEPTIONS and msgs[0][0] == "system":
                        continue
                    if (idx, "no-generation-prompt") in EXCEPTIONS and not gen:
                        continue
                    try:
                        text = tmpl.render(
                            messages=[{"role": r, "content": c} for r, c in msgs],
                            add_generation_prompt=gen,
                            bos_token=BOS,
                            eos_token=EOS,
                        )
                    except TemplateError:
                        continue  # the template refuses this conversation (e.g. a system role)
                    if text.startswith(BOS):
                        text = text[len(BOS):]
                    out.append({
                        "family": family,
                        "template": idx,
                        "conversation": conv,
                        "add_generation_prompt": gen,
                        "want": text,
                    })
    json.dump({"conversations": CONVERSATIONS, "cases": out}, open("golden.json", "w"),
              indent=1, ensure_ascii=False)
    print(len(out), "cases")


if __name__ == "__main__":
    main()
