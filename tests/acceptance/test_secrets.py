"""A sentinel password never appears in logs or error text."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

from saga.examples.order_saga.processes import REPO, SAGA, SagaProcess, saga_env
from saga.messaging.envelope import Envelope
from saga.observability.redaction import redact_url
from tests.support.brokers import TestBroker
from tests.support.databases import TestDatabase, with_credentials
from tests.support.services import Ping
from tests.support.wait import wait_until

SENTINEL = "Sentinel-Pa55-4e1d"


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), **extra}


def _printed(process: SagaProcess) -> str:
    """What the process printed, with the console's line wrapping undone (a long URL may be
    folded across lines, which would hide a password from a plain search)."""
    return process.output().replace("\n", "")


def test_unreachable_servers_never_print_the_password(tmp_path: Path) -> None:
    env = _env(
        SAGA_DATABASE_URL=f"postgresql://app:{SENTINEL}@127.0.0.1:1/orders",
        SAGA_BROKER_URL=f"amqp://guest:{SENTINEL}@127.0.0.1:1//",
        SAGA_SIGNING_KEYS=f"k1:{SENTINEL}-long-enough",
    )
    for fmt in ("text", "json"):
        relay = SagaProcess(["relay", "--log-format", fmt], env, tmp_path, f"relay-{fmt}")
        wait_until(lambda r=relay: "Retrying" in r.output(), timeout=30, what="retry logged")
        relay.proc.send_signal(signal.SIGTERM)
        relay.wait(30)
        assert "127.0.0.1" in relay.output()
        assert SENTINEL not in _printed(relay)
    migrate = subprocess.run(
        [SAGA, "db", "migrate"], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert migrate.returncode == 1 and "cannot connect" in migrate.stderr
    assert SENTINEL not in (migrate.stdout + migrate.stderr).replace("\n", "")


def test_a_working_password_is_masked_in_what_processes_print(
    db: TestDatabase, amqp_url: str, tmp_path: Path
) -> None:
    """Processes that connect with the password print their database URL, masked."""
    url = with_credentials(db.url, password=SENTINEL)  # trust auth ignores it
    assert urlsplit(url).password == SENTINEL  # planted, whatever the shape of db.url
    masked = f"{urlsplit(url).username}:***@"
    env = _env(SAGA_DATABASE_URL=url, SAGA_BROKER_URL=f"amqp://guest:{SENTINEL}@127.0.0.1:1//")
    consumer = SagaProcess(["consume", "tests.support.services:service"], env, tmp_path, "c")
    wait_until(lambda: "Retrying" in consumer.output(), timeout=30, what="broker retry logged")
    consumer.proc.send_signal(signal.SIGTERM)
    consumer.wait(30)
    assert "Connection refused" in consumer.output()
    assert SENTINEL not in _printed(consumer)
    assert masked in _printed(consumer)  # it did print the URL it connected with
    for fmt in ("text", "json"):  # connected to both: the relay logs what it connected to
        relay = SagaProcess(
            ["relay", "--log-format", fmt], {**env, "SAGA_BROKER_URL": amqp_url}, tmp_path, fmt
        )
        wait_until(lambda r=relay: "relay connected" in r.output(), timeout=30, what="connected")
        assert relay.terminate(30) == 0, relay.output()
        assert SENTINEL not in _printed(relay)
        assert _printed(relay).count(masked) >= 2, relay.output()  # started, and connected
    shown = subprocess.run(
        [SAGA, "list"], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert shown.returncode == 0
    assert SENTINEL not in (shown.stdout + shown.stderr).replace("\n", "")


def test_a_password_that_application_code_logs_is_masked(
    db: TestDatabase, rabbit: TestBroker, tmp_path: Path
) -> None:
    """A handler logs the database URL as it was given: the log line reaches the console
    with the password masked, by the process's log redaction alone."""
    url = with_credentials(db.url, password=SENTINEL)  # trust auth ignores it
    env = saga_env(url, rabbit.url, rabbit.topology.queue_prefix)
    consumer = SagaProcess(["consume", "tests.support.leaky_service:leaky"], env, tmp_path, "c")
    try:
        rabbit.publish_raw("leaky", Envelope.wrap(Ping(key="k1")).to_bytes(), "application/json")
        wait_until(lambda: "handling k1 on" in consumer.output(), timeout=60, what="logged")
    finally:
        assert consumer.terminate(30) == 0, consumer.output()
    assert SENTINEL not in _printed(consumer)
    assert f"handling k1 on {redact_url(url)}" in _printed(consumer)
