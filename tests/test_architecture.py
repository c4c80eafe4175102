"""The house rules of the source tree, checked from the code's own imports (read with `ast`, nothing run).

- The top-level packages (and top-level modules) form a ladder, `LAYERS`: each imports only from
  the rungs below it. Every import counts here, one inside a function or under `if TYPE_CHECKING:`
  included: each is a dependency a reader must know of.
- No module imports more than `MAX_PROJECT_IMPORTS` project modules (a module that needs more does
  more than one thing), and `http/` imports no API surface: it serves the route table it is given.
- The surfaces and the HTTP layer see a model's pool through `core.pool.PoolView`, never its class.
- No import cycles between modules (an import inside a function counts: it is still a dependency;
  one under `if TYPE_CHECKING:` does not, it never runs).
- `routing/` is sans-IO: it imports no trio, zmq or socket code.
- asyncio, trio-asyncio and grpclib's runtime are imported only by the transport's server half
  (`engine/transport/server.py`, `loop.py`), and that only by the mock engine (and tests): the
  frontend's gRPC client is trio alone, its HTTP/2 protocol (`wire.py`) sans-IO.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import trio_direct

PACKAGE = Path(trio_direct.__file__).parent
GENERATED = PACKAGE / "_proto"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if GENERATED in path.parents:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


MODULES = _modules()


@functools.cache
def _runtime_imports(path: Path) -> tuple[tuple[str, list[str]], ...]:
    return tuple(_read_imports(path))


@functools.cache
def _every_import(path: Path) -> tuple[tuple[str, list[str]], ...]:
    return tuple(_read_imports(path, type_checking=True))


def _read_imports(path: Path, *, type_checking: bool = False) -> Iterator[tuple[str, list[str]]]:
    """(module, names) for every import that runs: `import a.b` -> ("a.b", []), `from a import b` ->
    ("a", ["b"]); relative imports resolved; imports under `if TYPE_CHECKING:` skipped unless
    `type_checking`."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    return _parse_imports(path.read_text(), package, type_checking=type_checking)


def _parse_imports(
    source: str, package: tuple[str, ...], *, type_checking: bool = False
) -> Iterator[tuple[str, list[str]]]:
    tree = ast.parse(source)

    def walk(node: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if not type_checking and isinstance(child, ast.If) and _is_type_checking(child.test):
                yield from (n for orelse in child.orelse for n in [orelse, *walk(orelse)])
                continue
            yield child
            yield from walk(child)

    for node in walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield module, [alias.name for alias in node.names]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _internal_dependencies(path: Path, *, type_checking: bool = False) -> set[str]:
    """The trio_direct modules `path` imports (a `from package import module` names the module)."""
    out = set()
    for module, names in _every_import(path) if type_checking else _runtime_imports(path):
        if not module.startswith("trio_direct"):
            continue
        submodules = [f"{module}.{name}" for name in names if f"{module}.{name}" in MODULES]
        if submodules:
            out.update(submodules)
            if len(submodules) < len(names):
                out.add(module)
        elif module in MODULES:
            out.add(module)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _graph() -> dict[str, set[str]]:
    graph = {name: _internal_dependencies(path) - {name} for name, path in MODULES.items()}
    # A package's __init__ importing its own submodules is no cycle of dependencies.
    for name in graph:
        graph[name] = {target for target in graph[name] if not name.startswith(target + ".")}
    return graph


#: The ladder, lowest rung first: a top-level package or module imports only from those before it.
#: Foundations (the command-line options vocabulary, logging, metrics, tracing, ZMQ I/O), then the
#: engine adapters and the text pipeline, the state store and tenants, the fleet, routing, KV sync
#: and the mock engine, the settings, the request core (with the one error type, `core.errors`),
#: the APIs' schemas and envelopes (OpenAI's, Anthropic's), the HTTP layer, the surfaces, the
#: frontend's lifecycle, the composition root (`service`), and the entry points.
LAYERS = (
    "options",
    "logs",
    "metrics",
    "tracing",
    "zmqio",
    "engine",
    "text",
    "parsers",
    "state",
    "tenants",
    "fleet",
    "routing",
    "kv_sync",
    "mock",
    "config",
    "core",
    "openai",
    "anthropic",
    "http",
    "surfaces",
    "frontend",
    "service",
    "bench",
    "app",
    "cli",
    "__main__",
)
#: Packages that hold API surfaces (schemas, planners, renderers): the HTTP layer knows none.
SURFACES = ("surfaces",)
MAX_PROJECT_IMPORTS = 20


def _top(module: str) -> str:
    """The rung a module sits on: its top-level package (or top-level module) under trio_direct."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _upward_imports(graph: dict[str, set[str]], layers: tuple[str, ...]) -> list[str]:
    rung = {name: index for index, name in enumerate(layers)}
    bad = []
    for source, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = _top(source), _top(target)
            if a == b or not a or not b:
                continue
            if a not in rung or b not in rung:
                bad.append(f"{source} -> {target}: add its package to LAYERS")
            elif rung[b] > rung[a]:
                bad.append(f"{source} -> {target}")
    return bad


def _full_graph() -> dict[str, set[str]]:
    return {name: _internal_dependencies(path, type_checking=True) - {name} for name, path in MODULES.items()}


def test_packages_only_import_downwards_counting_every_import():
    assert _upward_imports(_full_graph(), LAYERS) == []


def test_every_package_has_a_rung():
    assert {_top(name) for name in MODULES} - {""} - {"_proto"} <= set(LAYERS)


def test_an_upward_import_would_be_found():
    """The checker itself: an import under TYPE_CHECKING or inside a function counts."""
    graph = {
        "trio_direct.http.app": {"trio_direct.surfaces.chat"},
        "trio_direct.surfaces.chat": {"trio_direct.http.app"},
    }
    assert _upward_imports(graph, ("http", "surfaces")) == ["trio_direct.http.app -> trio_direct.surfaces.chat"]
    source = (
        "def f():\n    from trio_direct.surfaces import chat\nif TYPE_CHECKING:\n    import trio_direct.core.plan\n"
    )
    assert {m for m, _ in _parse_imports(source, (), type_checking=True)} == {
        "trio_direct.surfaces",
        "trio_direct.core.plan",
    }
    assert {m for m, _ in _parse_imports(source, ())} == {"trio_direct.surfaces"}


def test_no_module_imports_more_than_twenty_project_modules():
    graph = _full_graph()
    heavy = {name: len(targets) for name, targets in graph.items() if len(targets) > MAX_PROJECT_IMPORTS}
    assert heavy == {}


def test_http_imports_no_surface():
    graph = _full_graph()
    offenders = {
        f"{source} -> {target}"
        for source, targets in graph.items()
        if _top(source) == "http"
        for target in targets
        if _top(target) in SURFACES
    }
    assert offenders == set()


def test_surfaces_and_http_see_a_pool_through_the_core_protocol():
    """`core.pool.PoolView`, not the pool's class: how a pool is built and run is the frontend's."""
    graph = _full_graph()
    offenders = {
        f"{source} -> {target}"
        for source, targets in graph.items()
        if _top(source) in ("surfaces", "http")
        for target in targets
        if target == "trio_direct.core.model_pool"
    }
    assert offenders == set()


def test_the_tree_has_no_import_cycles():
    assert _cycles(_graph()) == []


def test_a_cycle_would_be_found():
    """The checker itself: two modules importing each other form a cycle."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def _external_imports(name: str) -> set[str]:
    return {module.split(".")[0] for module, _ in _runtime_imports(MODULES[name])}


def test_routing_is_sans_io():
    io = {"trio", "trio_asyncio", "zmq", "socket", "asyncio", "selectors", "trio_util"}
    offenders = {
        name: sorted(_external_imports(name) & io)
        for name in MODULES
        if name.startswith("trio_direct.routing") and _external_imports(name) & io
    }
    assert offenders == {}


def test_the_grpc_wire_protocol_is_sans_io():
    io = {"trio", "trio_asyncio", "zmq", "socket", "asyncio", "selectors", "trio_util", "h2", "grpclib"}
    assert _external_imports("trio_direct.engine.transport.wire") & io == set()


def test_asyncio_and_grpclib_runtime_stay_inside_the_transport_server():
    server_half = {"trio_direct.engine.transport.server", "trio_direct.engine.transport.loop"}
    offenders = {}
    for name in MODULES:
        if name in server_half:
            continue
        modules = {module for module, _ in _runtime_imports(MODULES[name])}
        bad = {
            m
            for m in modules
            if m.split(".")[0] in ("asyncio", "trio_asyncio")
            # grpclib's generated message modules (health_pb2) are plain protobuf, not its runtime
            or (m.startswith("grpclib") and not m.startswith("grpclib.health.v1"))
        }
        if bad:
            offenders[name] = sorted(bad)
    assert offenders == {}


def test_only_the_mock_engine_uses_the_transport_server():
    server = "trio_direct.engine.transport.server"
    users = {name for name, path in MODULES.items() if server in _internal_dependencies(path)}
    assert users and all(name.startswith("trio_direct.mock.") for name in users), sorted(users)
