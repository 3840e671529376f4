"""Tasks: scoring glue on known cases, the bundled real samples, and the full benchmarks from a local copy."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from decodebench.data.paths import TASKS_DIR
from decodebench.data.taskdata import FIELDS, TaskDataError
from decodebench.metrics import SpiderError, rouge
from decodebench.metrics.rouge import sentences_per_line

PACK = Path(os.environ.get("DECODEBENCH_DATA_PACK", Path(__file__).resolve().parents[2] / "shared" / "data"))
GPQA_COLUMNS = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]
WRONG = {"Incorrect Answer 1": "no", "Incorrect Answer 2": "maybe", "Incorrect Answer 3": "never"}


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

    generation.reset_reference()
    yield
    generation.reset_reference()


@pytest.fixture(scope="module")
def local_copy(tmp_path_factory):
    """A local copy of the five benchmarks in the hub's schemas, laid out as --metadata data_dir
    expects: the real data pack's files, Spider without the one database the pack lacks, and a
    GPQA CSV of invented questions in GPQA's columns (GPQA's own must never be written out)."""
    if not PACK.is_dir():
        pytest.skip(f"the real data pack is not at {PACK} (set DECODEBENCH_DATA_PACK)")
    root = tmp_path_factory.mktemp("benchmarks")
    for name in ("squad", "cnndm", "aime"):
        (root / name).symlink_to(PACK / name)
    (root / "spider").mkdir()
    (root / "spider" / "database").symlink_to(PACK / "spider" / "database")
    rows = [json.loads(line) for line in (PACK / "spider" / "validation.jsonl").read_text().splitlines()]
    rows = [r for r in rows if (PACK / "spider" / "database" / r["db_id"] / f"{r['db_id']}.sqlite").is_file()]
    (root / "spider" / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "gpqa").mkdir()
    with open(root / "gpqa" / "gpqa_diamond.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=GPQA_COLUMNS)
        writer.writeheader()
        for i in range(3):
            writer.writerow({"Question": f"Invented question {i}?", "Correct Answer": "yes", **WRONG})
    return root


@pytest.fixture(scope="module")
def task_manager(local_copy):
    """lm-eval's task index (our folder included by the start-up hook) with --metadata data_dir set,
    built once: it reads ~15k YAMLs."""
    from lm_eval.tasks import TaskManager

    return TaskManager(metadata={"data_dir": str(local_copy)})


def load_task(manager, name):
    return manager.load([name])["tasks"][name]


def test_squad_glue_scores_a_known_case():
    utils = task_utils("squad")
    doc = {"answers": {"text": ["Robert Stevenson"], "answer_start": [119]}}
    scores = utils.process_results(doc, ["It was designed by Robert Stevenson."])
    assert scores["normalized_accuracy"] == 1.0 and scores["exact_match"] == 0.0
    assert scores["f1"] == pytest.approx(2 * (2 / 6) * 1 / (2 / 6 + 1))
    assert scores["degenerate_repetition"] == 0.0 and scores["infinigram_agreement"] is None


def test_cnndm_glue_reports_rouge_lsum_with_one_sentence_per_line():
    utils = task_utils("cnndm")
    highlights = "The bridge has reopened .\nIt cost 2.3 million pounds ."
    scores = utils.process_results({"highlights": highlights}, ["It cost millions. The bridge has reopened."])
    assert set(scores) >= {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    # summary-level LCS matches each reference sentence in any order; sentence-agnostic LCS cannot
    assert scores["rougeLsum"] > scores["rougeL"]
    assert rouge("the cat sat", "the cat sat") == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "rougeLsum": 1.0}
    assert (
        sentences_per_line("One fell. Two rose! Three?\nFour 2.5 times.")
        == "One fell.\nTwo rose!\nThree?\nFour 2.5 times."
    )


def test_aime_glue_keeps_lm_evals_exact_match():
    utils = task_utils("aime")
    doc = {"Answer": "40"}
    assert utils.process_results(doc, ["so the answer is $\\boxed{40}$"])["exact_match"] == 1
    assert utils.process_results(doc, ["so the answer is $\\boxed{41}$"])["exact_match"] == 0


def test_gpqa_shuffles_reproducibly_and_extracts_the_letter():
    utils = task_utils("gpqa")
    record = {"Question": "Q?", "Correct Answer": "right", **WRONG}
    doc = utils.shuffled(record)
    assert doc == utils.shuffled(record) and sorted(doc["choices"]) == ["maybe", "never", "no", "right"]
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
        task_utils("gpqa").load()


def test_without_the_hub_a_full_task_says_where_else_its_documents_can_come_from():
    """datasets' real offline mode (set before it is imported: a fresh interpreter) for each full task."""
    code = (
        "import importlib.util, sys\n"
        "from decodebench.data.paths import TASKS_DIR\n"
        "from decodebench.data.taskdata import TaskDataError\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.spec_from_file_location(name, TASKS_DIR / name / 'utils.py')\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(module)\n"
        "    try:\n"
        "        module.load()\n"
        "    except TaskDataError as exc:\n"
        "        assert exc.__cause__ is None and exc.__suppress_context__, 'one message, no chained traceback'\n"
        "        print(exc)\n"
    )
    benchmarks = ["squad", "cnndm", "aime", "gpqa"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", code, *benchmarks], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    messages = proc.stdout.strip().splitlines()
    assert len(messages) == len(benchmarks)
    for benchmark, message in zip(benchmarks, messages, strict=True):
        assert message.startswith(f"task {benchmark}: its documents come from the Hugging Face hub")
        assert "--metadata '{\"data_dir\": DIR}'" in message and f"--tasks {benchmark}_mini" in message


def test_the_bundled_samples_have_their_sizes_and_schemas():
    squad = task_utils("squad").load_mini()["validation"]
    assert len(squad) >= 500 and set(squad[0]) == {"id", "title", "context", "question", "answers"}
    cnndm = task_utils("cnndm").load_mini()["test"]
    assert len(cnndm) >= 100 and set(cnndm[0]) == {"article", "highlights", "id"}
    assert any(c.isupper() for c in cnndm[0]["article"]), "cnndm_mini is in original casing"
    aime = task_utils("aime").load_mini()["test"]
    assert len(aime) == 60 and len({row["ID"] for row in aime}) == 60
    assert all(row["Answer"].isdigit() for row in aime)


def test_spider_mini_runs_every_gold_query_on_its_real_databases():
    utils = task_utils("spider")
    rows = utils.load_mini()["validation"]
    assert len(rows) >= 200
    for row in rows:
        (path,) = row["db_paths"]
        assert path.startswith(str(TASKS_DIR)) and "CREATE TABLE" in row["schema"]
        assert utils.process_results(row, [row["query"]])["execution_accuracy"] == 1.0, row["query"]
    assert utils.process_results(rows[0], ["SELECT 1"])["execution_accuracy"] == 0.0


def test_the_bundled_samples_are_records_of_the_real_benchmarks():
    """Every bundled record is, unchanged, a record of the data pack (nothing is written by us)."""
    if not PACK.is_dir():
        pytest.skip(f"the real data pack is not at {PACK}")

    def records(path):
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]

    def keyed(rows):
        return {json.dumps(r, sort_keys=True) for r in rows}

    for sample, source in [
        (TASKS_DIR / "squad" / "squad_mini.jsonl", PACK / "squad" / "validation.jsonl"),
        (TASKS_DIR / "spider" / "spider_mini.jsonl", PACK / "spider" / "validation.jsonl"),
        (TASKS_DIR / "cnndm" / "cnndm_mini.jsonl", PACK / "cnndm" / "test_cased_frank.jsonl"),
    ]:
        assert keyed(records(sample)) <= keyed(records(source)), sample
    assert (TASKS_DIR / "aime" / "aime_2024.jsonl").read_bytes() == (
        PACK / "aime" / "aime24" / "train.jsonl"
    ).read_bytes()
    assert (TASKS_DIR / "aime" / "aime_2025.jsonl").read_bytes() == (
        PACK / "aime" / "aime25" / "test.jsonl"
    ).read_bytes()
    for db in (TASKS_DIR / "spider" / "database").glob("*/*.sqlite"):
        assert db.read_bytes() == (PACK / "spider" / "database" / db.parent.name / db.name).read_bytes(), db


def test_every_mini_task_says_what_it_is_and_where_it_comes_from():
    for folder in ("squad", "spider", "cnndm", "aime"):
        note = (TASKS_DIR / folder / "DATA.md").read_text()
        assert "License" in note or "Licenses" in note or "Terms" in note
        yaml = (TASKS_DIR / folder / f"{folder}_mini.yaml").read_text()
        assert "sample:" in yaml and "not the benchmark" in yaml


def test_real_spider_needs_its_databases_and_says_where_to_put_them(tmp_path):
    utils = task_utils("spider")
    with pytest.raises(SpiderError, match="data_dir"):
        utils.load()
    with pytest.raises(SpiderError, match="missing: expected"):
        utils._with_databases([{"db_id": "concert_singer", "question": "?", "query": "SELECT 1"}], tmp_path)


def test_broken_spider_data_is_found_at_load_and_named(tmp_path):
    """Each found before any generation (they used to surface only at scoring, and the run was lost)."""
    import shutil

    utils = task_utils("spider")
    real = TASKS_DIR / "spider" / "database" / "concert_singer" / "concert_singer.sqlite"
    record = {"db_id": "concert_singer", "question": "How many singers?", "query": "SELECT count(*) FROM singer"}

    def folder(name: str) -> Path:
        (tmp_path / name / "concert_singer").mkdir(parents=True)
        return tmp_path / name

    empty = folder("empty")
    (empty / "concert_singer" / "concert_singer.sqlite").write_bytes(b"")
    with pytest.raises(SpiderError, match=r"concert_singer\.sqlite has no tables"):
        utils._with_databases([record], empty)
    failing = folder("failing")
    shutil.copy(real, failing / "concert_singer" / "concert_singer.sqlite")
    with pytest.raises(SpiderError, match=r"the gold query fails on .*concert_singer\.sqlite: .*no such table"):
        utils._with_databases([{**record, "query": "SELECT count(*) FROM singers"}], failing)
    extra = folder("extra")
    shutil.copy(real, extra / "concert_singer" / "concert_singer.sqlite")
    (extra / "concert_singer" / "concert_singer_2.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(SpiderError, match=r"concert_singer_2\.sqlite .*file is not a database"):
        utils._with_databases([record], extra)


@pytest.mark.parametrize(
    ("benchmark", "content", "message"),
    [
        ("squad", b'{"context": "c", "question": "q", "answers": {"text": ["a"]}}\n{"context": "cu', r":2: not valid"),
        ("squad", b'{"context": "caf\xe9"}\n', r"not UTF-8 text"),
        ("squad", b"", r"no records; each record must be an object with the fields 'context'"),
        ("squad", b'{"context": "c", "question": "q"}\n', r":1: the record has no 'answers.text'"),
        ("squad", b'["context", "question"]\n', r":1: a JSON list where an object is expected"),
        ("cnndm", b'{"article": "a"}\n', r":1: the record has no 'highlights'"),
        ("aime", b'{"Question": "q"}\n', r":1: the record has no 'Answer'"),
    ],
)
def test_corrupt_local_data_names_the_file_the_line_and_what_a_record_holds(tmp_path, benchmark, content, message):
    from decodebench.data.taskdata import LOCAL_FILES

    path = tmp_path / LOCAL_FILES[benchmark]
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(TaskDataError, match=message) as caught:
        task_utils(benchmark).load(data_dir=str(tmp_path))
    assert str(path) in str(caught.value)


def test_spider_questions_without_their_gold_query_are_refused(tmp_path):
    from decodebench.data.taskdata import read_records

    path = tmp_path / "validation.jsonl"
    path.write_text('{"db_id": "concert_singer", "question": "How many?"}\n')
    with pytest.raises(TaskDataError, match=r"validation\.jsonl:1: the record has no 'query'"):
        read_records(path, FIELDS["spider"])


def test_a_gpqa_csv_without_its_answer_columns_says_which_are_missing(tmp_path):
    path = tmp_path / "gpqa" / "gpqa_diamond.csv"
    path.parent.mkdir(parents=True)
    path.write_text("Question,Correct Answer\nWhat?,This\n")
    with pytest.raises(TaskDataError, match=r"gpqa_diamond\.csv: no column\(s\) 'Incorrect Answer 1'"):
        task_utils("gpqa").load(data_dir=str(tmp_path))


def test_a_data_dir_without_the_benchmark_says_what_it_must_hold(tmp_path):
    with pytest.raises(TaskDataError, match=r"squad/validation\.jsonl does not exist.*gpqa/gpqa_diamond\.csv"):
        task_utils("squad").load(data_dir=str(tmp_path))


@pytest.mark.parametrize(
    ("task", "documents"), [("squad", 10570), ("cnndm", 4490), ("aime", 933), ("gpqa", 3), ("spider", 972)]
)
def test_the_full_benchmarks_load_from_a_local_copy_through_metadata(task, documents, task_manager):
    """`--metadata '{"data_dir": DIR}'`: the full tasks read the hub's schema from DIR, no hub needed."""
    loaded = load_task(task_manager, task)
    docs = list(loaded.eval_docs)
    assert len(docs) == documents
    prompt = loaded.doc_to_text(docs[0])
    assert prompt and "{{" not in prompt
    scores = loaded.process_results(docs[0], [str(loaded.doc_to_target(docs[0]))])
    assert scores["degenerate_repetition"] == 0.0
    assert {"normalized_accuracy", "rouge1", "exact_match", "execution_accuracy"} & set(scores)


def test_task_index_resolves_our_names_over_lm_evals(task_manager):
    manager = task_manager
    for name in ("squad", "spider", "cnndm", "aime", "gpqa", "squad_mini", "decodebench_mini"):
        entry = manager._index[name]
        assert str(TASKS_DIR) in str(entry.yaml_path), f"{name} resolves to {entry.yaml_path}"
    assert "lm_eval" in str(manager._index["gpqa_diamond_zeroshot"].yaml_path)  # lm-eval's own variants stay
