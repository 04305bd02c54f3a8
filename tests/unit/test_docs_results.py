"""The docs' generated pages (docs/hooks.py) on the real records in benchmarks/results: every
record appears on the results page with its commit, every figure shown is the record's value,
placeholders in the hand-written pages resolve, and the README's headline block is the one the
records give."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


def test_every_record_appears_on_the_results_page_with_its_commit() -> None:
    files = sorted(
        p.relative_to(hooks.RESULTS).as_posix()
        for p in [*hooks.RESULTS.glob("*.json"), *hooks.RESULTS.glob("*/*.json")]
    )
    records = hooks.load_records()
    assert [r.path for r in records] == files  # every JSON there is a record
    page = hooks.results_page(records, hooks.load_benchmarks())
    for r in records:
        section = page.split(f"### {r.ref}\n", 1)[1].split("\n### ", 1)[0]
        assert f"(records/{r.path})" in section and f"commit `{r.commit}`" in section and r.date in section
        rows = [
            line
            for line in section.splitlines()
            if line.startswith("| ") and re.search(r"\| `(results|config)\.[^`]*` \|$", line)
        ]
        assert rows, f"{r.path} shows no figure"
        for line in rows:  # the value shown is the record's value at the key shown
            _, label, value, key, _ = (c.strip() for c in re.split(r"(?<!\\)\|", line))
            spec = next((f.spec for f in hooks.HEADLINES.get(r.name, []) if f.key == key.strip("`")), "")
            assert value == hooks.fmt(r.get(key.strip("`")), spec).replace("|", "\\|"), (r.path, label)


def test_a_benchmark_page_says_how_to_run_it_and_lists_its_records() -> None:
    # the real --help runs in `make docs` (a process per benchmark); here its text is given
    records = hooks.load_records()
    bench = next(b for b in hooks.load_benchmarks() if b.name == "gmg_load")
    page = hooks.benchmark_page(bench, records, "usage: benchmarks/gmg_load.py [-h] [--operators OPERATORS]\n")
    assert ".venv/bin/python benchmarks/gmg_load.py --quick" in page
    assert "usage: benchmarks/gmg_load.py [-h] [--operators OPERATORS]" in page
    assert bench.doc.splitlines()[0].replace("``", "`") in page
    assert "### gmg_load\n" in page and "(../records/gmg_load.json)" in page
    recorded = json.loads((hooks.RESULTS / "gmg_load.json").read_text())
    assert f"| {recorded['results']['items_per_s']:,} |" in page


def test_a_benchmark_without_a_record_reports_no_figure() -> None:
    records = [r for r in hooks.load_records() if r.name != "gmg_load"]
    bench = next(b for b in hooks.load_benchmarks() if b.name == "gmg_load")
    assert "None: this benchmark has no record" in hooks.benchmark_page(bench, records, "usage: x")
    assert "[gmg_load](benchmarks/gmg_load.md)" in hooks.results_page(records, hooks.load_benchmarks())


def test_placeholders_resolve_in_every_hand_written_page_and_unknown_keys_fail() -> None:
    records = hooks.load_records()
    cited_any = False
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text, cited = hooks.expand_figures(page.read_text(), records)
        assert "{{rec:" not in text, page
        cited_any = cited_any or bool(cited)
    assert cited_any
    text, cited = hooks.expand_figures("{{rec:gmg_load:results.items_per_s}} items/s", records)
    assert (
        text == f"{hooks.fmt(records[[r.ref for r in records].index('gmg_load')].get('results.items_per_s'))} items/s"
    )
    assert [r.ref for r in cited] == ["gmg_load"]
    with pytest.raises(KeyError, match=r"has no results\.nothing"):
        hooks.expand_figures("{{rec:gmg_load:results.nothing}}", records)
    with pytest.raises(KeyError, match="no record"):
        hooks.expand_figures("{{rec:no_such_benchmark:results.x}}", records)


def test_the_readme_headline_block_is_the_records() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(hooks.README_START)
    end = readme.index(hooks.README_END) + len(hooks.README_END)
    assert readme[start:end] == hooks.readme_headline(hooks.load_records()), (
        "README.md's headline block differs from the records: run .venv/bin/python docs/hooks.py --readme"
    )
    assert len(readme.splitlines()) < 200


def test_a_records_list_items_are_cited_by_index_from_either_end() -> None:
    r = hooks.Record("fleet.json", {"results": {"sizes": [{"gpus": 50}, {"gpus": 100}]}})
    assert r.get("results.sizes.0.gpus") == 50 and r.get("results.sizes.-1.gpus") == 100
    assert r.get("results.sizes.-2.gpus") == 50
    for missing in ("results.sizes.2.gpus", "results.sizes.-3.gpus"):
        with pytest.raises(KeyError, match="has no"):
            r.get(missing)
