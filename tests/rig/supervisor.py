"""Keeps the example's processes running: restarts any that dies, counts what it did.

Used by the chaos run and the crash-point matrix: a process killed by a fault
comes back (without the fault armed), as a real supervisor would bring it back.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

from saga.examples.order_saga.processes import SagaProcess

FAULTS_VAR = "SAGA_FAULTS"


class Supervisor:
    """Starts ``commands`` (name, saga arguments, environment) and restarts them when they die."""

    def __init__(
        self,
        commands: list[tuple[str, list[str], dict[str, str]]],
        log_dir: Path,
        *,
        faults: str | None = None,
    ) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.commands = {name: (args, env) for name, args, env in commands}
        self.processes: dict[str, SagaProcess] = {}
        self.restarts: Counter[str] = Counter()
        #: (name, exit code) of every death the supervisor answered with a restart
        self.deaths: list[tuple[str, int]] = []
        self.finished: set[str] = set()
        for name, (args, env) in self.commands.items():
            armed = {**env, FAULTS_VAR: faults} if faults else env
            self.processes[name] = SagaProcess(args, armed, log_dir, name)

    def watch(self) -> int:
        """Restart every process that died; return how many were restarted.

        A process that exited 0 on its own (the workload driver, done) is left alone.
        """
        restarted = 0
        for name, process in list(self.processes.items()):
            code = process.returncode
            if code is None or code == 0 or name in self.finished:
                continue
            args, env = self.commands[name]
            self.processes[name] = SagaProcess(args, env, self.log_dir, name)
            self.restarts[name] += 1
            self.deaths.append((name, code))
            restarted += 1
        return restarted

    def kill(self, name: str) -> None:
        self.processes[name].proc.send_signal(signal.SIGKILL)

    def pause(self, name: str) -> None:
        os.kill(self.processes[name].proc.pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.processes[name].proc.pid, signal.SIGCONT)

    def stop(self) -> dict[str, int]:
        """SIGTERM everything (graceful stop); return exit codes."""
        for process in self.processes.values():
            if process.returncode is None:
                os.kill(process.proc.pid, signal.SIGCONT)
                process.proc.terminate()
        self.finished.update(self.processes)
        return {name: process.wait(60) for name, process in self.processes.items()}

    def fired(self) -> Counter[str]:
        """Fault points that fired, from the processes' logs."""
        fired: Counter[str] = Counter()
        for points in self.fired_by_process().values():
            fired.update(points)
        return fired

    def fired_by_process(self) -> dict[str, Counter[str]]:
        """The fault points each process (by name, every run of it) fired, from its log."""
        fired: dict[str, Counter[str]] = {}
        for name in self.commands:
            log = self.log_dir / f"{name}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            fired[name] = Counter(
                line.split()[2]
                for line in text.splitlines()
                if line.startswith("fault point ") and line.endswith(" fired: SIGKILL")
            )
        return fired
