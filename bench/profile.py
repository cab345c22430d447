"""``make profile``: where the CPU goes while sagas run at full load.

Runs a system of ``make bench``: the example order saga (four services, four
relays, the payment gateway) or, with ``--workload three-step``, the saga of
three steps doing the peers' writes; all separate processes. Starts a batch of
sagas and reads every
process's CPU time from ``/proc`` before and after: CPU milliseconds per saga
for each service, each relay, PostgreSQL (all its processes), RabbitMQ and the
driver, plus how busy the machine was. With ``--py-spy SERVICE`` it also
samples that service's Python stacks (py-spy) and lists the functions that take
its time. Results go to ``bench/results/profile-<workload>-latest.md`` (with ``--rate``,
the sagas paced instead of started at once: ``profile-order-paced-latest.md``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import report
from bench.environment import machine
from bench.saga_e2e import Bench, Measurement
from bench.three_step_saga import ThreeStepBench

TICKS = os.sysconf("SC_CLK_TCK")


#: The benchmark's own process: it starts the sagas and waits for them.
DRIVER = "driver (this process)"


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads); 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


#: Server processes by the start of their command name.
SERVERS = {"postgres": "PostgreSQL", "beam.smp": "RabbitMQ"}


def server_pids() -> list[tuple[str, int]]:
    """(server, pid) of every PostgreSQL and RabbitMQ process, in one pass over /proc;
    not the private servers other runs start under the temporary folder (a test's
    RabbitMQ node or PostgreSQL cluster on a shared machine)."""
    found = []
    private = tempfile.gettempdir()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text()
                if os.readlink(entry / "cwd").startswith(private):
                    continue
            except OSError:
                continue
            for prefix, server in SERVERS.items():
                if comm.startswith(prefix):
                    found.append((server, int(entry.name)))
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / TICKS, sum(values) / TICKS


class CpuSnapshot:
    """CPU seconds per component at one moment."""

    def __init__(self, bench: Bench | ThreeStepBench) -> None:
        self.by_component: Counter[str] = Counter()
        for name, process in bench.supervisor.processes.items():
            self.by_component[name] += process_cpu(process.proc.pid)
        for server, pid in server_pids():
            self.by_component[server] += process_cpu(pid)
        self.by_component[DRIVER] += process_cpu(os.getpid())
        self.busy, self.total = machine_busy()

    def system_seconds(self) -> float:
        """CPU seconds of the system's processes (services, relays, PostgreSQL, RabbitMQ):
        every component but the driver."""
        return sum(s for name, s in self.by_component.items() if name != DRIVER)


class StackSampler:
    """py-spy sampling one process until stopped; returns collapsed stacks."""

    def __init__(self, py_spy: str, pid: int, out: Path, idle: bool) -> None:
        self.out = out
        command = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "200"]
        if idle:  # wall clock: waiting threads are sampled too
            command.append("--idle")
        self.proc = subprocess.Popen(
            [*command, "--nonblocking", "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> Counter[str]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        stacks: Counter[str] = Counter()
        if self.out.exists():
            for line in self.out.read_text().splitlines():
                stack, _, count = line.rpartition(" ")
                if stack and count.isdigit():
                    stacks[stack] += int(count)
        return stacks


def _py_spy() -> str:
    candidate = Path(sys.executable).parent / "py-spy"
    if not candidate.exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    return str(candidate)


def hot_functions(stacks: Counter[str], top: int) -> list[tuple[str, float, float]]:
    """(function, self share, total share) for the functions with the most samples."""
    total = sum(stacks.values()) or 1
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = [_short(frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    ranked = sorted(inclusive, key=lambda f: (own[f], inclusive[f]), reverse=True)[:top]
    return [(f, own[f] / total, inclusive[f] / total) for f in ranked]


def _short(frame: str) -> str:
    """``func (/long/path/site-packages/pkg/mod.py:12)`` -> ``func (pkg/mod.py)``."""
    function, _, location = frame.partition(" (")
    path = location.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/work/", "python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    parts = path.split("/")
    return f"{function} ({'/'.join(parts[-2:])})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--workload",
        choices=("order", "three-step"),
        default="order",
        help="the example order saga, or three steps doing the peers' writes",
    )
    parser.add_argument("--sagas", type=int, default=4_000, help="sagas started at once")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="order workload: start the sagas paced at this many a second instead of at once "
        "(e.g. half the full-load rate, to see where half-load CPU goes)",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="worker threads per consumer")
    parser.add_argument(
        "--orchestrators", type=int, default=1, help="consumer processes of the saga's home"
    )
    parser.add_argument(
        "--py-spy", action="append", default=[], metavar="SERVICE", help="sample this process"
    )
    parser.add_argument(
        "--idle", action="store_true", help="sample waiting threads too (wall clock, not CPU)"
    )
    parser.add_argument("--top", type=int, default=15, help="functions listed per sampled process")
    args = parser.parse_args()
    if args.rate is not None and (args.workload != "order" or args.rate <= 0):
        parser.error("--rate takes a positive number of sagas a second, with --workload order")
    py_spy = _py_spy() if args.py_spy else ""  # before starting anything: it may be missing
    with tempfile.TemporaryDirectory() as work:
        bench: Bench | ThreeStepBench
        if args.workload == "order":
            bench = Bench(Path(work), args.concurrency, args.orchestrators)
        else:
            bench = ThreeStepBench(Path(work), args.concurrency, args.orchestrators)
        try:
            bench.measure(300)  # warm up
            processes = bench.supervisor.processes
            samplers = {
                name: StackSampler(py_spy, processes[name].proc.pid, Path(work, name), args.idle)
                for name in args.py_spy
            }
            before, started = CpuSnapshot(bench), time.monotonic()
            measured = (
                bench.measure(args.sagas, rate=args.rate)
                if isinstance(bench, Bench)
                else bench.measure(args.sagas)
            )
            after, elapsed = CpuSnapshot(bench), time.monotonic() - started
            stacks = {name: sampler.stop() for name, sampler in samplers.items()}
        finally:
            bench.close()
    rows = _cpu_rows(before, after, args.sagas, elapsed)
    if isinstance(measured, Measurement):
        rows += [
            (f"batching: {service}", f"{mean:.1f} deliveries per transaction", "")
            for service, mean in measured.batch_mean.items()
        ]
    figures = {
        "sagas_per_s": round(args.sagas / elapsed, 1),
        "cpu_ms_per_saga": round(1000 * (after.busy - before.busy) / args.sagas, 2),
        "machine_busy_share": round((after.busy - before.busy) / (after.total - before.total), 3),
    }
    for name, sampled in stacks.items():
        rows += [
            (f"{name}: {function}", f"{own:.1%} self", f"{inclusive:.1%} with callees")
            for function, own, inclusive in hot_functions(sampled, args.top)
        ]
    paced = "" if args.rate is None else "-paced"
    path = report.write(figures, rows, machine(), name=f"profile-{args.workload}{paced}")
    print(path.read_text())


def _cpu_rows(
    before: CpuSnapshot, after: CpuSnapshot, sagas: int, elapsed: float
) -> list[tuple[str, str, str]]:
    busy = after.busy - before.busy
    cores = (after.total - before.total) / elapsed
    rows = [
        (
            f"{sagas:,} sagas in {elapsed:.1f} s",
            f"{sagas / elapsed:,.0f} sagas/s",
            f"machine {busy / elapsed:.2f} of {cores:.0f} cores busy, "
            f"{1000 * busy / sagas:.2f} ms CPU per saga",
        )
    ]
    spent = after.by_component - before.by_component
    for name, seconds in spent.most_common():
        rows.append(
            (f"CPU: {name}", f"{1000 * seconds / sagas:.2f} ms per saga", f"{seconds / busy:.0%}")
        )
    other = busy - sum(spent.values())
    rows.append(("CPU: everything else", f"{1000 * other / sagas:.2f} ms per saga", "kernel etc."))
    return rows


if __name__ == "__main__":
    main()
