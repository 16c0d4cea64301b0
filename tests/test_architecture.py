"""The package's import graph: no loops, and the core never imports the TRL compatibility layer.

Every `import` in src/rloo counts, including the ones inside functions (a lazy import is still a
dependency). `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`.
Importing `a.b.c` is not counted as importing `a` and `a.b` (their `__init__` runs, but every module
would then depend on the package door)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ANNEXES_ALLOWED_TO_IMPORT_COMPAT = ("rloo.compat", "rloo.cli")  # and the public door, `rloo` itself

# Known edges the move left in place; each one is a piece of work, not a rule. Shrink, never grow.
KNOWN_CORE_TO_COMPAT = {
    ("rloo.config", "rloo.compat.config_fields"),  # the decorator that installs TRL's field names
    ("rloo.builders", "rloo.compat.config_fields"),  # model_init_kwargs still lives there
    ("rloo.model_loading", "rloo.compat.config_fields"),
}
KNOWN_LOOPS = [
    {"rloo.config", "rloo.config_checks"},  # config_checks.validate is imported lazily by the config
    {"rloo.rewards.builtins", "rloo.rewards.gsm8k"},  # the registry names the GSM8K rewards
    # cli <-> cli.commands, compat.script_parser -> cli, run.trainer_api -> the door (for __version__)
    {"rloo", "rloo.cli", "rloo.cli.commands", "rloo.compat.script_parser", "rloo.run.trainer_api", "rloo.toy.demo",
     "rloo.trainer"},
]


def module_names():
    names = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        names[".".join(parts)] = (path, is_package)
    return names


def import_graph():
    modules = module_names()
    graph = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def strongly_connected(graph):
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                result.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def test_the_graph_sees_the_known_modules():
    graph = import_graph()
    assert "rloo.trainer" in graph and "rloo.compat.config_fields" in graph
    assert "rloo.rollout" in graph["rloo.trainer"]


def test_no_import_loops():
    loops = strongly_connected(import_graph())
    unexpected = [sorted(loop) for loop in loops if loop not in KNOWN_LOOPS]
    assert not unexpected, f"import loops: {unexpected}"


def test_the_core_does_not_import_the_trl_layer():
    graph = import_graph()
    edges = {(name, target) for name, targets in graph.items() for target in targets
             if target.startswith("rloo.compat") and name != "rloo" and not name.startswith(ANNEXES_ALLOWED_TO_IMPORT_COMPAT)}
    assert edges <= KNOWN_CORE_TO_COMPAT, f"core modules importing rloo.compat: {sorted(edges - KNOWN_CORE_TO_COMPAT)}"
