"""sdk_upstream.py with one tool more, for the shared-session tests: `upstream_session`
answers the `Mcp-Session-Id` header the call reached this upstream with (text, and
`structuredContent.session`), so a test sees which upstream session served each request
whichever mcpyard node relayed it. Everything else (modes, arguments, the `listening`
line, `upstream_stats`, `log`, the event store) is sdk_upstream.py's, unchanged.

Run: `python session_upstream.py --mode json|sse|sse-resumable [--name NAME] ...` (the
arguments of sdk_upstream.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sdk_upstream as upstream  # noqa: E402
from mcp import types  # noqa: E402


async def tool_upstream_session(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    sid = upstream.session_id_of(ctx)
    return upstream.text_result(sid or "", structured={"session": sid})


upstream.STATIC_TOOLS.append(
    types.Tool(
        name="upstream_session",
        description="The Mcp-Session-Id this call reached the upstream with.",
        input_schema=upstream.obj_schema({}, []),
    )
)
upstream.TOOLS["upstream_session"] = tool_upstream_session


if __name__ == "__main__":
    upstream.main()
