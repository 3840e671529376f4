"""The one corpus reader (build-index, train-nugget): formats, field names, and errors that name the place."""

from __future__ import annotations

import pytest

from decodebench.data.corpus import CorpusError, read_corpus


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
    with pytest.raises(CorpusError, match=r"no \.jsonl, \.txt or dictd \.index files"):
        list(read_corpus(tmp_path))


def dictd_number(value: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    out = ""
    while True:
        value, digit = divmod(value, 64)
        out = digits[digit] + out
        if not value:
            return out


def write_dictd(folder, entries: dict[str, str], compress=True):
    """A dictd database as dictfmt writes one: the entries' text, and an index of headword, offset, length."""
    import gzip

    data, index = b"", []
    for headword, text in entries.items():
        body = text.encode()
        index.append(f"{headword}\t{dictd_number(len(data))}\t{dictd_number(len(body))}\n")
        data += body
    index.append("an alias" + index[-2][index[-2].index("\t") :])  # a second headword for the entry before last
    (folder / "test.index").write_text("".join(index))
    (folder / ("test.dict.dz" if compress else "test.dict")).write_bytes(gzip.compress(data) if compress else data)
    return folder / "test.index"


def test_a_dictd_database_reads_as_one_document_per_entry_unwrapped(tmp_path):
    index = write_dictd(
        tmp_path,
        {
            "00-database-info": "This file was converted by dictfmt.\n",
            "barnacle": "barnacle\n\n   A {crustacean} that lives fixed\n   to rocks.\n\n   See also {limpet}.\n",
            "limpet": "limpet\n\n   A sea snail with a\n   conical shell.\n",
        },
    )
    expected = [
        "barnacle\n\nA crustacean that lives fixed to rocks.\n\nSee also limpet.",
        "limpet\n\nA sea snail with a conical shell.",
    ]
    assert list(read_corpus(index)) == expected  # the alias does not repeat its entry
    assert list(read_corpus(tmp_path)) == expected  # a folder finds the index
    (tmp_path / "test.dict.dz").rename(tmp_path / "elsewhere.dz")
    with pytest.raises(CorpusError, match=r"test\.index: a dictd index needs its test\.dict\.dz or test\.dict"):
        list(read_corpus(index))
    (tmp_path / "test.dict").write_bytes(b"short")
    with pytest.raises(CorpusError, match=r"test\.index:2: the entry ends at byte \d+, past .*test\.dict's 5"):
        list(read_corpus(index))
    index.write_text("barnacle\tA!\tB\n")
    with pytest.raises(CorpusError, match=r"test\.index:1: 'A!' is not a dictd base-64 offset"):
        list(read_corpus(index))


def test_the_default_training_corpus_says_how_to_install_it(monkeypatch, tmp_path):
    from decodebench.data import corpus

    missing = {str(tmp_path / "foldoc.index"): ("FOLDOC", "GFDL 1.1+", "dict-foldoc")}
    monkeypatch.setattr(corpus, "PROSE_DICTIONARIES", missing)
    with pytest.raises(CorpusError, match=r"missing .*foldoc\.index.*`apt-get install dict-foldoc`"):
        corpus.prose_corpus()


def test_a_dictd_entrys_cross_references_are_the_spans_of_their_terms_in_the_same_text(tmp_path):
    """What `--recipe answer-spans` learns from: the terms the authors marked, found in exactly the text the plain
    reader gives (a term wrapped across lines, a brace alone on a line, code braces at a paragraph's edge)."""
    from decodebench.data.corpus import read_dictd_terms

    index = write_dictd(
        tmp_path,
        {
            "barnacle": "barnacle\n\n   A {crustacean} that lives on {\n   rocky shores}.\n\n   See also {limpet }.\n",
            "brace style": "brace style\n\n   if (cond)\n   {\n\n   <body>\n\n   }\n   Named by {K&R}.\n",
            "limpet": "limpet\n\n   A {sea\n   snail} with a conical shell. See\n   {barnacle}\n",
        },
    )
    read = list(read_dictd_terms(index))
    assert [text for text, _ in read] == list(read_corpus(index))
    assert [[text[begin:end] for begin, end in terms] for text, terms in read] == [
        ["crustacean", "rocky shores", "limpet"],
        ["K&R"],  # the code's braces span paragraphs: no term
        ["sea snail", "barnacle"],
    ]
