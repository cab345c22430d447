"""The figures README.md quotes are those of the run that saved them, not typed by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_chaos_figures_are_the_last_saved_make_chaos_run() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    saved = json.loads((ROOT / "bench" / "results" / "chaos-latest.json").read_text())
    quoted = re.search(
        r"last run: (?P<sagas>[\d,]+) sagas, (?P<faults>\d+) faults including "
        r"(?P<outages>\d+) payment gateway outages, (?P<lost>\d+) lost, "
        r"(?P<duplicated>\d+) duplicated effects",
        readme,
    )
    assert quoted, "README.md no longer quotes the chaos run's figures in the expected words"
    assert {k: int(v.replace(",", "")) for k, v in quoted.groupdict().items()} == {
        "sagas": saved["sagas"],
        "faults": saved["faults"],
        "outages": saved["faults_by_kind"]["gateway_outage"],
        "lost": saved["lost"],
        "duplicated": saved["duplicated"],
    }
    assert saved["lost"] == saved["duplicated"] == saved["unconverged"] == 0
    assert not saved["violations"]
