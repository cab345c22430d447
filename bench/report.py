"""Writing results: bench/results/<date>.json, latest.json and a markdown table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write(
    figures: dict[str, float],
    rows: list[tuple[str, str, str]],
    machine: dict[str, Any],
    name: str = "",
) -> Path:
    """Save ``figures`` (numbers only) plus context; return the markdown file written.

    A partial run names itself (``name``) so it does not replace the full results.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = (f"{name}-" if name else "") + datetime.now(UTC).strftime("%Y-%m-%d")
    latest = f"{name}-latest" if name else "latest"
    document = {**figures, "measured_at": datetime.now(UTC).isoformat(timespec="seconds")}
    document["machine"] = machine
    for file_name in (f"{stamp}.json", f"{latest}.json"):
        (RESULTS / file_name).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    lines = [
        f"# Benchmark {stamp}",
        "",
        f"Machine: {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"PostgreSQL {machine['postgresql']['server_version']} "
        f"(synchronous_commit={machine['postgresql']['synchronous_commit']}, "
        f"fsync={machine['postgresql']['fsync']}), Python {machine['python']}.",
        "",
        "| measurement | result | reference |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
    ]
    markdown = RESULTS / f"{stamp}.md"
    markdown.write_text("\n".join(lines))
    (RESULTS / f"{latest}.md").write_text("\n".join(lines))
    return markdown
