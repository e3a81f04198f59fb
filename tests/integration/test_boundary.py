"""The product stands alone: what `specroute-gateway` does by itself, and what `specroute serve`
hands it."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import BIN, REPO, specroute


@pytest.mark.parametrize(
    "cmd",
    [specroute("serve"), [str(BIN / "specroute-gateway"), "serve"], specroute("serve", "--listen", "127.0.0.1:1")],
)
def test_serve_without_backends_refuses_naming_both_ways_on(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--config FILE" in lines[0] and "--twins" in lines[0]


def test_the_twins_flags_are_the_tools_not_the_products() -> None:
    gateway = subprocess.run([str(BIN / "specroute-gateway"), "serve", "--twins"], capture_output=True, text=True)
    assert gateway.returncode == 2 and "unrecognized arguments: --twins" in gateway.stderr
    both = subprocess.run(specroute("serve", "--twins", "--config", "x.toml"), capture_output=True, text=True)
    assert both.returncode == 2 and "not allowed with" in both.stderr
    scale = subprocess.run(specroute("serve", "--sim-time-scale", "0.1"), capture_output=True, text=True)
    assert scale.returncode == 2 and "--twins only" in scale.stderr


# ------------------------------------------------------------------ the import boundary

PRODUCT = ("gateway", "policies", "backends", "common")
TOOLING = ("twin", "evaluate", "tools", "loadgen", "bench")


def _module_file(module: str) -> Path | None:
    """The source file of a first-party module (a package's __init__.py), None for anything else."""
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file() and module.split(".")[0] in PRODUCT + TOOLING:
            return path
    return None


def _names(module: str, path: Path) -> set[str]:
    """Every name `path` imports, anywhere in it: at the top, inside functions, under TYPE_CHECKING.
    `from a import b` names a and a.b (b may be a module); importing a.b.c runs a and a.b too."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    out = set()
    for name in names:
        parts = name.split(".")
        out.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def _imported(module: str, path: Path) -> set[str]:
    """The first-party modules `path` imports (`_names`)."""
    return {m for m in _names(module, path) if _module_file(m) is not None}


def _closure(start: str) -> set[str]:
    """The first-party modules `start` can import, statically, function-level imports included."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        path = _module_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo.extend(_imported(module, path) - seen)
    return seen


def _product_modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for package in PRODUCT
        for p in (REPO / package).rglob("*.py")
    )


def test_the_gateways_import_closure_holds_no_tooling() -> None:
    closure = _closure("gateway.serve")
    assert {"gateway.app", "gateway.seeding", "backends.measure", "policies.goodput", "common.admin_api"} <= closure
    assert sorted(m for m in closure if m.split(".")[0] in TOOLING) == []
    # the walk sees function-level imports: the `specroute` dispatcher reaches the twin only through one
    assert "twin.cli" in _closure("tools.cli") and "twin.cli" not in _closure("tools.topology")


@pytest.mark.parametrize("module", _product_modules())
def test_no_product_module_reaches_tooling(module: str) -> None:
    assert sorted(m for m in _closure(module) if m.split(".")[0] in TOOLING) == []


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` (`make lint`'s contract check) on the tree at `root`, with its pyproject.toml."""
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_make_lint_checks_the_import_contract_and_it_holds() -> None:
    dry = subprocess.run(["make", "-n", "lint"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "lint-imports" in dry.stdout, dry.stdout
    proc = _lint_imports(REPO)
    assert proc.returncode == 0 and "2 kept, 0 broken" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "module,planted,broken",
    [
        # the product imports tooling, inside a function
        ("gateway/serve.py", "def _planted() -> None:\n    import tools.topology\n", "the product imports no tooling"),
        # through another product module: gateway -> common -> loadgen
        ("common/percentile.py", "def _planted() -> None:\n    import loadgen.metrics\n", "imports no tooling"),
        # an upward arrow: backends imports policies
        ("backends/client.py", "def _planted() -> None:\n    from policies import Policy\n", "gateway -> policies"),
    ],
)
def test_a_planted_forbidden_import_breaks_the_contract(tmp_path: Path, module: str, planted: str, broken: str) -> None:
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(REPO / "pyproject.toml", root)
    for package in PRODUCT + TOOLING:
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    with (root / module).open("a") as f:
        f.write("\n\n" + planted)
    proc = _lint_imports(root)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{broken}" in proc.stdout and "BROKEN" in proc.stdout
    assert module.removesuffix(".py").replace("/", ".") in proc.stdout  # the planted line is the one named


# ------------------------------------------------------------------ no import cycle


def _import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """`package`'s modules under `root`, each with the modules of the package it imports anywhere:
    at the top, inside functions, under TYPE_CHECKING. The package itself (its __init__) is left
    out: every module of it runs it first."""
    modules = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (root / package).rglob("*.py")
    }
    return {m: {n for n in _names(m, p) if n in modules and n not in (m, package)} for m, p in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of more than one module (Tarjan), or a
    module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph[module]:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", PRODUCT)
def test_no_import_cycle_in_a_product_package(package: str) -> None:
    assert _cycles(_import_graph(REPO, package)) == []


def test_a_planted_type_only_import_makes_a_cycle_the_test_finds(tmp_path: Path) -> None:
    shutil.copytree(REPO / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "gateway" / "pool.py").open("a") as f:  # the proxy imports the pool
        f.write("\n\nif TYPE_CHECKING:\n    from gateway.proxy import Proxy\n")
    cycles = _cycles(_import_graph(tmp_path, "gateway"))
    assert len(cycles) == 1 and {"gateway.pool", "gateway.proxy"} <= set(cycles[0])


# ------------------------------------------------------------------ what the core install pulls

TOOLING_LIBRARIES = {"matplotlib", "numpy", "rich", "jsonschema"}


def _locked(path: Path) -> dict[str, set[str]]:
    """A uv lock file: package -> the packages (or extras) it is there for, from its `# via` lines."""
    out: dict[str, set[str]] = {}
    name = ""
    via = False
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name = canonicalize_name(line.split("==")[0].split(";")[0].strip())
            out[name] = set()
            via = False
        elif line.strip().startswith("# via"):
            via = True
            rest = line.strip().removeprefix("# via").strip()
            if rest:
                out[name].add(rest)
        elif via and line.strip().startswith("#   "):
            out[name].add(line.strip().removeprefix("#").strip())
    return out


def test_the_core_install_pulls_no_tooling_library() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    tools = {canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["tools"]}
    assert core.isdisjoint(TOOLING_LIBRARIES) and tools == TOOLING_LIBRARIES
    assert "specroute[tools]" in project["optional-dependencies"]["dev"]  # `make test` runs the tooling too
    lock = _locked(REPO / "requirements.lock")  # the core lock: `pip install .`, the image
    assert {"litestar", "uvicorn", "aiohttp", "msgspec", "opentelemetry-sdk"} <= lock.keys()
    assert lock.keys().isdisjoint({"matplotlib", "numpy", "jsonschema"})
    # rich stays, for litestar's own command line: litestar requires it (and rich-click), the gateway does not
    assert lock["rich"] == {"litestar", "rich-click"} and lock["rich-click"] == {"litestar"}
    assert _locked(REPO / "requirements-tools.lock").keys() >= TOOLING_LIBRARIES
