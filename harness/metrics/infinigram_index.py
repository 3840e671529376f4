"""infini-gram indexes: build them with a model's tokenizer, open them safely, and query them.

The ``infini-gram`` package (Liu et al.) answers n-gram and infinity-gram queries from a suffix
array with a C++ engine; its indexer only knows a few hub tokenizers, so ``build_index`` writes
the token shard itself (``tokenized.0``: every document as ``0xFF..FF`` then its token ids,
little-endian; ``offset.0``: the byte offset of each document) and then runs the package's own
suffix-array builder (``python -m infini_gram.indexing``), which skips its tokenization step when
those files exist. Next to the index goes ``decodebench-index.json``: the tokenizer, vocabulary,
token width and corpus size, so that an index is never queried with another tokenizer.

The default *reference index* is built on first use under ``$DECODEBENCH_HOME/indexes/`` from a
corpus that needs no download: Python's own reference documentation (``pydoc_data.topics``,
PSF license, ~465 KB of English, shipped with every CPython) plus decodebench's bundled task
texts. It proves the pipeline; real agreement studies point ``index=`` at a large index, for
example one of the public prebuilt ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from decodebench.paths import home

META_FILE = "decodebench-index.json"
# The indexer splits a shard into parts with a 100000-byte overlap; smaller shards fail.
MIN_SHARD_BYTES = 100_000 + 64
RAM_INDEX_BYTES = 2 * 2**30


class InfinigramIndexError(RuntimeError):
    """An index that is missing, corrupt, too small, or built with another tokenizer."""


@dataclass(frozen=True)
class IndexInfo:
    path: Path
    tokenizer: str  # what built it: a path or hub id
    tokenizer_fingerprint: str  # hash of the tokenizer's vocabulary
    vocab_size: int
    eos_token_id: int
    token_dtype: str  # "u16" or "u32"
    documents: int
    tokens: int


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _dtype_for(vocab_size: int) -> tuple[str, type]:
    # all-ones is the document separator, so the largest id must stay below it
    return ("u16", np.uint16) if vocab_size < 2**16 - 1 else ("u32", np.uint32)


def read_corpus(path: Path) -> Iterable[str]:
    """Documents of a .jsonl file ("text" field), a .txt file (one per blank-line-separated
    paragraph), or a folder of either."""
    paths = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".txt")) if path.is_dir() else [path]
    if not paths:
        raise InfinigramIndexError(f"no .jsonl or .txt corpus files under {path}")
    for file in paths:
        if file.suffix == ".jsonl":
            with open(file, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            yield json.loads(line)["text"]
                        except (json.JSONDecodeError, KeyError) as exc:
                            raise InfinigramIndexError(
                                f"{file}:{number}: expected a JSON object with a 'text' field"
                            ) from exc
        else:
            yield from (p for p in file.read_text(encoding="utf-8").split("\n\n") if p.strip())


def build_index(
    documents: Iterable[str | list[int]],
    out: Path,
    tokenizer,
    tokenizer_name: str,
    mem_gib: int = 2,
    log: Callable[[str], None] = print,
) -> IndexInfo:
    """Tokenize ``documents`` (texts, or token id lists already) and build an infini-gram index at ``out``.

    Written in a temporary folder and renamed into place, like the embedded model.
    """
    out = Path(out).resolve()
    if out.exists():
        raise InfinigramIndexError(f"{out} already exists; remove it or choose another --out")
    vocab_size = len(tokenizer)
    dtype_name, dtype = _dtype_for(vocab_size)
    separator = np.array([np.iinfo(dtype).max], dtype=dtype).tobytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        n_docs = n_tokens = 0
        with open(partial / "tokenized.0", "wb") as data, open(partial / "offset.0", "wb") as offsets:
            position = 0
            for document in documents:
                ids = tokenizer(document, add_special_tokens=False).input_ids if isinstance(document, str) else document
                ids = np.asarray(ids, dtype=dtype)
                offsets.write(np.array([position], dtype=np.uint64).tobytes())
                chunk = separator + ids.tobytes()
                data.write(chunk)
                position += len(chunk)
                n_docs += 1
                n_tokens += len(ids)
        if position < MIN_SHARD_BYTES:
            raise InfinigramIndexError(
                f"the corpus is too small to index: {n_tokens} tokens ({position} bytes); infini-gram's "
                f"indexer needs at least {MIN_SHARD_BYTES} bytes, about {MIN_SHARD_BYTES // dtype().nbytes} tokens"
            )
        log(f"tokenized {n_docs} documents, {n_tokens} tokens; building the suffix array ...")
        with tempfile.TemporaryDirectory() as empty:
            command = [
                sys.executable,
                "-m",
                "infini_gram.indexing",
                "--data_dir",
                empty,
                "--save_dir",
                str(partial),
                "--token_dtype",
                dtype_name,
                "--cpus",
                "1",
                "--mem",
                str(mem_gib),
                "--ulimit",
                "1024",
            ]
            proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0 or not (partial / "table.0").is_file():
            raise InfinigramIndexError(f"infini-gram's indexer failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        meta = {
            "tokenizer": tokenizer_name,
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "vocab_size": vocab_size,
            "eos_token_id": int(eos),
            "token_dtype": dtype_name,
            "documents": n_docs,
            "tokens": n_tokens,
        }
        (partial / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return IndexInfo(path=out, **meta)


def check_index(path: str | Path) -> IndexInfo:
    """Validate an index folder before the C++ engine touches it (a corrupt one could crash it)."""
    path = Path(path)
    if not path.is_dir():
        raise InfinigramIndexError(f"infini-gram index {path} does not exist")
    for name in ("tokenized.0", "table.0", "offset.0"):
        if not (path / name).is_file():
            raise InfinigramIndexError(f"{path} is not an infini-gram index: {name} is missing")
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise InfinigramIndexError(
            f"{path} has no {META_FILE}, so its tokenizer is unknown; indexes built elsewhere (e.g. the public "
            "prebuilt ones) need one: write it with 'tokenizer', 'vocab_size', 'eos_token_id' and 'token_dtype'"
        )
    meta = json.loads(meta_file.read_text())
    width = {"u16": 2, "u32": 4}.get(meta.get("token_dtype"))
    if width is None:
        raise InfinigramIndexError(f"{meta_file}: token_dtype must be u16 or u32, got {meta.get('token_dtype')!r}")
    for shard in sorted(path.glob("tokenized.*")):
        suffix = shard.name.split(".", 1)[1]
        data_size = shard.stat().st_size
        table_size = (path / f"table.{suffix}").stat().st_size if (path / f"table.{suffix}").exists() else -1
        offsets = (path / f"offset.{suffix}").stat().st_size if (path / f"offset.{suffix}").exists() else -1
        n_tokens = data_size // width
        if data_size % width or n_tokens == 0 or table_size <= 0 or table_size % n_tokens or offsets % 8:
            raise InfinigramIndexError(
                f"{path} is corrupt: shard {suffix} has inconsistent sizes (data {data_size}, "
                f"table {table_size}, offsets {offsets} bytes)"
            )
        pointer_bytes = table_size // n_tokens
        if not 1 <= pointer_bytes <= 8 or 2 ** (8 * pointer_bytes) < data_size:
            raise InfinigramIndexError(
                f"{path} is corrupt: suffix array entries of {pointer_bytes} bytes for {data_size} bytes"
            )
    fields = {k: meta.get(k) for k in ("tokenizer", "tokenizer_fingerprint", "vocab_size", "eos_token_id")}
    return IndexInfo(
        path=path,
        token_dtype=meta["token_dtype"],
        documents=meta.get("documents", -1),
        tokens=meta.get("tokens", -1),
        **fields,
    )


class Index:
    """An infini-gram engine plus the tokenizer its index was built with."""

    def __init__(self, path: str | Path, tokenizer=None):
        self.info = check_index(path)
        if tokenizer is None:
            tokenizer = _load_tokenizer(self.info.tokenizer)
        fingerprint = tokenizer_fingerprint(tokenizer)
        if self.info.tokenizer_fingerprint and fingerprint != self.info.tokenizer_fingerprint:
            raise InfinigramIndexError(
                f"the index {path} was built with another tokenizer ({self.info.tokenizer}, vocabulary "
                f"{self.info.tokenizer_fingerprint}); the tokenizer given has vocabulary {fingerprint}"
            )
        self.tokenizer = tokenizer
        from infini_gram.engine import InfiniGramEngine

        # Small indexes go to RAM, where the engine's page prefetching (madvise calls at every
        # binary-search step, which pay off on disk) only costs time: about 4x per query here.
        in_ram = sum(f.stat().st_size for f in self.info.path.iterdir()) < RAM_INDEX_BYTES
        prefetch = {"ds_prefetch_depth": 0, "sa_prefetch_depth": 0, "od_prefetch_depth": 0} if in_ram else {}
        self.engine = InfiniGramEngine(
            index_dir=str(self.info.path),
            eos_token_id=self.info.eos_token_id,
            vocab_size=max(self.info.vocab_size, 1),
            token_dtype=self.info.token_dtype,
            load_to_ram=in_ram,
            **prefetch,
        )
        total = self.engine.count([])
        if "error" in total:
            raise InfinigramIndexError(f"the infini-gram engine cannot read {path}: {total['error']}")
        self.size = total["count"]

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def count(self, ids: Sequence[int]) -> int:
        """Occurrences of ``ids`` in the corpus (the corpus size for an empty sequence)."""
        result = self.engine.count(input_ids=list(ids))
        if "error" in result:
            raise InfinigramIndexError(f"infini-gram query failed: {result['error']}")
        return result["count"]

    def infgram_prob(self, prompt_ids: Sequence[int], cont_id: int) -> tuple[float, int]:
        """(P_inf(cont | prompt), suffix length used): back off to the longest suffix of the prompt
        that occurs in the corpus (paper, section 2); the empty suffix always matches.

        Counts only shrink as a suffix grows, so the whole prompt is tried first (one count when a
        caller passes just the previous suffix plus one token and the match goes on), and otherwise
        the length is found by binary search. Built on the engine's ``count``, which is 3-6x
        cheaper per call than its own ``infgram_prob`` and releases the GIL.
        """
        prompt_ids = list(prompt_ids)
        high = len(prompt_ids)
        low, low_count = 0, self.size  # invariant: the suffix of length `low` occurs `low_count` times
        top = self.count(prompt_ids[len(prompt_ids) - high :]) if high else self.size
        if top:
            low, low_count = high, top
        else:
            high -= 1
            while low < high:
                middle = (low + high + 1) // 2
                found = self.count(prompt_ids[len(prompt_ids) - middle :])
                if found:
                    low, low_count = middle, found
                else:
                    high = middle - 1
        continued = self.count([*prompt_ids[len(prompt_ids) - low :], cont_id])
        return continued / low_count, low


@cache
def _load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def reference_corpus() -> list[str]:
    """Python's reference documentation plus decodebench's bundled task texts."""
    import pydoc_data.topics

    from decodebench.paths import TASKS_DIR

    documents = [text for _, text in sorted(pydoc_data.topics.topics.items())]
    for data in sorted(TASKS_DIR.glob("*/*.jsonl")):
        for line in data.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                documents.append(" ".join(str(v) for v in record.values() if isinstance(v, str)))
    return documents


def default_index_path(tokenizer) -> Path:
    return home() / "indexes" / f"reference-{tokenizer_fingerprint(tokenizer)}"


def ensure_reference_index(tokenizer, tokenizer_name: str, log: Callable[[str], None] | None = None) -> Path:
    """The reference index for this tokenizer, built once (process-safe) under DECODEBENCH_HOME."""
    from filelock import FileLock

    path = default_index_path(tokenizer)
    if (path / META_FILE).is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.parent / f".{path.name}.lock"):
        if (path / META_FILE).is_file():
            return path
        for leftover in path.parent.glob(f".{path.name}.partial-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)  # a folder without its metadata file is a leftover
        build_index(reference_corpus(), path, tokenizer, tokenizer_name, log=log or (lambda msg: None))
    return path
