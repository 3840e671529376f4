"""Every page under docs/ is recomputable from the repository: rendered again from its committed data
folder (studies/common.py: PAGES), it must equal the committed page to the character; a page whose data
is lost must say so at its top (NOT_RECOMPUTABLE)."""

from __future__ import annotations

import importlib
import itertools
import json
import shutil
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "studies"))
import common

PAGES = sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("**/*.md") if "docs/data/" not in str(p))


def render(page: str) -> str:
    study = importlib.import_module(common.PAGES[page])
    return study.render(common.data_dir(REPO / page))


def test_every_page_is_either_recomputable_or_says_it_is_not():
    known = set(common.PAGES) | set(common.NOT_RECOMPUTABLE) | set(common.DESIGN_NOTES) | set(common.REFERENCE)
    unknown = [page for page in PAGES if page not in known]
    assert not unknown, f"pages with no study to render them and no note that they cannot be: {unknown}"
    assert not set(common.PAGES) & set(common.NOT_RECOMPUTABLE)


@pytest.mark.parametrize("page", common.DESIGN_NOTES)
def test_a_design_note_says_it_measures_nothing(page):
    head = "\n".join((REPO / page).read_text().splitlines()[:4])
    assert common.DESIGN_NOTE_BANNER in head


@pytest.mark.parametrize("page", common.REFERENCE)
def test_a_reference_page_says_it_measures_nothing(page):
    head = "\n".join((REPO / page).read_text().splitlines()[:4])
    assert common.REFERENCE_BANNER in head


def test_the_pages_index_reaches_every_page_and_every_link_of_the_readme_and_the_index_resolves():
    """docs/README.md lists every page under docs/ (one line each), and no link of it or of the README leads nowhere."""
    import re

    index = REPO / "docs" / "README.md"
    linked = {(index.parent / target).resolve() for target in re.findall(r"\]\(([^)#]+)\)", index.read_text())}
    pages = {p.resolve() for p in (REPO / "docs").glob("**/*.md") if "docs/data/" not in str(p) and p != index}
    assert not pages - linked, f"pages docs/README.md does not list: {sorted(map(str, pages - linked))}"
    readme = REPO / "README.md"
    targets = re.findall(r"\]\(((?!https?:)[^)#]+)\)", readme.read_text())
    missing = [t for t in targets if not (REPO / t).exists()] + [str(p) for p in linked if not p.exists()]
    assert not missing, f"links that lead nowhere: {missing}"


@pytest.mark.parametrize("page", sorted(common.PAGES))
def test_page_renders_from_its_committed_data_unchanged(page):
    rendered = render(page)
    committed = (REPO / page).read_text()
    assert rendered == committed, f"{page} differs from what its data renders: rerun its study or restore the page"


@pytest.mark.parametrize("page", sorted(common.NOT_RECOMPUTABLE))
def test_a_page_without_data_says_so_first(page):
    head = "\n".join((REPO / page).read_text().splitlines()[:4])
    assert common.NOT_RECOMPUTABLE_BANNER in head and common.NOT_RECOMPUTABLE[page] in head


def test_an_edited_number_is_caught(tmp_path):
    page = sorted(common.PAGES)[0]
    committed = (REPO / page).read_text()
    digit = next(i for i, c in enumerate(committed) if c.isdigit() and i > committed.index("\n\n"))
    edited = committed[:digit] + str((int(committed[digit]) + 1) % 10) + committed[digit + 1 :]
    assert render(page) != edited


def test_a_rerun_replaces_a_pages_data_and_a_failed_one_leaves_the_previous_in_place(tmp_path):
    """A page's data folder holds one run's data: a rerun's files replace the last run's (no stale results file
    beside the new one), and a run that fails part-way restores what was there."""
    from types import SimpleNamespace

    args = SimpleNamespace(doc=str(tmp_path / "page.md"), from_data=None)
    folder = common.data_dir(args.doc)

    def collect_writing(name):
        def collect(into, argv):
            common.save_json(into, name, {"argv": argv})

        return collect

    def render(data):
        return " ".join(sorted(p.name for p in data.iterdir()))

    common.page(args, [], collect_writing("first.json"), render)
    common.page(args, [], collect_writing("second.json"), render)
    assert (tmp_path / "page.md").read_text() == "second.json"

    def failing(into, argv):
        common.save_json(into, "partial.json", {})
        raise RuntimeError("the run stopped")

    with pytest.raises(RuntimeError, match="the run stopped"):
        common.page(args, [], failing, render)
    assert sorted(p.name for p in folder.iterdir()) == ["second.json"]
    assert not folder.with_name(folder.name + ".previous").exists()


def test_nugget_kept_finds_an_answers_tokens_by_their_characters():
    from nugget_kept import answer_tokens

    context = "The cat sat on the mat."
    prompt = "<s>user\n" + context + "\n\nWhere did the cat sit?"
    at = prompt.index(context)
    # tokens: "<s>user\n", "The", " cat", " sat", " on", " the", " ma", "t.", "\n\nWhere..."
    cuts = [0, at, at + 3, at + 7, at + 11, at + 14, at + 18, at + 21, at + 23, len(prompt)]
    offsets = list(itertools.pairwise(cuts))
    assert answer_tokens(offsets, prompt, context, context.index("the mat"), "the mat") == [5, 6, 7]
    assert answer_tokens(offsets, prompt, context, 4, "cat") == [2]
    with pytest.raises(ValueError, match="not found"):
        answer_tokens(offsets, prompt, context, 0, "cat")


@pytest.mark.model
def test_nugget_kept_gates_a_checkpoint_beside_the_built_in_selectors(tmp_path):
    """``--checkpoint``: a train-nugget file scored at its own ratio; the shipped ratio-5 file given by path keeps,
    question by question, what ``selector=trained`` keeps at ratio 5."""
    import json

    import nugget_kept

    from decodebench.models.nugget.shipped import shipped_checkpoint

    path = shipped_checkpoint(5)
    doc = tmp_path / "gate.md"
    argv = ["--checkpoint", str(path), "--selectors", "trained,truncation", "--limit", "3", "--doc", str(doc)]
    assert nugget_kept.main(argv) == 0
    records = json.loads((common.data_dir(doc) / "answers_kept.json").read_text())
    assert len(records) == 3 and set(records[0]["wrapper=kept"]) == {
        "trained@5",
        "trained@10",
        "truncation@5",
        "truncation@10",
        f"{path.stem}@5",
    }
    for layout in ("wrapper=kept", "wrapper=compressed"):
        assert [r[layout][f"{path.stem}@5"] for r in records] == [r[layout]["trained@5"] for r in records]
    assert f"| {path.stem} | 5 |" in doc.read_text()
    # the kept token types: the same scorer keeps the same tokens; truncation keeps more at ratio 5 than at 10
    types = json.loads((common.data_dir(doc) / "kept_types.json").read_text())
    assert types[f"{path.stem}@5"] == types["trained@5"] and types["trained@5"]["kept"] > 0
    assert types["truncation@5"]["kept"] > types["truncation@10"]["kept"]
    section = doc.read_text().split("## What each selector keeps of the documents")[1].split("\n## ")[0]
    assert f"| {path.stem} | 5 | {types['trained@5']['kept']} |" in section


def lm_eval_stand_in(made: list):
    """A stand-in for the nugget study's lm_eval run: records in ``made`` that a run was asked for and leaves its
    results file."""

    class Run:
        def __init__(self, folder):
            self.folder = folder

        def run_or_raise(self, what):
            made.append(self.folder)
            (self.folder / "model").mkdir(parents=True)
            (self.folder / "model" / "results_1.json").write_text("{}")
            return self.folder / "model" / "results_1.json"

    return Run


def test_nugget_study_reuses_a_kept_run_only_for_the_same_method_code(tmp_path, monkeypatch):
    nugget_study = importlib.import_module("nugget_study")
    made = []
    Run = lm_eval_stand_in(made)
    monkeypatch.setattr(nugget_study, "nugget_run", lambda name, ratio, task, folder, **options: Run(folder))
    assert len(nugget_study.method_code()) == 64
    first = nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8)
    assert nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8) == first and len(made) == 1
    monkeypatch.setattr(nugget_study, "method_code", lambda: "f" * 64)  # the selection code changed since
    assert nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8) != first and len(made) == 2
    # a finished run the study did not make (no maker file: put there by something else) is run again
    (first.parents[1] / nugget_study.MAKER_FILE).unlink()
    monkeypatch.undo()
    monkeypatch.setattr(nugget_study, "nugget_run", lambda name, ratio, task, folder, **options: Run(folder))
    assert nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8) == first and len(made) == 3
    assert (first.parents[1] / nugget_study.MAKER_FILE).is_file()


def test_nugget_studies_sharing_an_output_folder_make_each_run_once(tmp_path, monkeypatch):
    """Two study commands side by side on one --out: a run the other is making (its lock held) is passed over without
    waiting, and once that one is done it is reused, not made again."""
    from filelock import FileLock

    nugget_study = importlib.import_module("nugget_study")
    made = []
    Run = lm_eval_stand_in(made)
    monkeypatch.setattr(nugget_study, "nugget_run", lambda name, ratio, task, folder, **options: Run(folder))
    first = nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8)
    folder = first.parents[1]
    shutil.rmtree(folder)  # the other study is making this run now, holding its lock
    with FileLock(folder.with_name(f"{folder.name}.lock")):
        assert nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8, wait=False) is None
        assert len(made) == 1
        Run(folder).run_or_raise("the other study")  # which finishes it and records making it
        (folder / nugget_study.MAKER_FILE).write_text("{}")
    assert nugget_study.run_lm_eval(tmp_path, "salience", 5, "squad_mini", None, 8) == first and len(made) == 2


def test_a_kept_run_enters_the_shared_store_whole(tmp_path, monkeypatch):
    """The study pages share docs/data/nugget-runs and may be written side by side: a run one study is keeping is
    never seen half copied by the other (its folder appears with its results, samples and maker file in it), and
    the study that comes second reads the first one's copy."""
    nugget_study = importlib.import_module("nugget_study")
    stamp = "2026-12-05T10-00-00.000000"
    results = tmp_path / "out" / "salience-r-5" / "squad_mini-run" / "model" / f"results_{stamp}.json"
    results.parent.mkdir(parents=True)
    results.write_text("{}")
    (results.parent / f"samples_squad_mini_{stamp}.jsonl").write_text('{"doc_id": 0}\n')
    (results.parents[1] / nugget_study.MAKER_FILE).write_text('{"command": "the study"}')
    first, second = tmp_path / "data" / "page-a", tmp_path / "data" / "page-b"
    kept = nugget_study.run_store(first) / "salience-r-5" / f"squad_mini-{stamp}"
    keep, seen = nugget_study.keep_lm_eval_run, []

    def keep_watched(results, folder):
        seen.append(kept.exists())
        keep(results, folder)
        seen.append(kept.exists())

    monkeypatch.setattr(nugget_study, "keep_lm_eval_run", keep_watched)
    nugget_study.keep_run(first, "salience", 5, "squad_mini", results)
    assert seen == [False, False]
    whole = sorted(p.name for p in kept.iterdir())
    assert whole == [nugget_study.MAKER_FILE, f"results_{stamp}.json.xz", f"samples_squad_mini_{stamp}.jsonl.xz"]

    # the second study started copying before the first one's copy appeared: it keeps the first's, leaves nothing
    kept_first = {p.name: p.read_bytes() for p in kept.iterdir()}
    shutil.rmtree(kept)

    def the_other_study_finishes_first(results, folder):
        keep(results, folder)
        shutil.copytree(folder, kept)

    monkeypatch.setattr(nugget_study, "keep_lm_eval_run", the_other_study_finishes_first)
    nugget_study.keep_run(second, "salience", 5, "squad_mini", results)
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == kept_first
    runs = common.load_json(second, nugget_study.RUNS_FILE)
    assert runs == {"salience-r-5": {"squad_mini": f"salience-r-5/squad_mini-{stamp}"}}

    # a copy stopped midway (the disk full, the command interrupted) leaves nothing in the store
    shutil.rmtree(kept)

    def stopped_midway(results, folder):
        (folder / f"results_{stamp}.json.xz").write_bytes(b"")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nugget_study, "keep_lm_eval_run", stopped_midway)
    with pytest.raises(OSError, match="No space left"):
        nugget_study.keep_run(second, "salience", 5, "squad_mini", results)
    assert list(kept.parent.iterdir()) == []


def test_a_nugget_study_page_names_the_rows_its_command_did_not_make(tmp_path):
    """A kept run that finished before the page's command started was not made by it (issue 66): the page names
    it; a page whose every run falls inside its command's time names none."""
    nugget_study = importlib.import_module("nugget_study")
    runs = {
        "full": {"squad_mini": "full/squad_mini-2026-11-25T14-17-19.629455"},
        "salience-r-5": {"squad_mini": "salience-r-5/squad_mini-2026-11-29T05-00-00.000000"},
        "truncation-r-5": {"squad_mini": "truncation-r-5/squad_mini-2026-11-29T05-30-00.000000"},
    }
    common.save_json(tmp_path, nugget_study.RUNS_FILE, runs)
    (line,) = nugget_study.made_elsewhere(tmp_path, {"seconds": 3600})
    assert "1 of the page's 3 runs" in line and "full on squad_mini (2026-11-25)" in line
    assert "salience" not in line and "truncation" not in line
    # the same runs under a command that took long enough to have made them all
    assert nugget_study.made_elsewhere(tmp_path, {"seconds": 4 * 24 * 3600}) == []
    # a run the study recorded making (its maker file kept beside it) is its own, whenever it finished
    kept = nugget_study.run_store(tmp_path) / runs["full"]["squad_mini"]
    kept.mkdir(parents=True)
    (kept / nugget_study.MAKER_FILE).write_text("{}")
    assert nugget_study.made_elsewhere(tmp_path, {"seconds": 3600}) == []


def test_a_kvpress_peers_file_stopped_midway_is_run_again(tmp_path):
    """kvpress_peers.py writes its output after each batch and names a press finished only at its end: a run stopped
    midway leaves a file that must not pass for a finished one (tests/kvpress_check.py: started again, it goes on)."""
    nugget_study = importlib.import_module("nugget_study")
    peers = tmp_path / "peers.json"
    assert not nugget_study.has_presses(peers, "KVzip,KNorm")
    answered = {"squad_mini": {"scores": {"0": 1.0}}}
    peers.write_text(json.dumps({"machine": {}, "ratio": 5, "left_out": {}, "KVzip": answered, "KNorm": answered}))
    assert not nugget_study.has_presses(peers, "KVzip")  # answers, but no press named finished
    peers.write_text(json.dumps({"ratio": 5, "KVzip": answered, "KNorm": answered, "finished": ["KVzip"]}))
    assert not nugget_study.has_presses(peers, "KVzip,KNorm")
    assert nugget_study.has_presses(peers, "KVzip")
