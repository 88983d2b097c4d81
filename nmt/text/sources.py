"""Reading parallel corpora: text files (plain or gzip) and Hugging Face `datasets`.

Everything streams: `iter_pairs` yields aligned chunks of at most `chunk` pairs, `iter_side` one
side's sentences; `read_corpus` collects them (small corpora: validation, tests). Text files follow
`nmt.textio.iter_lines`' rule; Hugging Face datasets are read from their Arrow table in batches, and
`datasets` is imported only where one is read. Every problem a user can cause is a one-line
`UserError` naming the file (and line) or the field.

`source_fingerprint` describes a corpus for cache keys without reading it: each file's path, size,
mtime, ctime and inode; for a hub dataset, its name, configuration and split.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Iterator

from nmt.config import CorpusConfig
from nmt.errors import UserError
from nmt.textio import count_lines, iter_lines

CHUNK = 100_000  # pairs per chunk: bounds the Python strings held at once


def _text_lines(path: str) -> Iterator[str]:
    """`iter_lines(path)` with data-file messages: missing files, unreadable files."""
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path}")
    try:
        yield from iter_lines(path)
    except OSError as e:  # permission denied, I/O error
        raise UserError(f"cannot read {path}: {e}") from None


def _mismatch(src_path: str, n_src: int, tgt_path: str, n_tgt: int) -> UserError:
    return UserError(f"source and target files have different line counts: "
                     f"{src_path} has {n_src}, {tgt_path} has {n_tgt}")


def iter_text_pairs(src_path: str, tgt_path: str, limit: int | None = None,
                    chunk: int | None = None) -> Iterator[tuple[list[str], list[str]]]:
    """Aligned chunks of two text files (the first `limit` pairs); UserError if their line counts differ
    (counted over the whole files, found when the shorter one ends)."""
    chunk = chunk or CHUNK
    src_it, tgt_it = _text_lines(src_path), _text_lines(tgt_path)
    n = 0
    while limit is None or n < limit:
        take = chunk if limit is None else min(chunk, limit - n)
        src = list(itertools.islice(src_it, take))
        tgt = list(itertools.islice(tgt_it, len(src) or 1))
        if len(src) != len(tgt):  # one file ended first: count the rest of the other
            n_src = n + len(src) + sum(1 for _ in src_it)
            n_tgt = n + len(tgt) + sum(1 for _ in tgt_it)
            raise _mismatch(src_path, n_src, tgt_path, n_tgt)
        if not src:
            return
        n += len(src)
        yield src, tgt
    n_src, n_tgt = count_lines(src_path), count_lines(tgt_path)  # stopped at `limit`: the files must still agree
    if n_src != n_tgt:
        raise _mismatch(src_path, n_src, tgt_path, n_tgt)


def _check_text(corpus: CorpusConfig) -> None:
    if not corpus.src or not corpus.tgt:
        raise UserError("a text corpus needs both 'src' and 'tgt' files")


def iter_pairs(corpus: CorpusConfig, src_lang: str, tgt_lang: str,
               chunk: int | None = None) -> Iterator[tuple[list[str], list[str]]]:
    """(source lines, target lines) chunks of at most `chunk` (default CHUNK) aligned pairs, stripped."""
    if corpus.kind == "hf":
        yield from _iter_hf(corpus, src_lang, tgt_lang, chunk or CHUNK)
        return
    _check_text(corpus)
    yield from iter_text_pairs(corpus.src, corpus.tgt, corpus.max_sentences, chunk)


def iter_side(corpus: CorpusConfig, side: str, src_lang: str, tgt_lang: str) -> Iterator[str]:
    """The stripped sentences of one side ("src" or "tgt"), in order; alignment is not checked here."""
    if corpus.kind == "hf":
        col = 0 if side == "src" else 1
        for chunk in _iter_hf(corpus, src_lang, tgt_lang, CHUNK):  # (src, tgt) lists
            yield from chunk[col]
        return
    _check_text(corpus)
    lines = _text_lines(corpus.src if side == "src" else corpus.tgt)
    yield from lines if corpus.max_sentences is None else itertools.islice(lines, corpus.max_sentences)


def read_corpus(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """(source lines, target lines) of a text or Hugging Face corpus, aligned and stripped, in memory."""
    src: list[str] = []
    tgt: list[str] = []
    for s, t in iter_pairs(corpus, src_lang, tgt_lang):
        src += s
        tgt += t
    return src, tgt


# --------------------------------------------------------------------------- Hugging Face

def _describe(corpus: CorpusConfig) -> str:
    name = f", name={corpus.hf_name}" if corpus.hf_name else ""
    return f"Hugging Face dataset '{corpus.hf_path}'{name}, split '{corpus.hf_split}'"


def _load_dataset(corpus: CorpusConfig) -> Any:
    """The `datasets.Dataset` a corpus config points to (one split)."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"{_describe(corpus)}: reading it needs the `datasets` package (pip install datasets)") from None
    path = corpus.hf_path
    progress = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # no bars on stderr; restored below
    try:
        if os.path.isdir(path):
            try:
                ds = datasets.load_from_disk(path)
            except Exception as e:  # not a save_to_disk directory, corrupt files
                raise UserError(f"{path}: not a dataset written by save_to_disk ({_one_line(e)})") from None
            if isinstance(ds, datasets.DatasetDict):
                if corpus.hf_split not in ds:
                    raise UserError(f"{path}: no split '{corpus.hf_split}' (splits: {', '.join(ds)})")
                ds = ds[corpus.hf_split]
            return ds
        if path in ("json", "csv", "parquet"):
            files = corpus.hf_data_files or []
            for p in files:
                if not os.path.exists(p):
                    raise UserError(f"data file not found: {p}")
            try:
                return datasets.load_dataset(path, data_files={corpus.hf_split: files}, split=corpus.hf_split)
            except Exception as e:  # malformed json/csv/parquet
                raise UserError(f"cannot read {path} files {', '.join(files)}: {_one_line(e)}") from None
        try:
            return datasets.load_dataset(path, corpus.hf_name, split=corpus.hf_split)
        except Exception as e:  # offline, unknown dataset/config/split
            raise UserError(
                f"cannot load {_describe(corpus)}: {_one_line(e)} - if this machine is offline, "
                "download it elsewhere and use save_to_disk (then hf_path: that directory), "
                "or point hf_path at local json/csv/parquet files") from None
    finally:
        if progress:
            datasets.enable_progress_bars()


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


def _check_field(flat: Any, field: str, corpus: CorpusConfig) -> None:
    """UserError unless `field` (a dotted name after flatten) is a text column."""
    if field not in flat.column_names:
        raise UserError(f"{_describe(corpus)} has no field '{field}' (fields: {', '.join(flat.column_names)})")
    feature = flat.features[field]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise UserError(f"{_describe(corpus)}: field '{field}' is not a text column ({feature})")


def _iter_hf(corpus: CorpusConfig, src_lang: str, tgt_lang: str,
             chunk: int) -> Iterator[tuple[list[str], list[str]]]:
    """(source, target) chunks of a Hugging Face dataset, read from its Arrow table `chunk` rows at a time
    (zero-copy views). Fields are column names or dotted paths (`translation.de`, the default
    `translation.<lang>`); nulls read as empty strings."""
    ds = _load_dataset(corpus)
    if corpus.max_sentences is not None and corpus.max_sentences < len(ds):
        ds = ds.select(range(corpus.max_sentences))
    src_field = corpus.src_field or f"translation.{src_lang}"
    tgt_field = corpus.tgt_field or f"translation.{tgt_lang}"
    flat = ds.flatten()
    _check_field(flat, src_field, corpus)
    _check_field(flat, tgt_field, corpus)
    columns = flat.select_columns(list(dict.fromkeys([src_field, tgt_field]))).with_format("arrow")
    for table in columns.iter(batch_size=chunk):  # a pyarrow.Table of <= chunk rows
        yield tuple(["" if v is None else v.strip() for v in table.column(f).to_pylist()]  # type: ignore[misc]
                    for f in (src_field, tgt_field))


# --------------------------------------------------------------------------- cache keys

def _stat(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [os.path.abspath(path), None, None, None, None]
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def file_fingerprint(path: str) -> list:
    """[absolute path, size, mtime in ns, ctime in ns, inode] (None when the file is missing)."""
    return _stat(path)


def source_fingerprint(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> list:
    """A JSON-able description of a corpus that changes when its data changes: each file's absolute path,
    size, mtime, ctime and inode (not content), every file of a save_to_disk directory; a hub dataset by
    its name, configuration and split. Weights and tags are not part of it."""
    fp: list = [corpus.kind, src_lang, tgt_lang, corpus.max_sentences]
    if corpus.kind == "text":
        return fp + [_stat(corpus.src or ""), _stat(corpus.tgt or "")]
    fp += [corpus.hf_path, corpus.hf_name, corpus.hf_split, corpus.src_field, corpus.tgt_field]
    files = list(corpus.hf_data_files or [])
    if os.path.isdir(corpus.hf_path or ""):
        for root, _, names in sorted(os.walk(corpus.hf_path)):
            files += [os.path.join(root, n) for n in sorted(names)]
    return fp + [_stat(p) for p in files]
