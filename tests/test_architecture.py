"""The package's import graph: no loops, no import from a lower floor up to a higher one, algo/ imports only
torch, and the core never imports the TRL compatibility layer.

Every `import` in src/rloo counts, including the ones inside functions (a lazy import is still a
dependency). `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`.
Importing `a.b.c` is not counted as importing `a` and `a.b` (their `__init__` runs, but every module
would then depend on the package door)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ANNEXES_ALLOWED_TO_IMPORT_COMPAT = ("rloo.compat", "rloo.cli")  # and the public door, `rloo` itself

# Exceptions, by name (none today): a new edge of either kind fails the tests below.
KNOWN_CORE_TO_COMPAT: set[tuple[str, str]] = set()
KNOWN_LOOPS: list[set[str]] = []


def module_names():
    names = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        names[".".join(parts)] = (path, is_package)
    return names


def runtime_nodes(tree):
    """Every node but those under `if TYPE_CHECKING:` (imports for annotations, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph():
    modules = module_names()
    graph = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        for node in runtime_nodes(ast.parse(path.read_text())):
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


# The floors of the house, lowest first: a package or root module imports only from its own floor or the floors
# below. docs/architecture.md draws them; a new package must be given a floor here.
FLOORS = (
    # no rloo imports (algo: the math, torch only; field_types: the type rule of the config's fields)
    ("foundations", {"algo", "_version", "safe_text", "event_loop", "field_types"}),
    ("the config", {"config", "config_checks"}),
    ("inputs", {"data", "tools", "passes", "distributed", "model_loading"}),  # datasets, tools, model passes, devices
    ("samplers and rewards", {"generation", "rewards"}),
    ("the rollout", {"rollout"}),                                # step 1 and 2: sample and score a rollout
    ("the run's records", {"run"}),                              # checkpoints, metrics, trackers, reports, Trainer API
    ("the loop", {"builders", "update", "evaluation", "trainer"}),
    ("front doors", {"rloo", "compat", "cli", "toy", "assets"}),  # the public door, TRL names, CLI, demos, assets
)
# Modules that only the standard library and torch may be imported by (beyond their own package).
PURE_MATH = "rloo.algo"


def floor_of(module):
    """The floor of a module: its top-level package under rloo (or its root module's name)."""
    unit = module.split(".")[1] if "." in module else module
    for number, (_, units) in enumerate(FLOORS):
        if unit in units:
            return number
    raise AssertionError(f"{module} is on no floor: add `{unit}` to FLOORS in tests/test_architecture.py")


def test_every_package_is_on_one_floor():
    units = [unit for _, floor in FLOORS for unit in floor]
    assert len(units) == len(set(units)), "a package is on two floors"
    for module in import_graph():
        floor_of(module)


def test_no_import_from_a_lower_floor_up_to_a_higher_one():
    graph = import_graph()
    upward = sorted(f"{name} ({FLOORS[floor_of(name)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})"
                    for name, targets in graph.items() for target in targets if floor_of(target) > floor_of(name))
    assert not upward, "imports up the floors:\n" + "\n".join(upward)


def test_algo_imports_only_torch():
    """algo/ is the math: torch, the standard library and algo itself, nothing of the models, data or the run
    (every import counts here, annotation-only ones too)."""
    import sys

    outside = []
    for path in sorted((SRC / "rloo" / "algo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module]
            else:
                continue  # a relative import stays inside algo/
            outside += [f"{path.name}: {name}" for name in names if not (
                name == "torch" or name.startswith(("torch.", PURE_MATH + ".")) or name.split(".")[0] in sys.stdlib_module_names)]
    assert not outside, f"algo/ imports more than torch: {outside}"


def test_the_core_does_not_import_the_trl_layer():
    graph = import_graph()
    edges = {(name, target) for name, targets in graph.items() for target in targets
             if target.startswith("rloo.compat") and name != "rloo" and not name.startswith(ANNEXES_ALLOWED_TO_IMPORT_COMPAT)}
    assert edges <= KNOWN_CORE_TO_COMPAT, f"core modules importing rloo.compat: {sorted(edges - KNOWN_CORE_TO_COMPAT)}"


# The loop (trainer, update, evaluation), its contracts (config), what builds its parts, and the leaf helpers.
ROOT_MODULES = {"__init__", "_version", "config", "config_checks", "trainer", "update", "evaluation", "builders", "model_loading",
                "safe_text", "event_loop", "field_types"}
# Files over the line limit that are field documentation: the config's fields, and TRL's field table.
FIELD_DOCS = {"config.py", "compat/config_fields.py"}
MAX_FUNCTION_LINES, MAX_FILE_LINES = 60, 400


def test_the_root_holds_the_loop_and_its_contracts():
    root = {path.stem for path in (SRC / "rloo").glob("*.py")}
    assert root == ROOT_MODULES, f"modules at the package root: {sorted(root)}; stages and annexes go in folders"


def test_no_function_over_60_lines_and_no_file_over_400():
    too_long = []
    for path in sorted((SRC / "rloo").rglob("*.py")):
        name, text = path.relative_to(SRC / "rloo").as_posix(), path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES and name not in FIELD_DOCS:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}: {node.name} {length} lines")
    assert not too_long, too_long


# ------------------------------------------------------------------ the seams (issue #45)

ROLLOUT_SOURCE_KINDS = {"rloo.rollout.dynamic_sampling", "rloo.rollout.async_rollouts"}


def test_the_trainer_reaches_the_rollout_source_kinds_only_through_the_factory():
    """The trainer holds one `rollout.sources.RolloutSource`; which kind it is, is decided in `rollout_source`."""
    graph = import_graph()
    assert "rloo.rollout.sources" in graph["rloo.trainer"]
    assert not graph["rloo.trainer"] & ROLLOUT_SOURCE_KINDS, sorted(graph["rloo.trainer"] & ROLLOUT_SOURCE_KINDS)


STEP1_MODULES = ("rloo.rollout.prompt_stages", "rloo.rollout.multi_turn")
STEP1_CALLERS = {"rloo.rollout", "rloo.trainer", "rloo.builders", "rloo.run.trainer_api"}


def _parameters(path):
    return {arg.arg for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]}


def test_step1_takes_a_sampling_function_not_its_caller():
    """Text, image and multi-turn prompts (`rollout.prompt_stages`) get a sampling function and their token budgets:
    they import neither the collector nor the trainer, and no function of theirs takes one."""
    graph, modules = import_graph(), module_names()
    for name in STEP1_MODULES:
        assert not graph[name] & STEP1_CALLERS, f"{name} imports {sorted(graph[name] & STEP1_CALLERS)}"
        assert not _parameters(modules[name][0]) & {"collector", "trainer"}, name


def _assigned_attributes_of_a_sampler(tree):
    """`x.sampler.attr = ...` and `sampler.attr = ...` (plain, augmented or in setattr) in a module."""
    def is_sampler(node):
        return (isinstance(node, ast.Name) and node.id == "sampler") or \
            (isinstance(node, ast.Attribute) and node.attr == "sampler")

    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        found += [ast.unparse(t) for t in targets if isinstance(t, ast.Attribute) and is_sampler(t.value)]
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and is_sampler(node.args[0]):
            found.append(ast.unparse(node))
    return found


def test_the_sampler_is_never_changed_outside_generation():
    """A sampler is configured once (`builders.default_sampler`); a call that needs fewer tokens passes
    `max_new_tokens` (`generation.base.length_limit`) instead of rewriting the sampler for a while."""
    changed = []
    for name, (path, _) in module_names().items():
        if not name.startswith("rloo.generation"):
            changed += [f"{name}: {target}" for target in _assigned_attributes_of_a_sampler(ast.parse(path.read_text()))]
    assert not changed, changed


# --- One config: the core reads only the fields of rloo.config.RLOOConfig (issue #45) ---
# The config travels through the core as `self.args` / `trainer.args` (any `<x>.args`), as a parameter named
# `args` (unannotated or `Any`), as any parameter, local or dataclass field annotated `RLOOConfig`, and as a
# local bound to one of those or to `RLOOConfig(...)`. On each, every attribute read or write, and every
# getattr/hasattr/setattr/vars, must name a field or a declared member (a property such as
# completions_per_step, to_dict). TRL's other names live in compat/ only, which maps them onto fields.
CONFIG_ANNEXES = ("compat/", "cli/")  # and the public door, __init__.py
# getattr(config, name) with a computed name, by (module, function): the names each iterates are fields.
KNOWN_DYNAMIC_CONFIG_READS = {
    ("config_checks.py", "_check_batch_sizes"),  # a tuple of integer fields
    ("config_checks.py", "_check_engine_options"),  # config_checks.GENERATION_KWARGS' values
    ("run/checkpoint.py", "changed"),  # checkpoint's OPTIMIZER_FIELDS and the other tuples of fields
}


def _annotation_names(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        node = ast.parse(node.value, mode="eval").body
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))} \
        if node is not None else set()


def _names_the_config(annotation, name):
    names = _annotation_names(annotation)
    return "RLOOConfig" in names or (name == "args" and names <= {"Any"})


def config_uses(source):
    """(line, function, attribute or None for a computed getattr) of every use of the config in `source`."""
    tree = ast.parse(source)
    fields = {"args"} | {stmt.target.id for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for stmt in node.body
                         if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                         and _names_the_config(stmt.annotation, "")}

    def is_config(expr, names):
        return (isinstance(expr, ast.Name) and expr.id in names) or (
            isinstance(expr, ast.Attribute) and expr.attr in fields and isinstance(expr.value, (ast.Name, ast.Attribute)))

    def bound_in(function, names):
        names = set(names)
        for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]:
            (names.add if _names_the_config(arg.annotation, arg.arg) else names.discard)(arg.arg)
        for node in ast.walk(function):
            value = getattr(node, "value", None)
            config_call = isinstance(value, ast.Call) and "RLOOConfig" in _annotation_names(value.func)
            if isinstance(node, ast.Assign) and (is_config(value, names) or config_call):
                names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (
                    _names_the_config(node.annotation, "") or config_call):
                names.add(node.target.id)
        return names

    uses = []

    def visit(node, names, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names, function = bound_in(node, names), node.name
        if isinstance(node, ast.Attribute) and is_config(node.value, names):
            uses.append((node.lineno, function, node.attr))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args
                and node.func.id in ("getattr", "hasattr", "setattr", "vars", "delattr") and is_config(node.args[0], names)):
            name = node.args[1] if len(node.args) > 1 else None
            uses.append((node.lineno, function, name.value if isinstance(name, ast.Constant) else None))
        for child in ast.iter_child_nodes(node):
            visit(child, names, function)

    visit(tree, set(), "<module>")
    return uses


def config_members():
    import dataclasses

    from rloo.config import RLOOConfig

    return {f.name for f in dataclasses.fields(RLOOConfig)} | {n for n in vars(RLOOConfig) if not n.startswith("_")}


def test_the_core_reads_only_the_configs_fields():
    members, bad, seen = config_members(), [], 0
    for path in sorted((SRC / "rloo").rglob("*.py")):
        name = path.relative_to(SRC / "rloo").as_posix()
        if name.startswith(CONFIG_ANNEXES) or name == "__init__.py":
            continue
        for line, function, attribute in config_uses(path.read_text()):
            seen += 1
            if attribute is None and (name, function) not in KNOWN_DYNAMIC_CONFIG_READS:
                bad.append(f"{name}:{line} ({function}): getattr with a computed name; name the field")
            elif attribute is not None and attribute not in members:
                bad.append(f"{name}:{line} ({function}): `{attribute}` is not a field of RLOOConfig (rloo/config.py)")
    assert seen > 300, f"the rule sees only {seen} uses of the config: it no longer finds where the config travels"
    assert not bad, "the core reads names that are not RLOOConfig fields; make each a documented field:\n" + "\n".join(bad)


def test_the_config_rule_sees_each_way_the_config_travels():
    source = '''
@dataclass
class Learner:
    settings: RLOOConfig

    def step(self):
        return self.settings.beta, self.settings.sync_every

def f(args, cfg: "RLOOConfig | None", other: argparse.Namespace, trainer):
    c = trainer.args
    made = RLOOConfig(beta=0.1)
    return (args.hub_model_id, cfg.min_p, other.host, c.kl_coef, getattr(args, "x", 1), made.steps_per_gen,
            args.__dict__["_trl_values"], getattr(c, name))
'''
    uses = [attribute for _, _, attribute in config_uses(source)]
    assert uses == ["beta", "sync_every", "hub_model_id", "min_p", "kl_coef", "x", "steps_per_gen", "__dict__", None]
    members = config_members()  # an alias (kl_coef), a private dict and made-up names are not members
    assert [a for a in uses if a is not None and a not in members] == ["sync_every", "kl_coef", "x", "steps_per_gen",
                                                                       "__dict__"]


def test_no_class_is_patched_after_its_definition():
    """No module assigns `<x>.__init__` or `<x>.__getattr__`, directly or by setattr (compat/ once patched
    RLOOConfig's, which gave the core a second, hidden config)."""
    special = ("__init__", "__getattr__", "__getattribute__")
    patched = []
    for path in (SRC / "rloo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            by_setattr = (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1
                          and isinstance(node.args[1], ast.Constant) and node.args[1].value in special)
            if by_setattr or any(isinstance(t, ast.Attribute) and t.attr in special for t in targets):
                patched.append(f"{path.relative_to(SRC).as_posix()}:{node.lineno}")
    assert patched == []
