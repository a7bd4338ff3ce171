"""The README's performance table is what bench/headline.py makes of the benches' last
run (bench/results/headline.json): a figure there cannot drift from its bench."""

import json
from pathlib import Path

import pytest

from bench import headline

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_table_is_the_rendering_of_the_last_headline_run():
    results = json.loads(headline.RESULTS.read_text())
    readme = (ROOT / "README.md").read_text()
    assert headline.render(readme, results) == readme, (
        "README.md's performance table differs from bench/results/headline.json: "
        "python bench/headline.py render"
    )


def test_every_headline_bench_wrote_its_figures_with_its_machine_and_commit():
    results = json.loads(headline.RESULTS.read_text())
    assert results["machine"].startswith("CPUs:") and results["commit"]
    assert set(results["benches"]) == {h.name for h in headline.HEADLINES}


def test_a_readme_without_the_markers_is_refused():
    results = json.loads(headline.RESULTS.read_text())
    with pytest.raises(ValueError, match="headline markers"):
        headline.render("# no table here\n", results)
