#!/usr/bin/env python3
"""Chat with a Parley server from a terminal, the way the seed's Python client does.

    python3 scripts/client.py "Once upon a time" "What happened next?"   # prompts from argv, one turn each
    python3 scripts/client.py                                            # prompts from stdin, one line each
    PARLEY_URL=ws://host:8000 python3 scripts/client.py ...              # or --url

Each prompt is sent as one text message; the reply's pieces are printed as they arrive until the server's
"<<Response Finished>>" sentinel, then the next prompt is sent on the same connection, so the server keeps the
conversation. Uses the asyncio API of the `websockets` package (Debian's python3-websockets 10.4, and >= 11).
Exit status: 0 after every reply finished, 1 if the connection failed or closed mid-reply.
"""

import argparse
import asyncio
import os
import sys

import websockets
from websockets.exceptions import WebSocketException

SENTINEL = "<<Response Finished>>"
DEFAULT_URL = "ws://localhost:8000"


async def reply(ws, prompt, out):
    """Send one prompt and copy the streamed reply to out; returns the number of pieces received."""
    await ws.send(prompt)
    pieces = 0
    while True:
        msg = await ws.recv()
        if msg == SENTINEL:
            break
        out.write(msg)
        out.flush()
        pieces += 1
    out.write("\n")
    out.flush()
    return pieces


async def prompts_from_stdin(interactive):
    """Yield stdin lines without blocking the event loop (the websockets keepalive runs meanwhile)."""
    loop = asyncio.get_running_loop()
    while True:
        if interactive:
            sys.stderr.write("> ")
            sys.stderr.flush()
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        line = line.rstrip("\r\n")
        if line:
            yield line


async def chat(url, prompts):
    async with websockets.connect(url) as ws:
        if prompts:
            for prompt in prompts:
                await reply(ws, prompt, sys.stdout)
        else:
            async for prompt in prompts_from_stdin(sys.stdin.isatty()):
                await reply(ws, prompt, sys.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", nargs="*", help="prompts to send in order (default: read lines from stdin)")
    parser.add_argument("--url", default=os.environ.get("PARLEY_URL", DEFAULT_URL),
                        help="server URL (env PARLEY_URL, default %(default)s)")
    args = parser.parse_args()
    try:
        asyncio.run(chat(args.url, args.prompts))
    except KeyboardInterrupt:
        return 130
    except (OSError, WebSocketException) as err:
        print(f"client.py: {args.url}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
