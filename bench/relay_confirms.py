"""The relay with publisher confirms against the same relay with AMQP transactions.

``python -m bench.relay_confirms [--broker B] [--messages N] [--rounds R]``: one relay
drains N outbox rows (batches of 500) into one durable queue, in turn with publisher
confirms (the relay as it ships: the batch published, then every confirm awaited) and
with one AMQP transaction per batch (the same relay with its confirm step replaced by
``tx.select`` once per channel and ``tx.commit`` per batch: how it published before
confirms), R rounds of each. For each: messages per second, RabbitMQ's CPU per message
(the CPU time of its Erlang VMs, read from /proc before and after the drain) and how
busy the whole machine was meanwhile. Then a lone message, as a consumer publishes what
one delivery handled alone wrote: 100 times a round one durable publish and its confirm,
or its ``tx.commit``, p50 and p99 of each. ``--broker``: ``node`` (the default) a private
RabbitMQ node of its own, classic queue; ``cluster`` a private three-node cluster, quorum
queue (:mod:`tests.rig.rabbitmq_cluster`); ``shared`` the machine's own
RabbitMQ, whose CPU then counts what other clients did during the drain too.

A private node's CPU is this relay's traffic alone; the machine's busy share says how
loaded the machine was by everything else running. Results:
``bench/results/relay-confirms-<broker>-latest.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kombu import Producer

from bench import report
from bench.environment import AMQP_URL, machine
from bench.profile import machine_busy, process_cpu, server_pids
from bench.relay_throughput import Drain, relay_drain
from saga.broker.amqp.confirms import PublisherConfirms
from saga.broker.transport import BrokerConfig, Topology
from saga.outbox_relay import publisher
from tests.rig.rabbitmq_cluster import RabbitCluster

MODES = ("confirms", "transactions")
#: Where the relay publishes: --broker choice -> how the results name it.
BROKERS = {
    "node": "a private node, classic queue",
    "cluster": "a private three-node cluster, quorum queue",
    "shared": "the machine's own node (shared), classic queue",
}


class _Transactions:
    """The relay's publishing step as it was: an AMQP transaction per batch (no nacks)."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        channel.tx_select()

    def published(self, message_id: str) -> None:
        """Nothing to count: ``tx.commit`` answers for the whole batch."""

    def wait(self, connection: Any) -> set[str]:
        self._channel.tx_commit()
        return set()


@contextmanager
def _publishing_with(mode: str) -> Iterator[None]:
    if mode == "confirms":
        yield
        return
    shipped = publisher.PublisherConfirms
    publisher.PublisherConfirms = _Transactions  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        publisher.PublisherConfirms = shipped  # type: ignore[misc]


def lone_publish_ms(url: str, topology: Topology, mode: str, count: int) -> list[float]:
    """Milliseconds of each of ``count`` publishes of one durable message, each followed
    by its confirm (``confirms``) or by ``tx.commit`` (``transactions``), sorted."""
    destination = f"lone-{mode}"
    with BrokerConfig(url).connected() as conn:
        channel = conn.channel()
        queue = topology.queue(destination)(channel)
        queue.declare()
        settle = PublisherConfirms(channel) if mode == "confirms" else _Transactions(channel)
        producer = Producer(channel)
        took = []
        for n in range(count):
            started = time.perf_counter()
            producer.publish(
                b"{}", routing_key=topology.queue_name(destination), delivery_mode=2, mandatory=True
            )
            settle.published(str(n))
            settle.wait(conn)
            took.append((time.perf_counter() - started) * 1000)
        queue.delete()
    return sorted(took)


def _beam_pids_of(cluster: RabbitCluster) -> list[int]:
    """The Erlang VM of each running node (in the node's own process group)."""
    groups = {node.process.pid for node in cluster.nodes if node.process is not None}
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if not (entry / "comm").read_text().startswith("beam.smp"):
                    continue
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in groups:  # the process group id
                pids.append(int(entry.name))
    return pids


def _cpu_of(pids: list[int]) -> Callable[[], float]:
    return lambda: sum(process_cpu(pid) for pid in pids)


Runs = dict[str, list[tuple[Drain, float]]]
Lone = dict[str, list[float]]


def measure(
    messages: int, rounds: int, batch_size: int, url: str, topology: Topology, pids: list[int]
) -> tuple[Runs, Lone]:
    """Each mode ``rounds`` times, taking turns: (drain, machine busy share) of each, and
    100 lone publishes a round (milliseconds, sorted)."""
    runs: Runs = {mode: [] for mode in MODES}
    lone: Lone = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            busy_before, total_before = machine_busy()
            with _publishing_with(mode):
                drain = relay_drain(messages, batch_size, url, topology, _cpu_of(pids))
            busy, total = machine_busy()
            runs[mode].append((drain, (busy - busy_before) / (total - total_before)))
            lone[mode] = sorted(lone[mode] + lone_publish_ms(url, topology, mode, 100))
            print(
                f"{mode}: {drain.rate:,.0f} msg/s, RabbitMQ "
                f"{drain.broker_cpu_us_per_message:.0f} µs CPU per message",
                flush=True,
            )
    return runs, lone


def _summarise(
    runs: Runs, lone: Lone, where: str, batch_size: int
) -> tuple[dict[str, float], list[tuple[str, str, str]]]:
    figures: dict[str, float] = {"rounds": len(runs["confirms"]), "batch_size": batch_size}
    rows = []
    for mode, drains in runs.items():
        rate = statistics.median(d.rate for d, _ in drains)
        cpu = statistics.median(d.broker_cpu_us_per_message for d, _ in drains)
        busy = statistics.median(b for _, b in drains)
        figures[f"{mode}_msgs_per_s"] = round(rate)
        figures[f"{mode}_rabbitmq_cpu_us_per_msg"] = round(cpu, 1)
        figures[f"{mode}_machine_busy"] = round(busy, 2)
        each = ", ".join(f"{d.rate:,.0f}" for d, _ in drains)
        rows.append(
            (
                f"relay, {mode}, batches of {batch_size}, {where}",
                f"{rate:,.0f} msg/s (median; runs: {each})",
                f"RabbitMQ {cpu:.0f} µs CPU per message; machine {busy:.0%} busy",
            )
        )
    for mode, took in lone.items():
        p50, p99 = took[len(took) // 2], took[int(len(took) * 0.99)]
        figures[f"{mode}_lone_p50_ms"] = round(p50, 2)
        figures[f"{mode}_lone_p99_ms"] = round(p99, 2)
        rows.append(
            (
                f"one durable message and its {'confirm' if mode == 'confirms' else 'tx.commit'}"
                f", {len(took)} in turn, {where}",
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms",
                "what a delivery handled alone waits to publish after commit",
            )
        )
    figures["confirms_vs_transactions"] = round(
        figures["confirms_msgs_per_s"] / figures["transactions_msgs_per_s"], 3
    )
    return figures, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--broker", choices=BROKERS, default="node")
    args = parser.parse_args(argv)
    if args.broker == "shared":
        pids = [pid for server, pid in server_pids() if server == "RabbitMQ"]
        topology = Topology(queue_prefix="bench.relay.")
        runs, lone = measure(args.messages, args.rounds, args.batch_size, AMQP_URL, topology, pids)
    else:
        quorum = args.broker == "cluster"
        with RabbitCluster(size=3 if quorum else 1) as cluster:
            topology = Topology(
                queue_prefix="bench.relay.", queue_type="quorum" if quorum else "classic"
            )
            runs, lone = measure(
                args.messages, args.rounds, args.batch_size, cluster.url, topology,
                _beam_pids_of(cluster),
            )  # fmt: skip
    figures, rows = _summarise(runs, lone, BROKERS[args.broker], args.batch_size)
    path = report.write(figures, rows, machine(), name=f"relay-confirms-{args.broker}")
    print(path.read_text())


if __name__ == "__main__":
    main()
