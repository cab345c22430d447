"""``saga demo`` from the built wheel, installed in a fresh virtualenv, run in an empty folder.

The wheel is built offline (no build isolation) from a copy of the sources, so
the checkout stays clean. The new virtualenv gets only the wheel; the
third-party packages it needs are read from this test run's environment through
a ``.pth`` line, which comes after the virtualenv's own site-packages: the
framework and the example are imported from the wheel, never from the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from saga.examples.order_saga.processes import REPO
from tests.support.demo_output import assert_settled, read_demo

#: What the wheel is built from (pyproject.toml names the packages in it).
SOURCES = ("pyproject.toml", "README.md", "saga", "consumers", "outbox_relay", "migrations",
           "examples")  # fmt: skip


def run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (args, result.stdout[-3000:], result.stderr[-3000:])
    return result


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(wheels), str(source)], cwd=tmp_path)  # fmt: skip
    [wheel] = wheels.glob("saga_outbox-*.whl")
    return wheel


def fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                  cwd=tmp_path).stdout.strip()  # fmt: skip
    (Path(purelib) / "test_run_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)], cwd=tmp_path)  # fmt: skip
    return venv


def test_saga_demo_runs_from_an_installed_wheel_in_an_empty_folder(tmp_path: Path) -> None:
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    folder = tmp_path / "empty"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_") and k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"

    where = run(
        [str(venv / "bin" / "python"), "-c",
         "import saga, saga.examples.order_saga.demo as d; print(saga.__file__, d.__file__)"],
        cwd=folder, env=env,
    ).stdout.split()  # fmt: skip
    assert all(path.startswith(str(venv)) for path in where), where

    result = run([str(venv / "bin" / "saga"), "demo", "--orders", "40"], folder, env, timeout=300)
    out = result.stdout
    assert "embedded PostgreSQL" in out
    assert_settled(read_demo(out), 40)
    assert (folder / ".demo" / "logs").is_dir()


DASHBOARD_FROM_THE_WHEEL = """
import saga.dashboard
from starlette.testclient import TestClient
from saga.dashboard.app import DashboardConfig, create_app
from saga.dashboard.security import Guard
from saga.dashboard.databases import Databases, ServiceDatabase

databases = Databases([ServiceDatabase("orders", "postgresql://127.0.0.1:1/nowhere")])
with TestClient(create_app(DashboardConfig(databases, Guard(None)))) as client:
    for asset in ("chart.umd.min.js", "chart.js.LICENSE.md", "dashboard.js", "dashboard.css"):
        assert client.get("/static/" + asset).status_code == 200, asset
    page = client.get("/login").text
    assert "read-only" in page and "chart.umd.min.js" in page, page
print(saga.dashboard.__file__)
"""


def test_the_dashboard_serves_its_templates_and_assets_from_an_installed_wheel(
    tmp_path: Path,
) -> None:
    venv = fresh_venv(tmp_path, build_wheel(tmp_path))
    folder = tmp_path / "empty"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_") and k != "PYTHONPATH"}
    result = run([str(venv / "bin" / "python"), "-c", DASHBOARD_FROM_THE_WHEEL], folder, env)
    assert result.stdout.strip().startswith(str(venv)), result.stdout


APP_WITH_ITS_OWN_CONSUMERS = """
import consumers, examples
import saga.consumers, saga.outbox_relay
from saga.cli.loading import load_service

billing = load_service("consumers.billing:billing")
assert billing.name == "billing", billing
assert consumers.__file__.startswith({folder!r}), consumers.__file__
assert examples.__file__.startswith({folder!r}), examples.__file__
assert not saga.consumers.__file__.startswith({folder!r}), saga.consumers.__file__
print("ok")
"""


#: The rig that drives the example under faults: in a checkout only.
RIG = {path.name for path in (REPO / "tests" / "rig").glob("*.py")} - {"__init__.py"}


def test_the_wheel_claims_only_the_saga_namespace(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"saga", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    # The example ships the demo's closure; no chaos or private-server module comes along.
    shipped = {Path(name).name for name in names if name.startswith("saga/examples/")}
    assert "demo.py" in shipped and "chaos.py" in RIG
    assert shipped.isdisjoint(RIG), sorted(shipped & RIG)
    # An application whose own packages are called consumers and examples keeps them.
    venv = fresh_venv(tmp_path, wheel)
    folder = tmp_path / "app"
    for package in ("consumers", "examples"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text("")
    (folder / "consumers" / "billing.py").write_text(
        'from saga import Service\n\nbilling = Service("billing")\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_") and k != "PYTHONPATH"}
    script = APP_WITH_ITS_OWN_CONSUMERS.format(folder=str(folder))
    result = run([str(venv / "bin" / "python"), "-c", script], folder, env)
    assert result.stdout.strip() == "ok"
