"""The package's shape stays readable (issues 18, 35 and 53): no import cycle inside ``steptp``,
the packages in a layer order held as data (:data:`LAYERS`: no import up the order, no two
packages importing each other), no module over 1,000 lines, the spine's lower layers (``runner/``, ``backend/``) import
nothing from the layers above them, and the spine's shared names are defined once.

A small AST pass over ``engine/steptp`` reads every import, function-level ones included,
resolves relative imports, and looks for strongly connected components (Tarjan) of the
module graph. ``from pkg import name`` points at ``pkg.name`` when that is a module, else
at ``pkg``. A package's ``__init__`` that re-exports its own submodules is not a cycle by
itself (it is how a package publishes its API), so :func:`import_graph` leaves edges from a
package to its own submodules out by default; an edge from a submodule back to its
package's ``__init__`` is kept. The cycle test uses ``with_packages=True`` as well: importing
``steptp.rules`` runs ``rules/__init__``, which imports its submodules, so a path into a
package that comes back out of one of its submodules is a real circle (issue 35:
engine/apply -> engine/service -> rules -> rules/checks -> engine/apply).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG_ROOT = Path(__file__).resolve().parents[1] / "engine" / "steptp"
MAX_LINES = 1000


def _modules() -> dict[str, Path]:
    mods = {}
    for p in sorted(PKG_ROOT.rglob("*.py")):
        rel = p.relative_to(PKG_ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _is_package(mods: dict[str, Path], name: str) -> bool:
    return name in mods and mods[name].name == "__init__.py"


def import_graph(with_packages: bool = False) -> dict[str, set[str]]:
    """Module -> the ``steptp`` modules it imports (anywhere in the file). ``with_packages``:
    keep the edges from a package's ``__init__`` to its own submodules."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        base = name if _is_package(mods, name) else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    mod = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = []
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    targets.append(sub if sub in mods else mod)
            else:
                continue
            for t in targets:
                while t and t not in mods:  # `import steptp.x.y` names the innermost module known
                    t = t.rpartition(".")[0]
                if not t or t == name:
                    continue
                if not with_packages and _is_package(mods, name) and t.startswith(name + "."):
                    continue  # a package publishing its own submodules
                deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan 1972)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == [], "import cycles inside steptp: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycles_through_package_inits():
    found = cycles(import_graph(with_packages=True))
    assert found == [], "import cycles inside steptp: " + "; ".join(" <-> ".join(c) for c in found)


#: The package layer order, lowest first (issue 53): each entry is a subpackage of ``steptp``
#: or one of its top-level modules (``steptp`` itself is its ``__init__``). A package may
#: import its own layer and the layers below it, never one above, and no two packages import
#: each other (so the package-level import graph is acyclic). A new package is placed here.
LAYERS: list[tuple[str, ...]] = [
    ("steptp", "steptp.seeds", "steptp.io", "steptp.faults", "steptp.resources", "steptp.timelimit",
     "steptp.positions"),
    ("steptp.leir",),
    ("steptp.roofline", "steptp.backend"),   # backend.poison: the NaN table the runner compares with
    ("steptp.cost_model",),
    ("steptp.runner",),
    ("steptp.verify", "steptp.engine"),
    ("steptp.frontend", "steptp.llm"),       # llm.format: the chat format the dataset writes
    ("steptp.programs", "steptp.gpu"),
    ("steptp.rules",),                       # rules.service: the engine service, which loads rules
    ("steptp.dataset", "steptp.policy", "steptp.rewards"),   # dataset.testset: stp testset's cases
    ("steptp.search",),
    ("steptp.eval",),
    ("steptp.cli",),
]


def package_of(module: str) -> str:
    """``steptp.x`` of a module ``steptp.x[.y...]`` (``steptp`` for the package's own ``__init__``)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, set[tuple[str, str]]]]:
    """``{package: {imported package: {(module, imported module), ...}}}`` of a module graph,
    edges inside one package left out."""
    out: dict[str, dict[str, set[tuple[str, str]]]] = {}
    for m, deps in graph.items():
        row = out.setdefault(package_of(m), {})
        for d in deps:
            if package_of(d) != package_of(m):
                row.setdefault(package_of(d), set()).add((m, d))
    return out


def layer_violations(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """Every package import that goes up the layer order, and every pair of packages that
    import each other, as sentences naming the modules."""
    rank = {p: i for i, layer in enumerate(layers) for p in layer}
    pg = package_graph(graph)
    bad = []
    for a, row in sorted(pg.items()):
        for b, why in sorted(row.items()):
            if rank[b] > rank[a]:
                bad.append(f"{a} (layer {rank[a]}) imports {b} (layer {rank[b]}): "
                           + ", ".join(f"{m} -> {d}" for m, d in sorted(why)))
            if a < b and a in pg.get(b, {}):
                bad.append(f"{a} and {b} import each other")
    return bad


def test_the_package_layer_order_holds():
    g = import_graph(with_packages=True)
    listed = [p for layer in LAYERS for p in layer]
    assert len(listed) == len(set(listed)), "a package is listed in two layers"
    assert {package_of(m) for m in g} == set(listed), \
        f"packages not in LAYERS: {sorted({package_of(m) for m in g} - set(listed))}; " \
        f"listed but gone: {sorted(set(listed) - {package_of(m) for m in g})}"
    bad = layer_violations(g, LAYERS)
    assert bad == [], "package imports against the layer order:\n" + "\n".join(bad)


def test_the_package_graph_is_acyclic():
    g = import_graph(with_packages=True)
    pg = {a: set(row) for a, row in package_graph(g).items()}
    found = cycles(pg)
    assert found == [], "package import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_layer_order_check_sees_an_upward_and_a_mutual_import():
    """A fabricated graph: one lazy upward import and two packages of one layer that import
    each other are both named."""
    layers = [("steptp.a", "steptp.b"), ("steptp.c",)]
    g = {"steptp.a.x": {"steptp.c.y"}, "steptp.c.y": set(), "steptp.a.z": {"steptp.b"},
         "steptp.b": {"steptp.a.x"}}
    bad = layer_violations(g, layers)
    assert sorted(bad) == ["steptp.a (layer 0) imports steptp.c (layer 1): steptp.a.x -> steptp.c.y",
                           "steptp.a and steptp.b import each other"]
    assert layer_violations({"steptp.c.y": {"steptp.a.x"}, "steptp.a.x": set()}, layers) == []


#: What the spine's lower layers may not import, lazily or not (issue 35).
UPPER = ("steptp.verify", "steptp.search", "steptp.dataset", "steptp.eval", "steptp.policy", "steptp.gpu",
         "steptp.cli")


def _below(name: str, layers: tuple[str, ...]) -> bool:
    return any(name == x or name.startswith(x + ".") for x in layers)


def test_runner_and_backend_import_nothing_above_them():
    g = import_graph(with_packages=True)
    bad = {m: sorted(d for d in deps if _below(d, UPPER)) for m, deps in g.items()
           if _below(m, ("steptp.runner", "steptp.backend"))}
    bad = {m: d for m, d in bad.items() if d}
    assert bad == {}, f"runner/backend modules importing upper layers: {bad}"


def test_engine_imports_nothing_above_it():
    """The rule engine sits under the rules, the dataset and the policies (issue 35: the CoT
    renderer moved into engine/, the seed derivation into steptp.seeds). The engine service,
    which loads rule sets by their spec for its worker, is ``steptp.rules.service`` (issue 53)."""
    g = import_graph(with_packages=True)
    upper = UPPER + ("steptp.rules",)
    bad = {m: sorted(d for d in deps if _below(d, upper)) for m, deps in g.items()
           if _below(m, ("steptp.engine",))}
    bad = {m: d for m, d in bad.items() if d}
    assert bad == {}, f"engine modules importing upper layers: {bad}"


def test_policy_and_cost_models_import_nothing_from_the_search():
    """The search sits above the policies and the cost models (issue 45: MetaSchedule's
    SearchStrategy uses a CostModel, never the reverse)."""
    g = import_graph(with_packages=True)
    bad = {m: sorted(d for d in deps if _below(d, ("steptp.search",))) for m, deps in g.items()
           if _below(m, ("steptp.policy", "steptp.cost_model"))}
    bad = {m: d for m, d in bad.items() if d}
    assert bad == {}, f"policy/cost_model modules importing the search: {bad}"
    assert any(_below(m, ("steptp.cost_model",)) for m in g), "no steptp.cost_model package"


def test_one_search_node_and_one_proposer():
    """One search-node class and one proposer (issue 45: the round search had its own Node and
    its own proposer beside the policy)."""
    found = definitions({"Node", "Search", "EnginePolicy"})
    # (leir.ast.Node is the IR's node type union, not a search node)
    assert [m for m in found["Node"] if m != "steptp.leir.ast"] == ["steptp.search.core"], found
    assert found["Search"] == ["steptp.search.core"] and found["EnginePolicy"] == ["steptp.policy.engine"], found


def test_layer_checks_see_a_bad_import():
    """The layer test reads function-level imports: a fabricated graph with one lazy upward
    edge is caught by the same predicate."""
    assert _below("steptp.verify", UPPER) and _below("steptp.search.run", UPPER)
    assert not _below("steptp.runner.device", UPPER) and not _below("steptp.policyx", ("steptp.policy",))


def definitions(names: set[str]) -> dict[str, list[str]]:
    """``{name: [module, ...]}``: where each of ``names`` is bound by a ``class``, ``def`` or
    assignment (any nesting level) in ``engine/steptp``; imports do not count."""
    out: dict[str, list[str]] = {n: [] for n in names}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            bound: list[str] = []
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                bound = [node.name]
            elif isinstance(node, ast.Assign):
                bound = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bound = [node.target.id]
            for b in bound:
                if b in out:
                    out[b].append(name)
    return out


def test_spine_names_are_defined_once():
    """``DEVICES`` in runner/device.py; ``Proposal``, ``Policy`` in policy/base.py,
    ``EnginePolicy`` in policy/engine.py; one ``CostModel``; no copies and no aliases
    (``Policy = ...``) anywhere else."""
    found = definitions({"DEVICES", "Proposal", "Policy", "EnginePolicy", "seeded_rng"})
    assert found == {"DEVICES": ["steptp.runner.device"], "Proposal": ["steptp.policy.base"],
                     "Policy": ["steptp.policy.base"], "EnginePolicy": ["steptp.policy.engine"],
                     "seeded_rng": ["steptp.seeds"]}, found


#: Modules still building their own worker, owned by other engineers; they move to
#: steptp.runner.pool.shared next (issue 35).
WORKER_PENDING: set = set()


def test_workers_are_built_only_inside_the_runner():
    """``IsolatedRunner(...)`` is called only in ``steptp.runner`` (the pool); everyone else
    asks :func:`steptp.runner.pool.shared`."""
    calls = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Name) and f.id == "IsolatedRunner") or \
                        (isinstance(f, ast.Attribute) and f.attr == "IsolatedRunner"):
                    calls.add(name)
    outside = {m for m in calls if not _below(m, ("steptp.runner",))} - WORKER_PENDING
    assert outside == set(), f"IsolatedRunner built outside steptp.runner: {sorted(outside)}"
    assert "steptp.runner.pool" in calls


def test_seed_derivation_and_writers_sit_at_the_bottom():
    """steptp.seeds and steptp.io import nothing from the package, so every layer may use them."""
    g = import_graph(with_packages=True)
    assert g["steptp.seeds"] == set() and g["steptp.io"] == set()


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_graph_sees_function_level_imports():
    g = import_graph()
    # cli.common imports the LEIR loader inside a function body
    assert "steptp.leir" in g["steptp.cli.common"] or any(d.startswith("steptp.leir.") for d in g["steptp.cli.common"])


def test_no_module_over_1000_lines():
    big = {str(p.relative_to(PKG_ROOT.parent)): n for p in PKG_ROOT.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


#: Issue 53: the search's and the policies' modules stay small, one job each.
MAX_SEARCH_LINES = 500


def test_search_and_policy_modules_stay_under_500_lines():
    big = {str(p.relative_to(PKG_ROOT.parent)): n for sub in ("search", "policy")
           for p in (PKG_ROOT / sub).glob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_SEARCH_LINES}
    assert big == {}, f"search/policy modules over {MAX_SEARCH_LINES} lines: {big}"


def test_the_gpu_front_end_needs_nothing_from_the_dataset():
    """A pack's signature helpers come from ``leir/`` (issue 53), not from ``dataset/``."""
    g = import_graph(with_packages=True)
    bad = {m: sorted(d for d in deps if _below(d, ("steptp.dataset",))) for m, deps in g.items()
           if _below(m, ("steptp.gpu",))}
    assert {m: d for m, d in bad.items() if d} == {}


def test_one_cost_model_name_and_one_ranking_home():
    """One class named ``CostModel`` (the protocol of ``cost_model/``), and the policies and the
    search rank through :func:`steptp.cost_model.create`, never the static model directly."""
    assert definitions({"CostModel"}) == {"CostModel": ["steptp.cost_model"]}
    g = import_graph(with_packages=True)
    bad = {m: sorted(d for d in deps if d == "steptp.cost_model.static") for m, deps in g.items()
           if _below(m, ("steptp.policy", "steptp.search"))}
    assert {m: d for m, d in bad.items() if d} == {}


def test_every_subpackage_is_listed_in_pyproject():
    """pyproject.toml lists packages explicitly; a subpackage missing there installs without
    its modules (the tests run against the installed, non-editable package)."""
    import tomllib

    listed = set(tomllib.loads((PKG_ROOT.parents[1] / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.relative_to(PKG_ROOT.parent).parts[:-1]) for p in PKG_ROOT.rglob("__init__.py")}
    assert found - listed == set()
