"""Running the code samples of a Markdown page, as written, in order.

Every ```python block of a page runs, top to bottom, in one namespace (so a later
sample uses what an earlier one defined), in a fresh folder on ``sys.path``; every
```sql block runs on the database ``SAGA_DATABASE_URL`` names. A Python block
made of files, each opened by a ``# path/to/module.py`` comment line, is written out
as those files, which are then imported in order (as ``saga consume`` would).

A block may be preceded by one visible marker comment:

- ``<!-- sample: from PATH -->``: it is an excerpt of PATH (a test or an example that
  the suite runs), and must appear there word for word (indentation aside);
- ``<!-- sample: not run (REASON) -->``: it is deliberately not run; keep these rare.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(
    r"(?:^<!-- sample: (?P<marker>[^\n]*) -->\n)?^```(?P<language>python|sql)\n(?P<code>.*?)^```",
    re.S | re.M,
)
_FILE_HEADER = re.compile(r"^# (?P<path>[\w/]+)\.py\b.*$", re.M)
_FROM = re.compile(r"from (?P<path>\S+)")
_NOT_RUN = re.compile(r"not run \((?P<reason>.+)\)")


@dataclass(frozen=True)
class Sample:
    """One ```python or ```sql block: where it starts, its code, its marker (if any)."""

    page: str
    line: int
    language: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def samples_of(page: str, text: str) -> list[Sample]:
    """The ```python and ```sql blocks of a page's Markdown ``text``, in order."""
    return [
        Sample(
            page,
            text.count("\n", 0, match.start("code")) + 1,
            match["language"],
            match["code"],
            match["marker"],
        )
        for match in _BLOCK.finditer(text)
    ]


def run_page(page: str, text: str, folder: Path) -> list[str]:
    """Run every sample of ``text`` in ``folder``; return the reasons of those not run.

    Raises the first error a sample raises, with the sample's place in its page.
    """
    namespace: dict[str, object] = {"__name__": "__sample__"}
    not_run: list[str] = []
    with _importable(folder):
        for sample in samples_of(page, text):
            if sample.marker is None:
                _run(sample, namespace, folder)
            elif found := _FROM.fullmatch(sample.marker):
                _check_excerpt(sample, ROOT / found["path"])
            elif skipped := _NOT_RUN.fullmatch(sample.marker):
                not_run.append(f"{sample.where}: {skipped['reason']}")
            else:
                raise AssertionError(f"{sample.where}: unknown sample marker {sample.marker!r}")
    return not_run


def _run(sample: Sample, namespace: dict[str, object], folder: Path) -> None:
    if sample.language == "sql":
        with psycopg.connect(os.environ["SAGA_DATABASE_URL"], autocommit=True) as conn:
            conn.execute(sample.code.encode())
        return
    files = list(_FILE_HEADER.finditer(sample.code))
    if not files:
        code = "\n" * (sample.line - 1) + sample.code  # line numbers as in the page
        exec(compile(code, sample.page, "exec"), namespace)
        return
    if sample.code[: files[0].start()].strip():
        raise AssertionError(f"{sample.where}: code before the first '# file.py' line")
    for header, following in zip(files, [*files[1:], None], strict=True):
        end = following.start() if following else len(sample.code)
        path = folder / f"{header['path']}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sample.code[header.start() : end])
    for header in files:
        try:
            importlib.import_module(header["path"].replace("/", "."))
        except Exception as exc:
            raise AssertionError(f"{sample.where}: {header['path']}.py failed: {exc!r}") from exc


def _check_excerpt(sample: Sample, source: Path) -> None:
    assert source.is_file(), f"{sample.where}: no file {source}"
    assert _normal(sample.code) in _normal(source.read_text()), (
        f"{sample.where}: not found word for word in {source.relative_to(ROOT)}"
    )


def _normal(code: str) -> str:
    """Lines stripped of their indentation, so a fragment matches inside a function."""
    return "\n".join(line.strip() for line in code.strip().splitlines())


@contextmanager
def _importable(folder: Path) -> Iterator[None]:
    """``folder`` on ``sys.path``; the modules imported from it forgotten afterwards."""
    before = set(sys.modules)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        for name in set(sys.modules) - before:
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if module_file.startswith(str(folder)) or name.split(".")[0] in _packages(folder):
                del sys.modules[name]
        importlib.invalidate_caches()


def _packages(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir() if path.is_dir()}
