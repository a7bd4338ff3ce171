"""docs/config.md is generated from the config classes: it says what they hold."""

from pathlib import Path

from jobconfig.reference import reference, rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_the_config_reference_is_up_to_date():
    assert DOC.read_text() == reference(), (
        "docs/config.md is out of date: python -m jobconfig.reference > docs/config.md"
    )


def test_every_key_has_a_meaning():
    from algorithms.registry import ALGORITHMS
    from common.config import JobConfig

    undocumented = [row[0] for row in rows(JobConfig, skip=frozenset({"policy"})) if not row[3]]
    for spec in ALGORITHMS.values():
        undocumented += [row[0] for row in rows(spec.config, "policy.") if not row[3]]
    assert sorted(set(undocumented)) == []
