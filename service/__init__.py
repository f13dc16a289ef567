"""The audit service (docs/service.md): many runs on one host, each queued for a GPU and driven by its own agent
through its own MCP endpoint, over the referee's own run folders and tools."""
