"""The MCP server (`taskkernel mcp`, docs/mcp.md): the kernel's task verbs, reads, progress/resume, the execution
gate and usage as typed MCP tools, plus ``task://`` and ``todo://`` resources.

- schemas.py: each tool's arguments and results as pydantic models, and their JSON Schemas (no SDK);
- catalog.py: the tools the server lists (name, description, models), free of the kernel;
- results.py: output budgets (lists cut with a cursor, long texts cut with a pointer) and each result's text (its
  document as compact JSON);
- tools.py: the tools themselves, synchronous and free of the SDK (the server, the tests and bench/mcp.py
  call the same code);
- resources.py: the TASK file as markdown and a role's queue;
- server.py: the official ``mcp`` SDK's low-level server over stdio or streamable HTTP, the per-call identity,
  the kernel opened when first needed (``Warmup``);
- startup.py: the stdio command, which answers the host before it opens the kernel.

Only server.py imports the SDK, and only the `mcp` command imports server.py and startup.py.
"""
