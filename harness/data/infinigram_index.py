"""infini-gram indexes: build them with a model's tokenizer, open them safely, and query them.

The ``infini-gram`` package (Liu et al.) answers n-gram and infinity-gram queries from a suffix
array with a C++ engine; its indexer only knows a few hub tokenizers, so ``build_index`` writes
the token shard itself (``tokenized.0``: every document as ``0xFF..FF`` then its token ids,
little-endian; ``offset.0``: the byte offset of each document) and then runs the package's own
suffix-array builder (``python -m infini_gram.indexing``), which skips its tokenization step when
those files exist. Next to the index goes ``decodebench-index.json``: the tokenizer, vocabulary,
token width and corpus size, so that an index is never queried with another tokenizer.

The default *reference index* is built on first use under ``$DECODEBENCH_HOME/indexes/`` from a
corpus that needs no download and holds no evaluation text: Python's own reference documentation
(``pydoc_data.topics``, PSF license, ~465 KB of English, shipped with every CPython). Nothing of
the bundled benchmark samples (documents, questions, answers) is in it, so agreement is never
agreement with the gold answers (tests/test_infinigram.py checks that no gold answer of a bundled
sample appears in it as an 8-gram). It proves the pipeline; real agreement studies point
``DECODEBENCH_INFINIGRAM_INDEX`` at a large index, for example one of the public prebuilt ones.

``check_index`` refuses a damaged index before the C++ engine reads it (a damaged one can crash
the process): files whose names the engine would pick up but that are not the index's shards,
shards whose sizes disagree with each other or with the sizes recorded at build time, offsets
that do not point at document separators, a suffix array with an entry outside the data or between
tokens, or whose sampled entries repeat or are out of the order of their suffixes (checked whatever the
metadata records: prebuilt indexes and indexes of 1 GiB or more have no checksums checked), and,
for indexes under 1 GiB, files whose sha256 is not the one recorded at build time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from decodebench.data.corpus import REFERENCE_CORPUS, reference_corpus
from decodebench.data.paths import home, sha256_file
from decodebench.data.vocabulary import tokenizer_fingerprint

META_FILE = "decodebench-index.json"
# The indexer splits a shard into parts with a 100000-byte overlap; smaller shards fail.
MIN_SHARD_BYTES = 100_000 + 64
RAM_INDEX_BYTES = 2 * 2**30
VERIFY_CHECKSUMS_BELOW = 2**30  # hash the files of indexes smaller than this on every open
# The engine finds an index's files by these words in their names (infini-gram's engine.py).
ENGINE_FILES = ("tokenized", "table", "offset", "metadata", "metaoff", "unigram")
_SHARD_FILE = re.compile(rf"^({'|'.join(ENGINE_FILES)})\.(\d+)$")


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
    corpus: str | None = None  # what text it holds, when its builder said
    checksum: str | None = None  # sha256 over the files' own sha256, recorded at build time
    checksum_verified: bool = False

    def describe(self) -> dict:
        """What a result records of the index that produced its agreement."""
        return {
            "path": str(self.path),
            "tokens": self.tokens,
            "documents": self.documents,
            "tokenizer": self.tokenizer,
            "corpus": self.corpus,
            "checksum": self.checksum,
            "checksum_verified": self.checksum_verified,
        }


def _dtype_for(vocab_size: int) -> tuple[str, type]:
    # all-ones is the document separator, so the largest id must stay below it
    return ("u16", np.uint16) if vocab_size < 2**16 - 1 else ("u32", np.uint32)


def build_index(
    documents: Iterable[str | list[int]],
    out: Path,
    tokenizer,
    tokenizer_name: str,
    mem_gib: int = 2,
    log: Callable[[str], None] = print,
    corpus: str | None = None,
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
        files = {f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in sorted(partial.iterdir())}
        meta = {
            "tokenizer": tokenizer_name,
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "vocab_size": vocab_size,
            "eos_token_id": int(eos),
            "token_dtype": dtype_name,
            "documents": n_docs,
            "tokens": n_tokens,
            "corpus": corpus,
            "files": files,
        }
        (partial / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        os.rename(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return check_index(out)


def check_index(path: str | Path) -> IndexInfo:
    """Validate an index folder before the C++ engine touches it (a damaged one can crash it)."""
    path = Path(path)
    if not path.is_dir():
        raise InfinigramIndexError(f"infini-gram index {path} does not exist")
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise InfinigramIndexError(
            f"{path} has no {META_FILE}, so its tokenizer is unknown; indexes built elsewhere (e.g. the public "
            "prebuilt ones) need one: write it with 'tokenizer', 'vocab_size', 'eos_token_id' and 'token_dtype'"
        )
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InfinigramIndexError(f"{meta_file} is not readable JSON: {exc}") from exc
    width = {"u16": 2, "u32": 4}.get(meta.get("token_dtype"))
    if width is None:
        raise InfinigramIndexError(f"{meta_file}: token_dtype must be u16 or u32, got {meta.get('token_dtype')!r}")
    shards = _shards(path, meta)
    recorded = meta.get("files")
    for suffix in shards:
        _check_shard(path, suffix, width, recorded)
    checksum, verified = None, False
    if recorded:
        checksum = hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()
        if sum(f["bytes"] for f in recorded.values()) < VERIFY_CHECKSUMS_BELOW:
            for name, expected in recorded.items():
                if sha256_file(path / name) != expected["sha256"]:
                    raise InfinigramIndexError(
                        f"{path} is damaged: {name} is not the file written when the index was built (sha256 "
                        "differs); rebuild it with `decodebench build-index`"
                    )
            verified = True
    for suffix in shards:  # after the checksums, which name the damaged file when they were recorded
        _check_suffix_array(path, suffix, width)
    fields = {k: meta.get(k) for k in ("tokenizer", "tokenizer_fingerprint", "vocab_size", "eos_token_id", "corpus")}
    return IndexInfo(
        path=path,
        token_dtype=meta["token_dtype"],
        documents=meta.get("documents", -1),
        tokens=meta.get("tokens", -1),
        checksum=checksum,
        checksum_verified=verified,
        **fields,
    )


def _shards(path: Path, meta: dict) -> list[str]:
    """The shard numbers of an index; files the engine would read but that are not its own are refused."""
    recorded = meta.get("files")
    shards = set()
    for file in path.iterdir():
        if file.name == META_FILE or not any(word in file.name for word in ENGINE_FILES):
            continue
        match = _SHARD_FILE.match(file.name)
        if match is None or (recorded is not None and file.name not in recorded):
            raise InfinigramIndexError(
                f"{path} holds {file.name}, which is not one of the index's files; infini-gram's engine reads every "
                f"file whose name contains {', '.join(ENGINE_FILES)}, so remove it or move the index to a clean folder"
            )
        shards.add(match.group(2))
    if recorded is not None:
        missing = sorted(set(recorded) - {f.name for f in path.iterdir()})
        if missing:
            raise InfinigramIndexError(f"{path} is damaged: {', '.join(missing)} missing")
    if not shards:
        raise InfinigramIndexError(f"{path} is not an infini-gram index: no tokenized.0, table.0, offset.0")
    return sorted(shards, key=int)


def _check_shard(path: Path, suffix: str, width: int, recorded: dict | None) -> None:
    names = {kind: path / f"{kind}.{suffix}" for kind in ("tokenized", "table", "offset")}
    for file in names.values():
        if not file.is_file():
            raise InfinigramIndexError(f"{path} is not an infini-gram index: {file.name} is missing")
        if recorded is not None and file.stat().st_size != recorded[file.name]["bytes"]:
            raise InfinigramIndexError(
                f"{path} is damaged: {file.name} has {file.stat().st_size} bytes, {recorded[file.name]['bytes']} "
                "when the index was built (truncated or replaced); rebuild it with `decodebench build-index`"
            )
    data_size, table_size = names["tokenized"].stat().st_size, names["table"].stat().st_size
    offsets_size = names["offset"].stat().st_size
    n_tokens = data_size // width
    # infini-gram's indexer: suffix-array entries of ceil(log2(data bytes) / 8) bytes, one per token
    pointer_bytes = math.ceil(math.log2(data_size) / 8) if data_size > 1 else 1
    if data_size % width or n_tokens == 0 or table_size != n_tokens * pointer_bytes or offsets_size % 8:
        raise InfinigramIndexError(
            f"{path} is damaged: shard {suffix} has inconsistent sizes (data {data_size}, suffix array "
            f"{table_size}, offsets {offsets_size} bytes; a suffix array of {n_tokens} tokens x {pointer_bytes} "
            "bytes was expected)"
        )
    offsets = np.fromfile(names["offset"], dtype=np.uint64)
    if (
        len(offsets) == 0
        or offsets[0] != 0
        or np.any(np.diff(offsets.astype(np.int64)) <= 0)
        or offsets[-1] >= data_size
    ):
        raise InfinigramIndexError(
            f"{path} is damaged: the document offsets of shard {suffix} are not increasing within the data"
        )
    data = np.memmap(names["tokenized"], dtype=np.uint8, mode="r")
    sample = offsets if len(offsets) <= 100_000 else offsets[np.linspace(0, len(offsets) - 1, 100_000).astype(int)]
    starts = data[(sample[:, None].astype(np.int64) + np.arange(width)).ravel()]
    if not np.all(starts == 0xFF):
        raise InfinigramIndexError(f"{path} is damaged: document offsets of shard {suffix} do not point at separators")


SUFFIX_ARRAY_SAMPLE = 4096  # adjacent pairs of suffix-array entries whose order is checked per shard
COMPARED_BYTES = 64  # how much of two suffixes the order check compares
POINTER_CHUNK = 1 << 22  # suffix-array entries decoded at a time by the bounds check (32 MiB of pointers)


def _pointers(entries: np.ndarray) -> np.ndarray:
    """Little-endian suffix-array entries (rows of bytes) as integers."""
    width = entries.shape[1]
    if width in (1, 2, 4, 8):  # a plain integer type: read as it is
        return np.ascontiguousarray(entries).view(f"<u{width}").ravel()
    padded = np.zeros((len(entries), 8), dtype=np.uint8)  # 3, 5, 6 or 7 bytes: widened to 8 with zeros
    padded[:, :width] = entries
    return padded.view("<u8").ravel()


def _check_suffix_array(path: Path, suffix: str, width: int) -> None:
    """Every suffix-array entry must point at a token start inside the data (the engine follows them without
    checking: one entry outside the data crashes it, wherever it is), and a sample must be distinct and in the order
    of the suffixes they point at (a table of random bytes, zeros or 0xFF; an index without recorded checksums is
    otherwise taken as it is). The bounds check reads the whole table, in chunks."""
    table = path / f"table.{suffix}"
    data = np.memmap(path / f"tokenized.{suffix}", dtype=np.uint8, mode="r")
    pointer_bytes = math.ceil(math.log2(len(data)) / 8) if len(data) > 1 else 1
    entries = np.memmap(table, dtype=np.uint8, mode="r").reshape(-1, pointer_bytes)
    count = len(entries)
    problem, checked = None, count
    for start in range(0, count, POINTER_CHUNK):
        pointers = _pointers(entries[start : start + POINTER_CHUNK])
        bad = np.flatnonzero((pointers >= len(data)) | (pointers % width != 0))
        if len(bad):
            problem = f"points outside the data or between tokens (entry {start + int(bad[0])})"
            break
    if problem is None:
        rows = np.unique(np.concatenate([[0], np.linspace(0, count - 2, SUFFIX_ARRAY_SAMPLE).astype(np.int64)]))
        rows = rows[rows + 1 < count] if count > 1 else rows
        pairs = np.concatenate([rows, rows + 1]) if count > 1 else rows
        pointers, checked = _pointers(entries[pairs]), len(pairs)
        if count > 1 and len(np.unique(pointers)) < len(pointers):
            problem = "repeats pointers"
        else:
            first, second = pointers[: len(rows)], pointers[len(rows) :]
            for a, b in zip(first.tolist(), second.tolist(), strict=True):
                if bytes(data[a : a + COMPARED_BYTES]) > bytes(data[b : b + COMPARED_BYTES]):
                    problem = "is not in the order of its suffixes"
                    break
    if problem:
        raise InfinigramIndexError(
            f"{path} is damaged: the suffix array of shard {suffix} ({table.name}) {problem} (checked on "
            f"{checked} entries); rebuild the index with `decodebench build-index`"
        )


class Index:
    """An infini-gram engine plus the tokenizer its index was built with."""

    def __init__(self, path: str | Path, tokenizer=None):
        self.info = check_index(path)
        if tokenizer is None:
            tokenizer = load_tokenizer(self.info.tokenizer)
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
def load_tokenizer(name: str):
    """The tokenizer an index was built with: a hub id, a path, or ``embedded`` (the embedded model's)."""
    from transformers import AutoTokenizer

    if name == "embedded":
        from decodebench.data.embedded import ensure_embedded_model

        name = str(ensure_embedded_model())
    return AutoTokenizer.from_pretrained(name)


def default_index_path(tokenizer) -> Path:
    # "v2": the reference no longer holds the bundled task texts, so older reference indexes are not reused
    return home() / "indexes" / f"reference-v2-{tokenizer_fingerprint(tokenizer)}"


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
        build_index(
            reference_corpus(), path, tokenizer, tokenizer_name, log=log or (lambda msg: None), corpus=REFERENCE_CORPUS
        )
    return path
