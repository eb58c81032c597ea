"""The public surface plugins build on: which nanoverl_core modules a plugin may import.

The list lives in nanoverl_core/__init__.py's docstring, where a plugin author reads it; this test
parses it and holds every first-party and example plugin to it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import nanoverl_core

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_SOURCES = sorted([*ROOT.glob("plugins/*/src/**/*.py"), *ROOT.glob("examples/plugins/*/src/**/*.py")])


def public_modules() -> list[str]:
    """The module names listed under "Public modules" in nanoverl_core's docstring."""
    _, _, listing = nanoverl_core.__doc__.partition("Public modules")
    return re.findall(r"^    (nanoverl_core[\w.]*)  ", listing, flags=re.MULTILINE)


PUBLIC_MODULES = public_modules()


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imported(module: str, name: str) -> tuple[str, str]:
    """`from module import name` as (module, name), or (the submodule, "*") when name is a submodule."""
    try:
        obj = getattr(importlib.import_module(module), name, None)
    except ImportError:  # a module that does not exist (any more): reported by its name
        return module, name
    if inspect.ismodule(obj):
        return obj.__name__, "*"
    if obj is None and _is_module(f"{module}.{name}"):  # a submodule not imported yet
        return f"{module}.{name}", "*"
    return module, name


def core_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every nanoverl_core import in one source file; `from nanoverl_core import dist`
    counts as the module nanoverl_core.dist, a "nanoverl_core.x:attr" string as nanoverl_core.x."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, "*") for alias in node.names if alias.name.split(".")[0] == "nanoverl_core"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] == "nanoverl_core":
            found += [_imported(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(m, a) for m, a in re.findall(r"^(nanoverl_core[\w.]*):(\w+)$", node.value)]
    return found


def test_the_public_list_names_modules_that_exist_and_not_the_trainer():
    assert "nanoverl_core" in PUBLIC_MODULES and "nanoverl_core.dist" in PUBLIC_MODULES
    for name in PUBLIC_MODULES:
        assert _is_module(name), f"{name} is listed as public but is not a module"
        assert not name.startswith("nanoverl_core.trainer"), name


def test_plugins_import_only_public_core_modules_and_names():
    assert len(PLUGIN_SOURCES) > 20  # the scan sees the plugins
    seen = set()
    for path in PLUGIN_SOURCES:
        where = path.relative_to(ROOT)
        for module, name in core_imports(path):
            seen.add(module)
            assert not module.startswith("nanoverl_core.trainer"), f"{where} imports {module}: the trainer's own"
            assert module in PUBLIC_MODULES, f"{where} imports {module}, which nanoverl_core does not list as public"
            assert not name.startswith("_"), f"{where} imports the private {module}.{name}"
    assert {"nanoverl_core", "nanoverl_core.config", "nanoverl_core.dist", "nanoverl_core.workers"} <= seen


def test_the_scan_sees_every_form_of_core_import(tmp_path):
    source = tmp_path / "plugin.py"
    source.write_text("import nanoverl_core.batch\nfrom nanoverl_core import dist, hookimpl\n"
                      "from nanoverl_core.trainer.dist import rank\nfrom . import own\n"
                      "from nanoverl_core.rollout import sample_seeds\n"
                      "def f():\n    from nanoverl_core.workers import _private\n"
                      "LAZY = 'nanoverl_core.trainer.trainer:Trainer'\n")
    assert sorted(core_imports(source)) == [
        ("nanoverl_core", "hookimpl"), ("nanoverl_core.batch", "*"), ("nanoverl_core.dist", "*"),
        ("nanoverl_core.rollout", "sample_seeds"), ("nanoverl_core.trainer.dist", "rank"),
        ("nanoverl_core.trainer.trainer", "Trainer"),
        ("nanoverl_core.workers", "_private")]


# ---- inside the core: every wing imports downward ------------------------------------------------------
FLOORS = ["errors", "env.contract", "hookspecs", "foreign_keys", "translate", "batch", "plugins", "config", "processes",
          "rollout", "dist", "algos", "protocols", "reward", "env", "agents", "data", "workers", "testing", "builtins", "trainer",
          "cli"]
"""The core's wings, lowest first: a module imports its own wing and the wings below, never one above or
beside it (the package's __init__, which names the public surface lazily, stands outside). env.contract,
what an environment receives and returns, imports nothing of the core and sits below everything that
names it."""
CORE = ROOT / "nanoverl_core"


def _module(path: Path) -> str:
    parts = path.relative_to(CORE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def core_graph() -> dict[str, set[str]]:
    """Module -> the core modules it imports, every import counted: type-only, inside functions, relative."""
    modules = {_module(p): p for p in CORE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("nanoverl_core")):
                if node.level:
                    base = package.split(".") if package else []
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module.removeprefix("nanoverl_core").lstrip(".")
                for alias in node.names:
                    sub = f"{target}.{alias.name}".lstrip(".")
                    found.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                found |= {a.name.removeprefix("nanoverl_core.") for a in node.names if a.name.startswith("nanoverl_core.")}
        graph[name] = {m for m in found if m in modules and m not in ("", name)}
    return graph


def _floor(module: str) -> int:
    return next(FLOORS.index(p) for p in (module, module.split(".")[0]) if p in FLOORS)


def test_every_core_module_imports_its_own_wing_or_the_floors_below():
    graph = core_graph()
    assert len(graph) > 50 and "trainer.trainer" in graph and "config.schema" in graph["config"]
    climbing = [f"{m} -> {d}" for m, deps in graph.items() if m for d in deps if _floor(d) > _floor(m)]
    assert not climbing, f"imports that climb a floor: {climbing}"


def test_the_core_has_no_import_circle():
    graph, state, circles = core_graph(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                circles.append(path[path.index(dep):] + [dep] if dep in path else [module, dep])
            elif dep not in state:
                visit(dep, [*path, dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, f"import circles: {circles}"


# ---- the core stays readable: short functions, a step on one screen, the PPO mechanics in one short file -----
def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_core_function_is_longer_than_50_lines_and_the_step_than_45():
    long = [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
            for path in sorted((ROOT / "nanoverl_core").rglob("*.py")) for name, line, length in _functions(path)
            if length > 50]
    assert not long, f"split these: {long}"
    (step,) = [length for name, _, length in _functions(ROOT / "nanoverl_core" / "trainer" / "trainer.py")
               if name == "train_step"]
    assert step <= 45, f"train_step is {step} lines: keep the step on one screen (decide passes in plan.py)"


def test_the_ppo_mechanics_read_in_one_short_file():
    """workers/ppo.py holds passes, mini-batches, losses and the optimizer step; how a micro-batch reaches the
    model is workers/forward.py's."""
    ppo = ROOT / "nanoverl_core" / "workers" / "ppo.py"
    assert len(ppo.read_text().splitlines()) <= 350
    tree = ast.parse(ppo.read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & {"pack_rows", "PackedRows", "prompt_cache", "ChunkedHead", "autocast", "attending"}
