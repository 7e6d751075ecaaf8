#!/usr/bin/env python3
"""Stream a reply from Parley's SageMaker-style endpoint with nothing but the standard library.

    python3 scripts/sagemaker_client.py --url http://127.0.0.1:8000/invocations "Once upon a time"

POST /invocations with {"inputs": PROMPT, "parameters": {...}, "stream": true} answers with TGI's event lines:
one `data:{"token": {"id", "text", "logprob", "special"}, ...}` line per token, an empty line after each, the
last one also carrying "generated_text" and "details". This client reads them the way SageMaker's
response-stream examples do: it takes the body as a sequence of byte chunks (cut anywhere, like the
PayloadPart events of invoke_endpoint_with_response_stream), splits the bytes on newlines, parses every line
that starts with `data:` as JSON and prints token.text as it arrives.

Options: --param NAME=VALUE (repeatable; VALUE is parsed as JSON when it can be, e.g. --param temperature=0,
--param stop='["."]'), --max-new-tokens N, --api-key KEY (or PARLEY_API_KEY), --no-stream (one JSON reply).
"""

import argparse
import http.client
import json
import os
import sys
import urllib.parse


class LineIterator:
    """Turns an iterable of byte chunks into lines (bytes, without the newline).

    Chunks may end anywhere, in the middle of a line or of a UTF-8 character: bytes are kept until their
    newline arrives. A last line without a newline is returned when the chunks run out.
    """

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._pending = bytearray()

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            end = self._pending.find(b"\n")
            if end >= 0:
                line = bytes(self._pending[:end])
                del self._pending[: end + 1]
                return line
            chunk = next(self._chunks, None)
            if chunk is None:
                if self._pending:
                    line = bytes(self._pending)
                    self._pending.clear()
                    return line
                raise StopIteration
            self._pending += chunk


class StreamError(Exception):
    """The server refused the request (HTTP status) or reported an error in the stream (an error event)."""


def events(lines, strict=False):
    """Yields the JSON object of every `data:` line.

    strict: also check TGI's framing byte for byte: every data line is followed by exactly one empty line,
    and nothing else appears. (Readers that step over one byte after each data line rely on it.)
    """
    want_blank = False
    for n, line in enumerate(lines, 1):
        if want_blank:
            if line != b"":
                raise StreamError(f"line {n}: expected the empty line that ends an event, got {line[:80]!r}")
            want_blank = False
            continue
        if not line.startswith(b"data:"):
            if strict:
                raise StreamError(f"line {n}: expected a data: line, got {line[:80]!r}")
            continue
        event = json.loads(line[len(b"data:"):].decode("utf-8"))
        if "error" in event:
            raise StreamError(f"{event.get('error_type', 'error')}: {event['error']}")
        yield event
        want_blank = strict


def _connect(url, timeout):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    path = parts.path or "/invocations"
    if parts.query:
        path += "?" + parts.query
    return conn, path


def _headers(api_key):
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def _byte_chunks(response, size):
    """The response body as it arrives, at most size bytes at a time (read1 returns what is there)."""
    while True:
        chunk = response.read1(size)
        if not chunk:
            return
        yield chunk


def stream(url, prompt, parameters=None, api_key=None, timeout=60.0, chunk_size=1024, strict=False):
    """Yields every event of a streamed reply (dicts; the last has generated_text and details)."""
    conn, path = _connect(url, timeout)
    try:
        body = json.dumps({"inputs": prompt, "parameters": parameters or {}, "stream": True})
        conn.request("POST", path, body=body, headers=_headers(api_key))
        response = conn.getresponse()
        if response.status != 200:
            raise StreamError(f"HTTP {response.status}: {response.read().decode('utf-8', 'replace')}")
        yield from events(LineIterator(_byte_chunks(response, chunk_size)), strict=strict)
    finally:
        conn.close()


def tokens(url, prompt, parameters=None, **kw):
    """Yields the text of every token as it arrives, skipping special tokens (as TGI's clients do)."""
    for event in stream(url, prompt, parameters, **kw):
        token = event.get("token") or {}
        if not token.get("special"):
            yield token.get("text", "")


def invoke(url, prompt, parameters=None, api_key=None, timeout=60.0):
    """One reply without streaming: the endpoint's [{"generated_text": ...}] answer."""
    conn, path = _connect(url, timeout)
    try:
        body = json.dumps({"inputs": prompt, "parameters": parameters or {}})
        conn.request("POST", path, body=body, headers=_headers(api_key))
        response = conn.getresponse()
        data = response.read().decode("utf-8")
        if response.status != 200:
            raise StreamError(f"HTTP {response.status}: {data}")
        return json.loads(data)
    finally:
        conn.close()


def _param(text):
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"want NAME=VALUE, got {text!r}")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def main(argv=None):
    ap = argparse.ArgumentParser(description="Stream a reply from Parley's /invocations endpoint.")
    ap.add_argument("prompt", nargs="+", help="the prompt (words are joined with spaces)")
    ap.add_argument("--url", default=os.environ.get("PARLEY_INVOCATIONS_URL", "http://127.0.0.1:8000/invocations"))
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--api-key", default=os.environ.get("PARLEY_API_KEY"))
    ap.add_argument("--no-stream", action="store_true", help="ask for one JSON reply instead of a stream")
    args = ap.parse_args(argv)
    parameters = dict(args.param)
    if args.max_new_tokens is not None:
        parameters["max_new_tokens"] = args.max_new_tokens
    prompt = " ".join(args.prompt)
    try:
        if args.no_stream:
            print(invoke(args.url, prompt, parameters, api_key=args.api_key)[0]["generated_text"])
            return 0
        for text in tokens(args.url, prompt, parameters, api_key=args.api_key):
            print(text, end="", flush=True)
        print()
    except (StreamError, OSError) as e:
        print(f"\nsagemaker_client: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
