"""The layers run one way: conf -> harness -> impls -> kernels, and inside harness/ its rooms run one way too.

Nothing lower imports anything higher, and no modules import each other round in a circle (within a room
too). Every import counts, the ones inside functions too (a lazy import is still a dependency). And no
source file is over 400 lines: split by concept, not cut in the middle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

LAYERS = ["harness", "impls", "kernels"]  # each may import only itself and what follows it

# harness/'s rooms and what each may import besides itself (and impls/, kernels/): lowest first.
FOUNDATION = {"harness.errors", "harness.paths", "harness.results", "harness.untrusted", "harness.console"}
ROOMS: dict[str, set[str]] = {
    "harness.errors": set(),
    "harness.paths": set(),
    "harness.results": set(),  # the tidy row schema and how tables are written
    "harness.console": set(),  # every command's Unix manners: one-line usage errors, quiet closed pipes
    # SECURITY.md's rules: how a folder kvbench did not make is read and written (its CSVs as results writes
    # them), and how git is asked about the checkout (read-only, from the checkout's root)
    "harness.untrusted": {"harness.results", "harness.paths"},
    "harness.model": FOUNDATION,
    "harness.config": FOUNDATION | {"harness.model"},  # the schema's model group is the model's own config
    "harness.measure": FOUNDATION,
    "harness.kv": FOUNDATION | {"harness.config", "harness.model", "harness.measure"},
    "harness.serving": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv"},
    "harness.scenarios": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv",
                                       "harness.serving"},
    "harness.job": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv",
                                 "harness.serving", "harness.scenarios"},
    "harness.front": FOUNDATION | {"harness.config", "harness.model", "harness.measure", "harness.kv",
                                   "harness.serving", "harness.scenarios", "harness.job"},
    # The report reads finished tables: the row schema, and the GPU specs in conf/gpu/.
    "harness.report": FOUNDATION | {"harness.measure"},  # measure: the definitions of figures it recomputes
    # The entry points: ``python -m harness``, and the old module paths kept for the commands users type.
    "harness.__main__": {"harness.front", "harness.console"},
    "harness.replay": {"harness.front"},
    "harness.job_identity": {"harness.job"},
    "harness": set(),  # harness/__init__.py
}


def written_imports(path: Path) -> set[str]:
    """The module names ``path`` imports, as written (``kvbench.harness.kv.budget``, ``torch``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module in ("kvbench.harness", "kvbench.kernels"):  # ``from kvbench.harness import scenarios``
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def imported_modules(path: Path) -> set[str]:
    """kvbench's own modules by their folder names (``harness.kv.budget``: the import ``kvbench.harness.kv.budget``),
    anything else as written."""
    return {name.removeprefix("kvbench.") for name in written_imports(path)}


def imported_packages(path: Path) -> set[str]:
    return {name.split(".")[0] for name in imported_modules(path)}


def room_of(module: str) -> str | None:
    """The longest room name that ``module`` is, or is inside of."""
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in ROOMS:
            return ".".join(parts[:k])
    return None


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


HARNESS_FILES = sorted((REPO_ROOT / "harness").rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS[1:])
def test_no_lower_layer_imports_a_higher_one(layer):
    higher = set(LAYERS[: LAYERS.index(layer)])
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path) & higher)
        for path in sorted((REPO_ROOT / layer).rglob("*.py"))
        if imported_packages(path) & higher
    }
    assert not offenders, f"{layer}/ imports a higher layer: {offenders}"


def test_every_harness_module_is_in_a_room():
    homeless = [module_name(p) for p in HARNESS_FILES if room_of(module_name(p)) is None]
    assert not homeless, f"modules in no room of ROOMS: {homeless}"


def climbs(path: Path, module: str) -> list[str]:
    """The modules ``path`` (the module ``module``) imports from rooms its own room may not import."""
    own = room_of(module)
    return sorted(m for m in imported_modules(path) if m.startswith("harness")
                  and (r := room_of(m)) is not None and r != own and r not in ROOMS[own])


def test_each_room_imports_only_what_lies_below_it():
    offenders = {str(p.relative_to(REPO_ROOT)): bad for p in HARNESS_FILES if (bad := climbs(p, module_name(p)))}
    assert not offenders, f"imports a room its own may not (tests/test_layering.py ROOMS): {offenders}"


def test_the_room_rules_can_fail(tmp_path):
    """The check sees a climb, a lazy one included: serving/ importing front/ inside a function."""
    module = tmp_path / "climb.py"
    module.write_text("def f():\n    from harness.front.resolve import resolve\n")
    assert climbs(module, "harness.serving.climb") == ["harness.front.resolve"]
    assert climbs(module, "harness.front.climb") == []


def test_few_modules_sit_at_the_top_of_harness():
    top = sorted(p.name for p in (REPO_ROOT / "harness").glob("*.py"))
    assert len(top) <= 8, top


def test_the_cli_entry_point_does_not_load_torch():
    """`python -m harness --help` and `--cfg job` only read configs: torch (about 1-2 s) is not imported."""
    import subprocess
    import sys

    code = "import sys, harness.__main__; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT).returncode == 0


# ---- no import cycles ---------------------------------------------------------------------------------

def source_modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    """Every module of harness/, impls/ and kernels/ by its dotted name (a package by its __init__.py)."""
    return {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
            for layer in LAYERS for p in sorted((root / layer).rglob("*.py"))}


def named_imports(path: Path, module: str) -> set[str]:
    """The dotted names every import of the file names, wherever it stands (in a function, under
    TYPE_CHECKING): ``import a.b`` names a.b; ``from a import b`` names a and a.b (b may be a submodule);
    a relative import is made absolute first."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module and the modules among ``modules`` it imports: a name resolves to the longest module it is,
    or is inside of (``harness.config.Config`` is harness.config)."""
    def owner(name: str) -> str | None:
        parts = name.split(".")
        return next((m for k in range(len(parts), 0, -1) if (m := ".".join(parts[:k])) in modules), None)

    return {module: {m for name in named_imports(path, module) if (m := owner(name)) not in (None, module)}
            for module, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` for each group of modules that import each other round in a circle
    (a strongly connected component of the graph, Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return [_cycle_through(graph, group) for group in groups]


def _cycle_through(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself, through the group."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {sorted(group)}")  # a strongly connected group always has one


def test_no_import_cycles():
    cycles = import_cycles(import_graph(source_modules()))
    assert not cycles, "modules that import each other (a lazy import counts; move the shared part to a module " \
        "both import): " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_can_fail(tmp_path):
    """A cycle closed by a lazy import of a submodule through its package (``from p import b``) is seen."""
    package = tmp_path / "harness" / "p"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from harness.p.b import thing\n")
    (package / "b.py").write_text("def f():\n    from harness.p import c\n")
    (package / "c.py").write_text("from . import a\nimport harness.p.b\n")
    (package / "d.py").write_text("from harness.p.a import x\n")  # imports into the cycle, not part of it
    graph = import_graph(source_modules(tmp_path))
    assert graph["harness.p.b"] == {"harness.p", "harness.p.c"}
    assert import_cycles(graph) == [["harness.p.a", "harness.p.b", "harness.p.c", "harness.p.a"]]
    (package / "b.py").write_text("def f():\n    from harness.p import thing\n")  # a name, not the module c
    assert import_cycles(import_graph(source_modules(tmp_path))) == []


# ---- no file over 400 lines -----------------------------------------------------------------------------

MAX_LINES = 400
# The files still over MAX_LINES that cannot be split today, with their length when listed (wc -l). The list
# only shrinks: a listed file may not grow, and one split below MAX_LINES must leave the list.
TOO_LONG_TODAY: dict[str, int] = {}
CSRC_SUFFIXES = (".cpp", ".cu", ".h", ".cuh")


def sized_files(root: Path = REPO_ROOT) -> list[Path]:
    """The .py files of harness/, impls/ and kernels/, and the C++ and CUDA sources of kernels/csrc/."""
    return sorted([p for layer in LAYERS for p in (root / layer).rglob("*.py")]
                  + [p for p in (root / "kernels" / "csrc").rglob("*") if p.suffix in CSRC_SUFFIXES])


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n")  # as wc -l counts


def test_no_file_is_over_400_lines():
    offenders = {rel: n for p in sized_files() if (n := line_count(p)) > MAX_LINES
                 and (rel := p.relative_to(REPO_ROOT).as_posix()) not in TOO_LONG_TODAY}
    assert not offenders, f"files over {MAX_LINES} lines (split them by concept): {offenders}"


def test_the_too_long_list_only_shrinks():
    wrong = {}
    for rel, listed in TOO_LONG_TODAY.items():
        path = REPO_ROOT / rel
        if not path.is_file():
            wrong[rel] = "gone: take it off TOO_LONG_TODAY"
        elif (n := line_count(path)) <= MAX_LINES:
            wrong[rel] = f"{n} lines now: take it off TOO_LONG_TODAY"
        elif n > listed:
            wrong[rel] = f"{n} lines, grown past the {listed} listed: split it, or bring it back to {listed}"
    assert not wrong, wrong


OWN_FOLDERS = ("harness", "impls", "kernels")


def test_kvbench_code_imports_its_own_folders_only_under_the_kvbench_name():
    """``import kernels`` would be Hugging Face's distribution (or, from the checkout's root, a second copy of
    kvbench's code): every import of kvbench's own folders is written ``kvbench.<folder>`` (pyproject.toml)."""
    files = [p for top in (*OWN_FOLDERS, "tests", "hydra_plugins") for p in sorted((REPO_ROOT / top).rglob("*.py"))]
    offenders = {str(p.relative_to(REPO_ROOT)): sorted(bad) for p in files
                 if (bad := {m for m in written_imports(p) if m.split(".")[0] in OWN_FOLDERS})}
    assert not offenders, f"imports kvbench's folders by their bare names: {offenders}"


def test_kernels_is_a_namespace_folder_that_never_shadows_an_installed_kernels_package():
    assert not (REPO_ROOT / "kernels" / "__init__.py").exists()


def test_transformers_and_hugging_faces_kernels_import_beside_kvbench_from_the_checkouts_root():
    """From the checkout's root (on sys.path, as for `python -m harness`), ``import kernels`` is Hugging Face's
    distribution when it is installed (transformers >= 5.25 requires it), and kvbench's kernels still import."""
    pytest.importorskip("transformers")
    code = ("import importlib.util, sys; import kvbench.kernels.registry as r; import transformers; "
            "transformers.LlamaForCausalLM; spec = importlib.util.find_spec('kernels'); "
            "print(r.__file__); print(spec.origin if spec else None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    ours, theirs = out.stdout.split()
    assert Path(ours) == REPO_ROOT / "kernels" / "registry.py"
    assert theirs == "None" or not Path(theirs).is_relative_to(REPO_ROOT / "kernels")
