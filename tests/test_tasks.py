"""Task YAMLs and their scoring glue: known cases, real-task configs on local files, bad data."""

from __future__ import annotations

import importlib.util
import sqlite3

import pytest

from decodebench.metrics import SpiderError, rouge
from decodebench.paths import TASKS_DIR


def task_utils(folder: str):
    """A task folder's utils.py, loaded by path as lm-eval does."""
    spec = importlib.util.spec_from_file_location(f"utils_{folder}", TASKS_DIR / folder / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def no_infinigram(monkeypatch):
    """Scoring glue is tested without the reference index (tests/test_infinigram.py covers it)."""
    monkeypatch.setenv("DECODEBENCH_INFINIGRAM_INDEX", "none")
    from decodebench.metrics import generation

    generation._index.cache_clear()
    yield
    generation._index.cache_clear()


@pytest.fixture(scope="module")
def task_manager():
    """lm-eval's task index (our folder included by the start-up hook), built once: it reads ~15k YAMLs."""
    from lm_eval.tasks import TaskManager

    return TaskManager()


def test_squad_glue_scores_a_known_case():
    utils = task_utils("squad")
    doc = {"answers": {"text": ["Robert Stevenson"], "answer_start": [119]}}
    scores = utils.process_results(doc, ["It was designed by Robert Stevenson."])
    assert scores["normalized_accuracy"] == 1.0 and scores["exact_match"] == 0.0
    assert scores["f1"] == pytest.approx(2 * (2 / 6) * 1 / (2 / 6 + 1))
    assert scores["degenerate_repetition"] == 0.0 and scores["infinigram_agreement"] is None
    rows = utils.load_mini()["validation"]
    assert len(rows) == 16 and set(rows[0]) >= {"id", "title", "context", "question", "answers"}


def test_cnndm_glue_uses_rouge_against_the_highlights():
    utils = task_utils("cnndm")
    doc = {"highlights": "The bridge has reopened.\nIt cost 2.3 million pounds."}
    scores = utils.process_results(doc, ["The bridge has reopened after repairs."])
    assert scores["rouge1"] == pytest.approx(
        rouge("The bridge has reopened after repairs.", doc["highlights"])["rouge1"]
    )
    assert rouge("the cat sat", "the cat sat") == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    assert rouge("dogs bark", "the cat sat")["rouge1"] == 0.0


def test_aime_glue_keeps_lm_evals_exact_match():
    utils = task_utils("aime")
    doc = {"Answer": "40"}
    assert utils.process_results(doc, ["so the answer is $\\boxed{40}$"])["exact_match"] == 1
    assert utils.process_results(doc, ["so the answer is $\\boxed{41}$"])["exact_match"] == 0
    assert len(utils.load_mini()["test"]) == 8


def test_gpqa_shuffles_reproducibly_and_extracts_the_letter():
    utils = task_utils("gpqa")
    record = {
        "Question": "Q?",
        "Correct Answer": "right",
        "Incorrect Answer 1": "w1",
        "Incorrect Answer 2": "w2",
        "Incorrect Answer 3": "w3",
    }
    doc = utils.shuffled(record)
    assert doc == utils.shuffled(record) and sorted(doc["choices"]) == ["right", "w1", "w2", "w3"]
    assert doc["choices"]["ABCD".index(doc["answer"])] == "right"
    assert utils.extract_letter("(A) is tempting, but the answer is (C).") == "C"
    assert utils.extract_letter("I think (B) fits best.") == "B"
    assert utils.extract_letter("Final: D") == "D"
    assert utils.extract_letter("no idea") is None
    letter = doc["answer"]
    assert utils.process_results(doc, [f"The answer is ({letter})"])["exact_match"] == 1.0
    answers = {utils.shuffled({**record, "Question": f"Q{i}?"})["answer"] for i in range(40)}
    assert answers == set("ABCD"), "the correct choice must not always sit in the same place"


def test_gpqa_gated_access_says_how_to_log_in(monkeypatch):
    import datasets

    def gated(*args, **kwargs):
        raise datasets.exceptions.DatasetNotFoundError("Dataset 'Idavidrein/gpqa' is a gated dataset on the Hub.")

    monkeypatch.setattr(datasets, "load_dataset", gated)
    with pytest.raises(RuntimeError, match="hf auth login"):
        task_utils("gpqa").load_gpqa()


def test_spider_mini_databases_build_and_every_gold_query_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_HOME", str(tmp_path))
    utils = task_utils("spider")
    rows = utils.load_mini()["validation"]
    assert len(rows) == 20
    for row in rows:
        (path,) = row["db_paths"]
        assert path.startswith(str(tmp_path)) and "CREATE TABLE" in row["schema"]
        assert sqlite3.connect(path).execute(row["query"]).fetchall(), row["query"]
        scores = utils.process_results(row, [row["query"]])
        assert scores["execution_accuracy"] == 1.0
    assert utils.process_results(rows[0], ["SELECT 1"])["execution_accuracy"] == 0.0


def test_real_spider_needs_its_databases_and_says_where_to_get_them(tmp_path):
    utils = task_utils("spider")
    with pytest.raises(SpiderError, match="spider_db_dir"):
        utils.load_spider()
    with pytest.raises(SpiderError, match="missing: expected"):
        utils._with_databases([{"db_id": "concert_singer", "question": "?", "query": "SELECT 1"}], tmp_path)


def test_math_word_mini_takes_the_last_number():
    utils = task_utils("math_word_mini")
    assert utils.final_number("12 + 7 = 19 cows, 19 x 3 = 57. The answer is 57.") == "57"
    assert utils.final_number("It is 1,200.0 liters") == "1200"
    assert utils.final_number("no number") is None


@pytest.mark.parametrize(
    ("task", "local_data"),
    [("squad", "squad/squad_mini.jsonl"), ("cnndm", "cnndm/cnndm_mini.jsonl"), ("aime", "aime/aime_mini.jsonl")],
)
def test_real_task_configs_run_on_local_files_of_the_same_schema(task, local_data, task_manager):
    """The hub-backed YAMLs, with their dataset swapped for a local file of the real schema."""
    manager = task_manager
    config = _load_config(manager._index[task].yaml_path)
    split = config.get("test_split") or config.get("validation_split")
    config.update(
        dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": {split: str(TASKS_DIR / local_data)}}
    )
    loaded = manager.load([config])["tasks"]
    (instance,) = loaded.values()
    docs = list(instance.eval_docs)
    prompt = instance.doc_to_text(docs[0])
    assert prompt and "{{" not in prompt
    target = instance.doc_to_target(docs[0])
    scores = instance.process_results(docs[0], [str(target)])
    assert scores["degenerate_repetition"] == 0.0
    assert {"normalized_accuracy", "rouge1", "exact_match"} & set(scores)


def _load_config(path):
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(path, resolve_func=True)


def test_task_index_resolves_our_names_over_lm_evals(task_manager):
    manager = task_manager
    for name in ("squad", "spider", "cnndm", "aime", "gpqa", "squad_mini", "decodebench_mini"):
        entry = manager._index[name]
        assert str(TASKS_DIR) in str(entry.yaml_path), f"{name} resolves to {entry.yaml_path}"
    assert "lm_eval" in str(manager._index["gpqa_diamond_zeroshot"].yaml_path)  # lm-eval's own variants stay
