"""mypy over the package as it installs: ``saga/`` and the folders pyproject maps into it.

``consumers/``, ``outbox_relay/`` and ``examples/`` install as ``saga.consumers``,
``saga.outbox_relay`` and ``saga.examples`` (``[tool.setuptools.package-dir]``); mypy
finds modules by folder alone, so this hands it every file under the name it installs
as, with the options of ``[tool.mypy]`` in pyproject.toml. Exits like mypy.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]


def mapped_sources() -> list[BuildSource]:
    """Every module of the folders mapped into ``saga``, under its installed name."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    sources = []
    for package, folder in setuptools["package-dir"].items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            sources.append(BuildSource(str(path.relative_to(ROOT)), name))
    return sources


def main() -> int:
    fscache = FileSystemCache()
    sources, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml")], fscache=fscache
    )
    # Its own cache: a plain ``mypy`` run, which cannot find the mapped modules, would
    # leave entries that say so.
    options.cache_dir = str(ROOT / ".mypy_cache" / "installed-names")
    written: list[str] = []

    def flush(_filename: str | None, messages: list[str], _serious: bool) -> None:
        written.extend(messages)
        for message in messages:
            print(message, flush=True)

    every = sources + mapped_sources()
    try:
        build.build(every, options, flush_errors=flush, fscache=fscache)
    except CompileError as error:
        print("\n".join(error.messages), file=sys.stderr)
        return 2
    errors = sum(": error:" in line for line in written)
    print(f"Found {errors} errors" if errors else f"Success: no issues in {len(every)} files")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
