"""The tree's own rules (docs/ARCHITECTURE.md): imports go one way, each fact has one home,
test hooks stay out of the public headers. Read from the source tree, not the installed package."""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "python" / "qrnn"
PUBLIC_HEADERS = REPO / "cpp" / "include" / "qrnn"
COMPILED = {"qrnn._C", "qrnn.bench._baseline"}  # extension modules: they import nothing back


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (`from . import x` resolves later, per name)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict:
    """{module: {qrnn modules it imports, at any depth of its code}}. An import inside a
    function still ties the two modules together, so it counts as much as a top-level one."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                           if f"{base}.{a.name}" not in COMPILED]
            for target in targets:
                while target and target not in files:  # qrnn.ops.forget_mult.x -> qrnn.ops.forget_mult
                    target = target.rpartition(".")[0]
                if target.startswith("qrnn") and target != name:
                    graph[name].add(target)
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on_stack: set = set()
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_graph_sees_imports():
    """The checker itself: it must see the package's known imports (else the test below is empty)."""
    graph = import_graph()
    assert "qrnn._C" not in graph  # compiled, not a source file
    kernels = graph["qrnn.ops.forget_mult.kernels"]
    assert "qrnn.ops.core.kernel_args" in kernels  # `from ..core.kernel_args import ...`
    assert "qrnn" not in kernels  # `from ... import _C` is the extension, not the package front
    assert any("qrnn.modules" in targets for targets in graph.values())
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    """Package fronts included: a submodule importing its package's __init__ while that
    __init__ imports the submodule is a cycle too."""
    cycles = _cycles(import_graph())
    assert cycles == [], f"modules that import each other (directly or around a loop): {cycles}"


def test_layers_split_by_concern():
    """qrnn.functional (the functional layer) <- qrnn.modules (today's nn.GRU-style API) <-
    qrnn.pytorch_qrnn (the original pytorch-qrnn API), which only the torchqrnn package and
    no other module of qrnn imports; `import qrnn` does not load it."""
    graph = import_graph()
    assert "qrnn.modules" not in graph["qrnn.functional"]
    assert "qrnn.functional" in graph["qrnn.modules"]
    assert {"qrnn.modules", "qrnn.functional"} & graph["qrnn.pytorch_qrnn"] == {"qrnn.modules"}
    importers = sorted(name for name, targets in graph.items() if "qrnn.pytorch_qrnn" in targets)
    assert importers == [], importers
    original_api = re.compile(r"save_prev_x|use_cuda|prevX|\bhidden=|\blayers=")
    for name in ("functional", "modules"):
        hits = [i for i, line in enumerate((PACKAGE / f"{name}.py").read_text().splitlines(), 1)
                if original_api.search(line)]
        assert hits == [], f"qrnn.{name} names the original API on lines {hits}"
    front = REPO / "python" / "torchqrnn"
    for path in sorted(front.glob("*.py")):
        imports = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        assert imports == {"qrnn.pytorch_qrnn"}, (path.name, imports)


def test_cuda_common_includes_no_family():
    """cuda/common/ holds what both op families' CUDA halves share: none of its files
    includes a family's (cuda/forget_mult/, cuda/qrnn_gates/)."""
    include = re.compile(r'#include\s+"(forget_mult|qrnn_gates)/')
    hits = [f"{p.name}:{i}" for p in sorted((REPO / "cuda" / "common").iterdir()) if p.is_file()
            for i, line in enumerate(p.read_text().splitlines(), 1) if include.search(line)]
    assert hits == []


def test_numpy_only_in_the_train_extra():
    """numpy is the 'train' extra's dependency, not the package's: only qrnn.train and
    qrnn.bench import it (at any depth of their code)."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _module_name(path).split(".")[:2] in (["qrnn", "train"], ["qrnn", "bench"]):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            hits += [f"{path.relative_to(PACKAGE)}: {name}" for name in names if name.split(".")[0] == "numpy"]
    assert hits == []


def test_library_imports_no_application_dependency():
    """tqdm and matplotlib (the 'train' extra) are imported only inside the functions that
    draw a progress bar or a plot, never by a module's top level."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            hits += [f"{path.name}: {name}" for name in names if name.split(".")[0] in ("tqdm", "matplotlib")]
    assert hits == []


def test_no_test_hooks_in_public_headers():
    """Fault injection and other test-only switches live in private headers (cpp/src/)."""
    pattern = re.compile(r"FaultInjection|\bfault_\w|\bfail_(after|errno|throw|times)|\binject|\btesting\b")
    hits = [f"{p.name}:{i}: {line.strip()}" for p in sorted(PUBLIC_HEADERS.glob("*.hpp"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_no_benchmark_code_in_the_library():
    """Benchmark-only kernels build as their own target; the installed headers do not declare them."""
    hits = [p.name for p in PUBLIC_HEADERS.glob("*.hpp") if re.search(r"namespace bench\b|baseline", p.read_text())]
    assert hits == []


def test_version_has_one_home():
    """CMakeLists.txt's project(VERSION) is the version; pyproject.toml reads it from there."""
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^dynamic\s*=\s*\[[^\]]*"version"', pyproject, re.MULTILINE)
    assert not re.search(r'^version\s*=', pyproject, re.MULTILINE)
    assert re.search(r"^project\(qrnn VERSION \d+\.\d+\.\d+", (REPO / "CMakeLists.txt").read_text(), re.MULTILINE)
    version_literals = [p for p in PACKAGE.rglob("*.py") if re.search(r"__version__\s*=\s*['\"]", p.read_text())]
    assert version_literals == []


@pytest.mark.parametrize("rule, pattern", [
    ("staging alignment", r"\b4096\b"),
    ("staging growth", r"\b(2 \* 1024 \* 1024|2 << 20|1 << 21|2097152)\b"),
    ("temporary names", r"re\.compile\(.*(tmp|partial)"),
])
def test_checkpoint_rules_live_in_cpp(rule, pattern):
    """The checkpoint folder rules are C++'s (cpp/src/checkpoint/); Python asks qrnn._C."""
    checkpoint = PACKAGE / "checkpoint"
    files = list(checkpoint.rglob("*.py")) if checkpoint.is_dir() else [PACKAGE / "checkpoint.py"]
    hits = [f"{p.name}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(pattern, line) and not line.lstrip().startswith("#")]
    assert hits == [], f"{rule} written in Python too"


def test_one_plots_folder():
    assert not (REPO / "bench-plots").exists()
    assert any((REPO / "docs" / "benchmarks").glob("*.png"))


def test_one_list_of_op_families_per_language():
    """CMake's QRNN_FAMILIES, the C++ manifests' list (qrnn/families.hpp), the Python list
    (qrnn.ops.FAMILIES) and what qrnn._C binds name the same families in the same order, and
    each has its folders: adding a family is one line in each list plus its own folders."""
    import qrnn.ops

    cmake = (REPO / "CMakeLists.txt").read_text()
    listed = re.search(r"set\(QRNN_FAMILIES\n(.*?)\n\)", cmake, flags=re.S).group(1)
    cmake_families = [line.split("#")[0].strip() for line in listed.splitlines() if line.split("#")[0].strip()]
    header = (PUBLIC_HEADERS / "families.hpp").read_text()
    kernels = re.search(r"#define QRNN_FAMILY_KERNELS\(L\)(.*)", header).group(1)
    header_families = [name.lower() for name in re.findall(r"QRNN_(\w+)_KERNELS\(L\)", kernels)]
    assert cmake_families == header_families == list(qrnn.ops.FAMILIES)
    bound = list(dict.fromkeys(kernel.rsplit("_", 1)[0] for kernel in qrnn._C.kernel_fields()))
    assert bound == cmake_families
    for family in cmake_families:
        assert (REPO / "cpp" / "src" / family / "cpu.cpp").is_file(), family
        assert (PUBLIC_HEADERS / f"{family}.hpp").is_file(), family
        assert f'#include "qrnn/{family}.hpp"' in header
        assert f"QRNN_{family.upper()}_SCHEMAS(S)" in header


FAMILY_NAMES = ("forget_mult", "qrnn_gates", "linear_scan")


def _area(module: str, by_name: bool = False) -> str:
    """The area of docs/ARCHITECTURE.md's import rules a module belongs to. A family's modules
    are `qrnn.ops.<family>` (every family alike) and the training package's `qrnn.train`,
    unless `by_name`: then the family (`qrnn.ops.forget_mult`) or the training module
    (`qrnn.train.setup`), whose own rows say which others each one imports."""
    parts = module.split(".")
    if module.startswith("qrnn.ops.core"):
        return "qrnn.ops.core"
    if len(parts) > 2 and parts[1] == "ops" and parts[2] in FAMILY_NAMES:
        return f"qrnn.ops.{parts[2]}" if by_name else "qrnn.ops.<family>"
    if by_name and len(parts) > 2 and parts[1] == "train":
        return ".".join(parts[:3])
    if len(parts) > 1 and parts[1] in ("train", "bench", "checkpoint"):
        return ".".join(parts[:2])
    return module


def area_imports() -> dict:
    """{area: {areas it imports}}, from the source, the compiled qrnn._C included."""
    graph = import_graph()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, (ast.Import, ast.ImportFrom)) else []
            module = getattr(node, "module", None) or ""
            if "_C" in names or module.endswith("._C") or "qrnn._C" in names:
                graph[_module_name(path)].add("qrnn._C")
    areas: dict = {}
    for source, targets in graph.items():
        # A family's row names each family it imports, a training module's each training
        # module: which builds on which is the rule inside those two areas.
        area = _area(source, by_name=True)
        by_name = area != _area(source)
        for target in targets:
            if area != _area(target, by_name=by_name):
                areas.setdefault(area, set()).add(_area(target, by_name=by_name))
    return areas


def documented_import_rules() -> dict:
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("## Import rules", 1)[1].split("\n## ", 1)[0]
    rules = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            area = re.match(r"`([^`]+)`", cells[0]).group(1)
            rules[area] = set(re.findall(r"`([^`]+)`", cells[1]))
    return rules


def test_import_rules_are_the_documented_ones():
    """docs/ARCHITECTURE.md's import rules are exactly the package's: no area imports one its
    row does not list, and no row lists an import that no longer exists."""
    actual, documented = area_imports(), documented_import_rules()
    assert documented, "docs/ARCHITECTURE.md has no import-rules table"
    undocumented = {a: sorted(t - documented.get(a, set())) for a, t in actual.items() if t - documented.get(a, set())}
    stale = {a: sorted(t - actual.get(a, set())) for a, t in documented.items() if t - actual.get(a, set())}
    assert undocumented == {}, f"imports docs/ARCHITECTURE.md does not list: {undocumented}"
    assert stale == {}, f"imports docs/ARCHITECTURE.md lists that the code does not make: {stale}"


def test_import_rules_check_catches_a_new_edge():
    """The check above is not empty: an import the table does not list is found."""
    rules = documented_import_rules()
    assert "qrnn.modules" not in rules["qrnn.ops.core"]
    assert "qrnn._C" in area_imports()["qrnn.checkpoint"]
    # Families are told apart: the gates build on ForgetMult, linear_scan on no family.
    assert "qrnn.ops.forget_mult" in area_imports()["qrnn.ops.qrnn_gates"]
    assert not {"qrnn.ops.forget_mult", "qrnn.ops.qrnn_gates"} & rules["qrnn.ops.linear_scan"]


def test_training_components_import_no_command():
    """qrnn.train's components (each owning its config) are usable without the commands: none
    imports settings, runs, report, setup, generate or cli, which assemble them."""
    commands = {f"qrnn.train.{name}" for name in ("settings", "runs", "report", "setup", "generate", "cli")}
    components = [f"qrnn.train.{name}" for name in ("checkpoints", "precision", "stopping", "optim", "data", "lm",
                                                    "trainer", "state", "distributed", "memory", "cache")]
    areas = area_imports()
    assert all(c in import_graph() for c in components)
    hits = {c: sorted(areas.get(c, set()) & commands) for c in components if areas.get(c, set()) & commands}
    assert hits == {}
