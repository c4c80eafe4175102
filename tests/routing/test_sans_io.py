"""routing/ is sans-IO: plain synchronous code that any I/O shell (or a unit test) can drive."""

from __future__ import annotations

import ast
from pathlib import Path

import trio_direct.routing

#: Modules that do I/O or run an event loop; routing/ must import none of them.
IO_MODULES = {"trio", "trio_util", "zmq", "socket", "asyncio", "selectors", "select", "grpclib", "httpx",
              "hypercorn", "threading", "subprocess", "trio_direct.zmqio", "trio_direct.kv_sync",
              "trio_direct.engine", "trio_direct.frontend", "trio_direct.fleet.fleet", "trio_direct.fleet.health"}  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_routing_module_imports_io():
    package = Path(trio_direct.routing.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5
    for path in modules:
        bad = {m for m in imported_modules(path) if any(m == io or m.startswith(io + ".") for io in IO_MODULES)}
        assert not bad, f"{path.name} imports {sorted(bad)}"
