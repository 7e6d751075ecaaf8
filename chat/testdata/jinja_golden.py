#!/usr/bin/env python3
"""Renders chat templates with Jinja2 exactly as Hugging Face transformers' apply_chat_template does: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and the loopcontrols extension, a tojson that neither
sorts keys nor escapes HTML, raise_exception, strftime_now, and the {% generation %} tag (a no-op for rendering).

TestJinjaGolden and TestJinjaBehaviours run it (Debian's python3-jinja2): it reads a JSON list of cases from stdin,
each {"template": path, "vars": {...}} or {"source": text, "vars": {...}} with the variables Parley passes (a "now" key is the Unix time strftime_now
formats, removed from the variables), and writes a JSON list of {"out": text} or {"err": message} in the same order.
"""
import datetime
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    """transformers' {% generation %} ... {% endgeneration %}: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(env, cache, case):
    path = case.get("template")
    if path is None:
        template = env.from_string(case["source"])
    else:
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = env.from_string(f.read())
        template = cache[path]
    variables = dict(case["vars"])
    now = datetime.datetime.fromtimestamp(variables.pop("now", 0), datetime.timezone.utc)
    variables["strftime_now"] = lambda fmt: now.strftime(fmt)
    return template.render(**variables)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    cache = {}
    results = []
    for case in json.load(sys.stdin):
        try:
            results.append({"out": render(env, cache, case)})
        except Exception as e:  # noqa: BLE001 - every failure is a result to compare
            results.append({"err": "%s: %s" % (type(e).__name__, e)})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
