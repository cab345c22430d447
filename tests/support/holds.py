"""Holding a ``saga`` subprocess at a fault point while the test acts, then letting it go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from saga.examples.order_saga.processes import SagaProcess
from saga.faults import ENV_VAR, HOLD, RELEASE_VAR


@dataclass(frozen=True)
class Hold:
    """``point`` armed to hold (on its ``nth`` hit) until :meth:`release` creates a file."""

    point: str
    folder: Path
    nth: int = 1

    @property
    def release_file(self) -> Path:
        return self.folder / f"release-{self.point}-{self.nth}"

    @property
    def env(self) -> dict[str, str]:
        """The environment that arms the hold in a process."""
        return {ENV_VAR: f"{self.point}@{self.nth}:{HOLD}", RELEASE_VAR: str(self.release_file)}

    def wait_held(self, process: SagaProcess, timeout: float = 60) -> None:
        process.wait_for_output(f"fault point {self.point} holding", timeout)

    def release(self) -> None:
        self.release_file.touch()
