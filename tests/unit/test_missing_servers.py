"""With ``CI=true`` a missing server fails the run and names the server (never a skip)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from saga.examples.order_saga.processes import REPO
from tests.support import servers

SERVERS = [
    ("SAGA_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:{port}/pg", "db", "PostgreSQL"),
    ("SAGA_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:{port}//", "rabbit", "RabbitMQ"),
    ("SAGA_TEST_REDIS_URL", "redis://127.0.0.1:{port}/0", "redis_url", "Redis"),
]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_one_test(
    tmp_path: Path, fixture: str, env: dict[str, str], *options: str
) -> subprocess.CompletedProcess[str]:
    test = tmp_path / "test_needs_a_server.py"
    test.write_text(f"def test_needs_it({fixture}):\n    pass\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-rfEs",
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", *options, str(test)],
        check=False,
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(("variable", "url", "fixture", "kind"), SERVERS)
def test_an_unreachable_server_fails_the_run_under_ci(
    tmp_path: Path, variable: str, url: str, fixture: str, kind: str
) -> None:
    port = _closed_port()
    env = {"CI": "true", variable: url.format(port=port)}
    result = _run_one_test(tmp_path, fixture, env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 error" in output and "skipped" not in output, output  # failed in the fixture
    assert f"CI=true and {kind} is not available" in output, output
    assert f"127.0.0.1:{port} ({variable})" in output, output


def test_the_same_server_missing_elsewhere_is_a_skip(tmp_path: Path) -> None:
    env = {"CI": "", "SAGA_TEST_AMQP_URL": f"amqp://127.0.0.1:{_closed_port()}//"}
    result = _run_one_test(tmp_path, "rabbit", env)
    assert result.returncode == 0 and "1 skipped" in result.stdout, result.stdout


def test_ci_never_falls_back_to_the_embedded_postgresql(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _closed_port()
    monkeypatch.delenv("SAGA_TEST_DATABASE_URL", raising=False)
    monkeypatch.setattr(servers, "_docker_available", lambda: False)
    monkeypatch.setattr(servers, "REQUIRED", set())
    kwargs = {
        "kind": "PostgreSQL",
        "env_var": "SAGA_TEST_DATABASE_URL",
        "default_url": f"postgresql://postgres@127.0.0.1:{port}/postgres",
        "default_port": port,
        "container": lambda: None,
        "fallback": lambda: "postgresql://embedded/postgres",
    }
    monkeypatch.setenv("CI", "true")
    assert servers.resolve(**kwargs).source == "missing"  # type: ignore[arg-type]
    monkeypatch.setenv("CI", "")
    assert servers.resolve(**kwargs).source == "embedded"  # type: ignore[arg-type]
    servers.REQUIRED.add("PostgreSQL")  # make check: --require-server postgres
    assert servers.resolve(**kwargs).source == "missing"  # type: ignore[arg-type]


def test_a_required_server_that_is_missing_stops_the_run_at_once(tmp_path: Path) -> None:
    """make check (--require-server postgres) without PostgreSQL: one clear line, no test run,
    even where a missing server would otherwise be a skip."""
    port = _closed_port()
    env = {"CI": "", "SAGA_TEST_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/pg"}
    result = _run_one_test(tmp_path, "db", env, "--require-server", "postgres")
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert "PostgreSQL is required (--require-server postgres) and not available" in output
    assert f"127.0.0.1:{port} (SAGA_TEST_DATABASE_URL)" in output, output
    assert "passed" not in output and "skipped" not in output, output


def test_a_missing_pgbouncer_fails_the_run_under_ci(tmp_path: Path) -> None:
    """The pooler tests need the program: on CI (which installs it) they fail without it."""
    missing = str(tmp_path / "no-pgbouncer")
    result = _run_one_test(tmp_path, "pgbouncer", {"CI": "true", "SAGA_TEST_PGBOUNCER": missing})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "1 error" in output and "skipped" not in output, output
    assert "CI=true and pgbouncer is not available: install pgbouncer" in output, output
    elsewhere = _run_one_test(tmp_path, "pgbouncer", {"CI": "", "SAGA_TEST_PGBOUNCER": missing})
    assert elsewhere.returncode == 0 and "1 skipped" in elsewhere.stdout, elsewhere.stdout
