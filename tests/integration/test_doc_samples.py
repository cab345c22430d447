"""Every code sample of README.md and docs/ runs as written (tests/support/samples.py),
on the test servers: ``SAGA_DATABASE_URL`` is a fresh database with the framework's
tables, ``SAGA_REDIS_URL`` the test Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.databases import TestDatabase
from tests.support.samples import ROOT, run_page, samples_of

PAGES = sorted(
    str(path.relative_to(ROOT)) for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
)


def _needs_redis(page: str) -> bool:
    return "SAGA_REDIS_URL" in (ROOT / page).read_text()


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=[pytest.mark.redis] if _needs_redis(page) else []) for page in PAGES],
)
def test_every_sample_of_the_page_runs(
    page: str,
    db: TestDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    text = (ROOT / page).read_text()
    monkeypatch.setenv("SAGA_DATABASE_URL", db.url)
    if _needs_redis(page):
        monkeypatch.setenv("SAGA_REDIS_URL", request.getfixturevalue("redis_url"))
    not_run = run_page(page, text, tmp_path)
    assert len(not_run) <= 2, f"keep samples that are not run rare: {not_run}"


def test_the_pages_have_samples() -> None:
    counts = {page: len(samples_of(page, (ROOT / page).read_text())) for page in PAGES}
    assert counts["README.md"] >= 3 and counts["docs/sagas.md"] >= 10, counts


def test_a_sample_broken_on_purpose_fails(tmp_path: Path) -> None:
    page = 'Intro.\n\n```python\nfrom saga import Saga\n\nSaga("s", data=dict)\n```\n'
    with pytest.raises(Exception, match="data must be a pydantic model class"):
        run_page("broken.md", page, tmp_path)


def test_an_excerpt_that_left_its_source_fails(tmp_path: Path) -> None:
    page = "<!-- sample: from tests/support/samples.py -->\n```python\nnot_in_that_file()\n```\n"
    with pytest.raises(AssertionError, match="not found word for word"):
        run_page("moved.md", page, tmp_path)
