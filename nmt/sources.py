"""Reading parallel corpora: text files (plain or gzip) and Hugging Face `datasets`.

`read_corpus` returns two aligned lists of stripped sentences. Every problem a
user can cause is a one-line `UserError` naming the file (and line) or the
field. `datasets` is imported only inside `read_hf` (start-up time; some
machines do not have it).

`source_fingerprint` describes a corpus for cache keys without reading it:
paths with size and modification time (ns) of every file involved; for a hub
dataset, its name, configuration and split.
"""

from __future__ import annotations

import gzip
import os
from typing import Any

from nmt.config import CorpusConfig
from nmt.errors import UserError

_GZIP_MAGIC = b"\x1f\x8b"


def _open_binary(path: str):
    if not os.path.isfile(path):
        raise UserError(f"data file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == _GZIP_MAGIC else open(path, "rb")


def read_lines(path: str, limit: int | None = None) -> tuple[list[str], int]:
    """(the first `limit` lines of `path`, stripped; the total number of lines in the file).

    Splits on b"\\n" only (a stray \\r inside a line cannot shift alignment),
    strips surrounding whitespace and a UTF-8 byte-order mark, and checks
    UTF-8 strictly. Lines past `limit` are counted but not decoded.
    """
    lines: list[str] = []
    n = 0
    try:
        with _open_binary(path) as f:
            for n, raw in enumerate(f, 1):
                if limit is not None and n > limit:
                    continue
                try:
                    lines.append(raw.decode("utf-8").strip())
                except UnicodeDecodeError as e:
                    raise UserError(f"{path}: line {n}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
    except (OSError, EOFError) as e:  # corrupt gzip, unreadable file
        raise UserError(f"cannot read {path}: {e}") from None
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:].strip()
    return lines, n


def read_text_pair(src_path: str, tgt_path: str, max_sentences: int | None = None) -> tuple[list[str], list[str]]:
    """Aligned lines of two text files; UserError if their line counts differ."""
    src, n_src = read_lines(src_path, max_sentences)
    tgt, n_tgt = read_lines(tgt_path, max_sentences)
    if n_src != n_tgt:
        raise UserError(f"source and target files have different line counts: "
                        f"{src_path} has {n_src}, {tgt_path} has {n_tgt}")
    return src, tgt


def read_corpus(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """(source lines, target lines) of a text or Hugging Face corpus, aligned and stripped."""
    if corpus.kind == "hf":
        return read_hf(corpus, src_lang, tgt_lang)
    if not corpus.src or not corpus.tgt:
        raise UserError("a text corpus needs both 'src' and 'tgt' files")
    return read_text_pair(corpus.src, corpus.tgt, corpus.max_sentences)


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


def _text_column(flat: Any, field: str, corpus: CorpusConfig) -> list[str]:
    """Column `field` (dotted names after flatten) of a flat dataset, as stripped strings."""
    if field not in flat.column_names:
        raise UserError(f"{_describe(corpus)} has no field '{field}' (fields: {', '.join(flat.column_names)})")
    feature = flat.features[field]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise UserError(f"{_describe(corpus)}: field '{field}' is not a text column ({feature})")
    values = flat.with_format("arrow")[field].to_pylist()
    return ["" if v is None else v.strip() for v in values]


def read_hf(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """(source, target) lines of a Hugging Face dataset.

    Fields are column names or dotted paths into nested columns
    (`translation.de`); the default is `translation.<lang>`. Null values read
    as empty strings (dropped later by filtering).
    """
    ds = _load_dataset(corpus)
    if corpus.max_sentences is not None and corpus.max_sentences < len(ds):
        ds = ds.select(range(corpus.max_sentences))
    src_field = corpus.src_field or f"translation.{src_lang}"
    tgt_field = corpus.tgt_field or f"translation.{tgt_lang}"
    flat = ds.flatten()
    return _text_column(flat, src_field, corpus), _text_column(flat, tgt_field, corpus)


# --------------------------------------------------------------------------- cache keys

def _stat(path: str) -> list:
    try:
        st = os.stat(path)
    except OSError:
        return [os.path.abspath(path), None, None]
    return [os.path.abspath(path), st.st_size, st.st_mtime_ns]


def source_fingerprint(corpus: CorpusConfig, src_lang: str, tgt_lang: str) -> list:
    """A JSON-able description of a corpus that changes when its data changes.

    Files are identified by absolute path, size and mtime (not content); a
    save_to_disk directory by those of every file in it; a hub dataset only by
    its name, configuration and split (the hub's own cache handles versions).
    """
    fp: list = [corpus.kind, src_lang, tgt_lang, corpus.max_sentences]
    if corpus.kind == "text":
        return fp + [_stat(corpus.src or ""), _stat(corpus.tgt or "")]
    fp += [corpus.hf_path, corpus.hf_name, corpus.hf_split, corpus.src_field, corpus.tgt_field]
    files = list(corpus.hf_data_files or [])
    if os.path.isdir(corpus.hf_path or ""):
        for root, _, names in sorted(os.walk(corpus.hf_path)):
            files += [os.path.join(root, n) for n in sorted(names)]
    return fp + [_stat(p) for p in files]
