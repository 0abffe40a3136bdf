"""Copied as ``sitecustomize.py`` into a folder that a test puts on the agent's PYTHONPATH (the role's ``env``):
every Python process started with it that is a `taskkernel ... mcp` server sleeps before it starts, so the server
is as slow to answer `initialize` as a cold start on a loaded machine. The delay is read from ``slow.json``
beside this file (``{"delay": seconds}``); each delayed start appends a line to ``started.log`` there, so the
test can prove the delay happened (and that the agent CLI passed PYTHONPATH on to its MCP server)."""

from __future__ import annotations

import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))

if "mcp" in sys.argv[1:] and "--token-file" in sys.argv:
    try:
        with open(os.path.join(_HERE, "slow.json"), encoding="utf-8") as _fh:
            _delay = float(json.load(_fh).get("delay", 0))
    except (OSError, ValueError):
        _delay = 0.0
    with open(os.path.join(_HERE, "started.log"), "a", encoding="utf-8") as _fh:
        _fh.write(f"{time.time():.3f} pid {os.getpid()} delay {_delay}\n")
    time.sleep(_delay)
