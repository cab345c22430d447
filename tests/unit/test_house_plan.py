"""The package tree keeps its plan: layers import downwards, the core loads no broker."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import saga
from saga import errors
from saga.broker.capabilities import Capabilities
from saga.broker.kinds import KINDS
from saga.engine.steps import Step
from saga.engine.steps.kind import StepKind

ROOT = Path(__file__).resolve().parents[2]

#: Lowest first: a module may import its own layer and the layers before it.
LAYERS = [
    "saga.errors",
    "saga.faults",
    "saga.db",
    "saga.observability",
    "saga.messaging",
    "saga.effects",
    "saga.handlers",
    "saga.engine",
    "saga.operations",
    "saga.broker",
    "saga.settings",
    "saga",
    "saga.dashboard",
    "saga.outbox_relay",
    "saga.consumers",
    "saga.testing",
    "saga.cli",
    "saga.examples",
]
#: The one upward import: ``saga demo`` runs the example application (imported when run).
RUNS_THE_EXAMPLE = ("saga.cli.demo", "saga.examples")
#: The repository's top-level folders that install under the ``saga`` namespace
#: (pyproject's package-dir), each with a module its bare name would load a second copy of.
MAPPED = {
    "consumers": "worker",
    "outbox_relay": "relay",
    "examples": "order_saga.cluster",
}
#: What the core (everything before ``saga.broker``) must never import.
RUNTIME = ("kombu", "amqp", "saga.consumers", "saga.outbox_relay", "saga.examples")


def _layer(module: str) -> int:
    """Index of the most specific layer ``module`` belongs to."""
    matches = [
        i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")
    ]
    return max(matches, key=lambda i: len(LAYERS[i]))


def _modules() -> list[tuple[str, Path]]:
    found = []
    for top in ("saga", *MAPPED):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            parts = parts if top == "saga" else ("saga", *parts)
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append((name, path))
    return found


def _imports(path: Path) -> list[str]:
    """Modules ``path`` imports at run time (imports for type checkers only are left out)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_every_import_points_down_the_layers() -> None:
    upward = []
    for module, path in _modules():
        if module == "saga":
            continue  # the public API re-exports from every core layer
        own = _layer(module)
        for imported in _imports(path):
            core = _layer(module) < _layer("saga.broker")
            if core and any(imported == r or imported.startswith(r + ".") for r in RUNTIME):
                upward.append(f"{module} imports {imported}")
            elif imported.split(".")[0] == "saga":
                target = imported if _is_module(imported) else imported.rsplit(".", 1)[0]
                demo = (module, _top_layer(target)) == RUNS_THE_EXAMPLE
                if _layer(target) > own and not demo:
                    upward.append(f"{module} imports {target}")
    assert upward == []


def _top_layer(module: str) -> str:
    return LAYERS[_layer(module)]


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[1:2] and parts[1] in MAPPED:
        parts = parts[1:]  # saga.consumers is the folder consumers/
    path = ROOT.joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


#: Run from the checkout's root (its folder on sys.path): the bare name of a mapped folder
#: either fails to import or is the very module imported under ``saga``.
ONE_NAME_PER_MODULE = """
import importlib, sys
installed = importlib.import_module(sys.argv[1])
try:
    bare = importlib.import_module(sys.argv[2])
except ImportError as error:
    print("refused:", error)
else:
    print("same" if bare is installed else "two copies")
"""


def test_a_mapped_folder_imports_under_one_name_from_the_checkout_root() -> None:
    for folder, module in MAPPED.items():
        bare = f"{folder}.{module}"
        result = subprocess.run(
            [sys.executable, "-c", ONE_NAME_PER_MODULE, f"saga.{bare}", bare],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        said = result.stdout.strip()
        assert said == "same" or (
            said.startswith("refused:") and f"import saga.{folder}" in said
        ), f"{bare}: {said}"
        assert not (ROOT / "saga" / folder).exists(), f"saga/{folder} shadows the mapping"


def test_the_public_api_loads_no_broker_client() -> None:
    # A fresh interpreter: this test process has loaded kombu long ago.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "from saga import Outbox, Saga"],
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}
    assert "saga" in loaded
    tops = {name.split(".")[0] for name in loaded}
    assert tops.isdisjoint({"kombu", "amqp", "redis"})
    assert not any(name.startswith(runtime) for name in loaded for runtime in RUNTIME)


def test_one_import_line_serves_a_user() -> None:
    for name in (
        "Saga",
        "SagaRegistry",
        "Service",
        "HandlerContext",
        "Outbox",
        "StepFailed",
        "RetryPolicy",
        "StepRetry",
        "Tx",
    ):
        assert name in saga.__all__
        assert getattr(saga, name) is not None


def test_every_exception_lives_in_saga_errors_under_saga_error() -> None:
    elsewhere = []
    for module, _path in _modules():
        if module.startswith(("saga.cli", "saga.examples")) or module.endswith("__main__"):
            continue
        loaded = importlib.import_module(module)
        for name, value in vars(loaded).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module
                and module != "saga.errors"
            ):
                elsewhere.append(f"{module}.{name}")
    assert elsewhere == []
    for name, value in vars(errors).items():
        if inspect.isclass(value) and value.__module__ == "saga.errors":
            assert issubclass(value, errors.SagaError), name


def test_the_architecture_document_lists_every_package() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("<!-- package-map -->")[1].split("<!-- /package-map -->")[0]
    documented = set(re.findall(r"^- `([a-z_/]+)/`", block, flags=re.M))
    packages = {"migrations"} | {
        str(init.parent.relative_to(ROOT))
        for top in ("saga", *MAPPED)
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert documented == packages
    assert all(len(line) > 20 for line in block.strip().splitlines())


def test_saga_data_is_typed_for_editors_and_type_checkers(tmp_path: Path) -> None:
    from mypy import api

    source = """
from pydantic import BaseModel
from saga import Saga, Tx

class Data(BaseModel):
    order_id: str

class Cmd(BaseModel):
    order_id: str

class Done(BaseModel):
    ok: bool

trip = Saga("trip", data=Data)

@trip.local("check")
def check(tx: Tx, data: Data) -> Data:
    return data

def on_done(data: Data, reply: Done) -> Data:
    return data

trip.remote("send", command=lambda d: Cmd(order_id=d.order_id), reply=Done, on_reply=on_done)
trip.remote("typo", command=lambda d: Cmd(order_id=d.order_idd))
"""
    (tmp_path / "mypy.ini").write_text("[mypy]\n")
    (tmp_path / "flow.py").write_text(source)
    out, _err, status = api.run(
        [
            "--strict",
            "--no-incremental",
            "--config-file",
            str(tmp_path / "mypy.ini"),
            str(tmp_path / "flow.py"),
        ]
    )
    assert status == 1
    assert out.count("error:") == 1
    assert '"Data" has no attribute "order_idd"' in out


def test_the_package_says_its_version() -> None:
    assert saga.__version__ == importlib.metadata.version("saga-outbox")


#: What a service declares, imported from ``saga``.
DECLARED_BY_A_SERVICE = ("Service", "HandlerContext", "RetryPolicy", "StepFailed")


def test_what_a_service_declares_is_imported_from_saga_alone() -> None:
    """``Service``, ``HandlerContext``, ``RetryPolicy`` and ``StepFailed``: from ``saga`` (or
    the module that defines each), and from no other package."""
    declared = {name: getattr(saga, name) for name in DECLARED_BY_A_SERVICE}
    elsewhere = []
    for module, path in _modules():
        if path.name != "__init__.py" or module == "saga":
            continue
        loaded = importlib.import_module(module)
        for name, value in declared.items():
            if getattr(loaded, name, None) is value:
                elsewhere.append(f"{module}.{name}")
    assert elsewhere == []


def test_the_errors_import_nothing_of_the_framework_even_for_type_checkers() -> None:
    tree = ast.parse((ROOT / "saga" / "errors.py").read_text())
    imported = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("saga")
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("saga")
    ]
    assert imported == []


#: What telling brokers apart by their URL looks like (docs/architecture.md, the broker seam).
BROKER_TESTS = re.compile(
    r'is_amqp|is_redis|is_postgres|startswith\("amqp|scheme ==|driver_type =='
)


def test_no_module_outside_the_broker_package_tests_which_broker_it_holds() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for _module, path in _modules()
        if not path.is_relative_to(ROOT / "saga" / "broker")
        and path.parts[len(ROOT.parts)] in ("saga", "consumers", "outbox_relay")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BROKER_TESTS.search(line)
    ]
    assert found == []


def test_the_architecture_document_draws_the_broker_seam() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    seam = text.split("<!-- broker-seam -->")[1].split("<!-- /broker-seam -->")[0]
    for module in ("transport.py", "capabilities.py", "kind.py", "kinds.py"):
        assert f"saga/broker/{module}" in seam, module
    for kind in KINDS:
        home = Path(inspect.getfile(type(kind))).relative_to(ROOT)
        where = home.parent if home.name == "__init__.py" else home
        assert where.parts[:2] == ("saga", "broker"), f"{kind.name} lives in {where}"
        shown = f"{where}/" if home.name == "__init__.py" else str(where)
        assert shown in seam, f"the broker seam does not show {kind.name} ({shown})"
    table = (ROOT / "docs" / "brokers.md").read_text()
    for capability in Capabilities.__dataclass_fields__:
        assert f"| `{capability}` |" in table, f"docs/brokers.md does not list {capability}"


def test_every_package_of_the_library_ships_in_the_wheel() -> None:
    """A subpackage missing from pyproject's list installs from a checkout and is absent
    from the wheel: the wheel tests would only say so after building one."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    # The library's folders; examples/ ships the demo's packages alone (test_demo_wheel).
    found = {
        name
        for name, path in _modules()
        if path.name == "__init__.py" and not name.startswith("saga.examples")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


#: The modules of the step-kind seam that are no kind of step (docs/architecture.md).
STEP_SEAM = ("__init__.py", "kind.py", "options.py")
STEPS = ROOT / "saga" / "engine" / "steps"


def test_every_module_of_the_steps_package_is_one_kind_of_step_drawn_in_the_seam() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    seam = text.split("<!-- step-kind-seam -->")[1].split("<!-- /step-kind-seam -->")[0]
    for module in STEP_SEAM:
        assert f"saga/engine/steps/{module}" in seam, module
    kinds = get_args(Step)
    homes = {Path(inspect.getfile(kind)): kind for kind in kinds}
    modules = {path for path in STEPS.glob("*.py") if path.name not in STEP_SEAM}
    assert set(homes) == modules, "each kind of step is one module, and each is listed in Step"
    assert len(homes) == len(kinds) == len({kind.kind for kind in kinds})
    for path, kind in homes.items():
        assert issubclass(kind, StepKind), kind
        defined = [
            node.name
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.ClassDef)
            and any(getattr(base, "id", None) == "StepKind" for base in node.bases)
        ]
        assert defined == [kind.__name__], f"{path.name} defines one kind of step"
        shown = str(path.relative_to(ROOT))
        assert shown in seam, f"the step-kind seam does not show {kind.__name__} ({shown})"


def _asks_which_kind(node: ast.AST, kinds: set[str]) -> bool:
    """True for ``isinstance(x, Kind)``, ``case Kind(...)`` and ``x.kind == "..."``."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
        classes = node.args[1] if len(node.args) > 1 else None
        named = classes.elts if isinstance(classes, ast.Tuple) else [classes]
        return any(getattr(name, "id", getattr(name, "attr", None)) in kinds for name in named)
    if isinstance(node, ast.MatchClass):
        return getattr(node.cls, "id", getattr(node.cls, "attr", None)) in kinds
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(
            isinstance(side, ast.Attribute) and side.attr == "kind" for side in sides
        ) and any(
            isinstance(side, ast.Constant) and side.value in {k.kind for k in get_args(Step)}
            for side in sides
        )
    return False


def test_no_module_outside_the_steps_package_tests_which_kind_of_step_it_holds() -> None:
    kinds = {kind.__name__ for kind in get_args(Step)} | {"StepKind"}
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for _module, path in _modules()
        if not path.is_relative_to(STEPS)
        and path.parts[len(ROOT.parts)] in ("saga", "consumers", "outbox_relay")
        for node in ast.walk(ast.parse(path.read_text()))
        if _asks_which_kind(node, kinds)
    ]
    assert found == []
