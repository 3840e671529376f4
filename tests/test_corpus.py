"""The one corpus reader (build-index, train-nugget): formats, field names, and errors that name the place."""

from __future__ import annotations

import pytest

from decodebench.corpus import CorpusError, read_corpus


def test_jsonl_text_or_article_txt_paragraphs_and_folders(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n\n{"article": "two", "highlights": "x"}\n')
    (tmp_path / "b.txt").write_text("three\n\nfour\n\n\n")
    assert list(read_corpus(tmp_path)) == ["one", "two", "three", "four"]
    assert list(read_corpus(tmp_path / "b.txt")) == ["three", "four"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"text": "ok"}\n{"text": "cut', r"a\.jsonl:2: not valid JSON"),
        (b'{"text": "ok"}\n["a list"]\n', r"a\.jsonl:2: expected a JSON object with a 'text' or 'article'"),
        (b'{"title": "no text"}\n', r"a\.jsonl:1: expected a JSON object"),
        (b'{"text": 3}\n', r"a\.jsonl:1: expected"),
        (b'{"text": "caf\xe9"}\n', r"a\.jsonl: not UTF-8 text"),
        (b"\n\n", r"no documents"),
    ],
)
def test_malformed_corpus_names_the_file_and_line(tmp_path, content, expected):
    corpus = tmp_path / "a.jsonl"
    corpus.write_bytes(content)
    with pytest.raises(CorpusError, match=expected):
        list(read_corpus(corpus))


def test_missing_or_empty_folder(tmp_path):
    with pytest.raises(CorpusError, match="no such file or folder"):
        list(read_corpus(tmp_path / "nothing"))
    with pytest.raises(CorpusError, match=r"no \.jsonl or \.txt files"):
        list(read_corpus(tmp_path))
