"""``make bench``: every measurement in one run, on the same servers, side by side."""

from __future__ import annotations

import argparse

from rich.console import Console

from bench import broker_baseline, relay_throughput, report
from bench.environment import machine

console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per measurement")
    parser.add_argument("--batch-size", type=int, default=500, help="relay batch size")
    args = parser.parse_args()

    with console.status("raw broker publishes (per-message confirms)"):
        confirm = broker_baseline.publish_rate(min(args.messages, 5_000), "confirm")
    with console.status("raw broker publishes (AMQP transactions)"):
        tx = broker_baseline.publish_rate(args.messages, "tx", args.batch_size)
    with console.status("raw broker publishes (no confirms, not durable)"):
        none = broker_baseline.publish_rate(args.messages, "none")
    with console.status(f"relay draining {args.messages} outbox rows"):
        relay = relay_throughput.relay_rate(args.messages, args.batch_size)

    figures = {
        "relay_msgs_per_s": round(relay),
        "relay_batch_size": args.batch_size,
        "broker_publish_tx_msgs_per_s": round(tx),
        "broker_publish_confirm_msgs_per_s": round(confirm),
        "broker_publish_unconfirmed_msgs_per_s": round(none),
        "relay_to_broker_tx_ratio": round(relay / tx, 3),
    }
    rows = [
        (
            f"relay, durable, batches of {args.batch_size}",
            f"{relay:,.0f} msg/s",
            f"{relay / tx:.0%} of raw tx publishing",
        ),
        (
            f"raw kombu publish, AMQP tx of {args.batch_size}",
            f"{tx:,.0f} msg/s",
            "ceiling for a durable relay",
        ),
        (
            "raw kombu publish, confirm per message",
            f"{confirm:,.0f} msg/s",
            "naive durable publishing",
        ),
        ("raw kombu publish, no confirms", f"{none:,.0f} msg/s", "not durable"),
    ]
    path = report.write(figures, rows, machine())
    console.print(path.read_text())


if __name__ == "__main__":
    main()
