"""Text in and out, one rule for every command (train, translate, evaluate, score).

Reading (`iter_lines`, `read_lines`, `count_lines`, `counted_lines`, `read_json`): gzip is detected by
its magic number; "-" (or None) is standard input; pipes are read once, as streams (`rereadable`).
Lines are split on "\\n" only (a stray "\\r" or U+2028 cannot shift parallel files), decoded as
strict UTF-8 (a byte-order mark dropped) and stripped of surrounding whitespace. Every problem is a
one-line `UserError` naming the file (and the line for invalid UTF-8).

Writing (`open_output`, `write_lines`, `write_file`, through `atomic_file`): a temporary name in
the target's directory, renamed into place once complete, so a failure never leaves a half-written
file; standard output, devices and pipes are written directly. `atomic_dir` does the same for a
directory, `link_file` adds a second name to a finished file. They are nmt's only
temporary-name-and-rename writers (tests/test_textio.py checks).

`check_paths` runs before any work: inputs exist, no output is an input (also through symlinks or
standard streams) or another output, and a directory a command replaces holds no input.
`one_line` makes a hypothesis safe to print as one line; `lone_surrogate` says why a str is not text.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import zlib
from typing import IO, Any, Iterator, Sequence

from nmt.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
STDIN = "-"
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: dropped from the start of a file

# Every character str.splitlines() splits on, and NUL: never inside an output line.
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029\x00"
_NO_BREAKS = str.maketrans({c: " " for c in _LINE_BREAKS})
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_stdin(path: str | None) -> bool:
    return path is None or path == STDIN


def display_name(path: str | None) -> str:
    return "<stdin>" if is_stdin(path) else path


# --------------------------------------------------------------------------- reading

@contextlib.contextmanager
def open_bytes(path: str | None, stdin: IO[bytes] | None = None) -> Iterator[IO[bytes]]:
    """A binary stream of the file's text: decompressed when it starts with gzip's magic bytes."""
    if is_stdin(path):
        with _decompressed(stdin if stdin is not None else sys.stdin.buffer) as f:
            yield f
        return
    _check_readable(path)
    with open(path, "rb") as raw, _decompressed(raw) as f:
        yield f


@contextlib.contextmanager
def _decompressed(stream: IO[bytes]) -> Iterator[IO[bytes]]:
    head, stream = _peek(stream, GZIP_MAGIC)
    if head == GZIP_MAGIC:
        with gzip.GzipFile(fileobj=stream, mode="rb") as f:
            yield f
    else:
        yield stream


def _peek(stream: IO[bytes], magic: bytes) -> tuple[bytes, IO[bytes]]:
    """(the first len(magic) bytes of `stream`, fewer at its end or once they differ from `magic`, so an
    interactive short first line is not waited on; a stream that still starts with them: a pipe's bytes
    are peeked, or read and put back in front)."""
    n = len(magic)
    if hasattr(stream, "peek"):
        head = stream.peek(n)[:n]
        if len(head) == n or (head and not magic.startswith(head)):
            return head, stream
    if stream.seekable():
        start = stream.tell()
        head = stream.read(n)
        stream.seek(start)
        return head, stream
    head = b""
    while len(head) < n and magic.startswith(head) and (more := stream.read(n - len(head))):  # (may be fewer)
        head += more
    return head, io.BufferedReader(_Prepended(head, stream))


class _Prepended(io.RawIOBase):
    """`head`, then the rest of `stream` (which `head` was read from)."""

    def __init__(self, head: bytes, stream: IO[bytes]):
        self._head, self._stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        return self._stream.readinto(buffer)


def _check_readable(path: str) -> None:
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory, not a text file")
    if not os.path.exists(path):
        raise UserError(f"file not found: {path}")


def iter_lines(path: str | None, stdin: IO[bytes] | None = None, *, strip: str | None = None) -> Iterator[str]:
    """The file's lines, read by the module's rule (split on "\\n", UTF-8, stripped). strip: the
    characters stripped from both ends (default None: all whitespace; a TSV reader keeps tabs)."""
    name = display_name(path)
    number = 0
    try:
        with open_bytes(path, stdin) as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise UserError(f"{name}: line {number}: invalid UTF-8 ({e.reason} at byte {e.start})") from None
                if number == 1 and line.startswith("\ufeff"):
                    if line == "\ufeff":  # a byte-order mark alone (no newline): an empty file
                        return
                    line = line[1:]
                yield line.strip(strip)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{name}: corrupt or truncated gzip data after line {number} ({_reason(e)})") from None
    except OSError as e:
        if e.errno is None:  # gzip reports bad headers as a bare OSError
            raise UserError(f"{name}: not a valid gzip file ({_reason(e)})") from None
        raise


def _reason(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def read_lines(path: str | None, stdin: IO[bytes] | None = None) -> list[str]:
    """All lines of a file or standard input."""
    return list(iter_lines(path, stdin))


def read_json(path: str) -> Any:
    """The JSON value in the file `path`; a one-line UserError `cannot read PATH: REASON` when it is not
    UTF-8 JSON (an OSError passes as it is)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError(f"cannot read {path}: {str(e).splitlines()[0]}") from None


def rereadable(path: str | None) -> bool:
    """Whether the input can be read twice (e.g. counted, then read): a regular file; not standard input,
    a pipe (`<(...)`, a FIFO) or a device, which give their text once."""
    if is_stdin(path):
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def counted_lines(path: str) -> tuple[int, Iterator[str]]:
    """(number of lines, the lines): a regular file is counted, then read as the lines are taken; any
    other input (a pipe) is read into memory, once."""
    if rereadable(path):
        return count_lines(path), iter_lines(path)
    lines = read_lines(path)
    return len(lines), iter(lines)


def iter_chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """Lists of at most `size` consecutive lines."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def count_lines(path: str) -> int:
    """Number of lines `iter_lines` yields (a last line without "\\n" counts). It reads the file: a pipe
    has nothing left to read after it (`counted_lines`)."""
    n, last, head = 0, b"\n", b""
    try:
        with open_bytes(path) as f:
            while block := f.read(1 << 20):
                n += block.count(b"\n")
                last, head = block[-1:], (head + block)[:4] if len(head) < 4 else head
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{path}: corrupt or truncated gzip data ({_reason(e)})") from None
    return n + (last != b"\n" and head != BOM)  # (a byte-order mark alone: no line, as `iter_lines`)


# --------------------------------------------------------------------------- writing

def one_line(text: str) -> str:
    """`text` with every line-breaking character (anything str.splitlines splits on) and NUL
    replaced by a space: a hypothesis always stays one output line."""
    return text.translate(_NO_BREAKS)


def cr_as_space(lines: list[str]) -> list[str]:
    """`lines` with each "\\r" inside a line (lines are split on "\\n" only, so one may hold a stray "\\r") as the
    space the tokenizers read it as: how the commands pass file lines to `nmt.Translator`, which takes no
    line break in a line."""
    return [line.replace("\r", " ") if "\r" in line else line for line in lines]


def lone_surrogate(text: str) -> str | None:
    """Why `text` is not Unicode text, `a lone surrogate U+D800 at character N` (JSON's `\\ud800` escape
    makes one; no UTF-8 input has one), or None."""
    bad = _SURROGATE.search(text)
    return None if bad is None else f"a lone surrogate U+{ord(bad.group()):04X} at character {bad.start()}"


@contextlib.contextmanager
def open_output(path: str | None, stdout: IO[bytes] | None = None) -> Iterator[IO[bytes]]:
    """A binary stream for the output `path` (standard output when None or "-"); a file is written
    by `atomic_file`."""
    if is_stdin(path):
        yield stdout if stdout is not None else sys.stdout.buffer
        return
    with atomic_file(path) as f:
        yield f


@contextlib.contextmanager
def atomic_file(path: str, *, fsync: bool = False, prefix: str | None = None,
                suffix: str = ".tmp") -> Iterator[IO[bytes]]:
    """The one way nmt writes a file: a binary stream that becomes `path` only when the block ends
    without an error.

    A regular (or new) file is written under a temporary name in its directory (`prefix` + random +
    `suffix`), with the file's mode (new: 0o666 & ~umask), and renamed over `path` (`os.replace`: a crash
    leaves the old file or the new one); on an error the temporary file is removed. fsync: data and
    directory entry are flushed (checkpoints). Devices, named pipes and paths under /dev or /proc (or
    links into them) are written directly; a symbolic link is followed (its target is replaced, the link
    stays). A directory is a UserError; OSErrors name `path`."""
    if os.path.exists(path) and (not os.path.isfile(path) or _special(path)):
        if os.path.isdir(path):
            raise UserError(f"output {path} is a directory")
        with open(path, "wb") as f:  # a device or a named pipe: nothing to replace atomically
            yield f
        return
    given, path = path, _written_path(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=prefix if prefix is not None else f".{os.path.basename(path)}.",
                                   suffix=suffix, dir=directory)
    except OSError as e:  # name what the user gave, not the temporary file
        raise OSError(e.errno, e.strerror, given) from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o666 & ~umask()
        os.chmod(tmp, mode)
        try:
            os.replace(tmp, path)
        except OSError as e:  # e.g. `-o missing/`: name what the user gave, not the temporary file
            raise OSError(e.errno, e.strerror, given) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(directory)


def _written_path(path: str) -> str:
    """The file a write to `path` replaces: a symbolic link's target (followed as a shell's `>` does; a dangling
    link's target is created), so the link stays and what it points to changes."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _special(path: str) -> bool:
    """Whether `path` is under /dev or /proc, or a link into them (written directly, never replaced)."""
    places = ("/dev/", "/proc/")
    return os.path.abspath(path).startswith(places) or (os.path.islink(path) and os.readlink(path).startswith(places))


def write_file(path: str, data: bytes) -> None:
    """Write `data` to `path` through `atomic_file` (a file written whole, never half)."""
    with atomic_file(path) as f:
        f.write(data)


def link_file(src: str, dst: str, *, temp: str) -> None:
    """Make `dst` hold the content of the finished file `src`, atomically: a hard link (no copy;
    a later rename over `src` does not touch `dst`), else a copy, made under the temporary name
    `temp` (in `dst`'s directory; an old one is removed first) and renamed over `dst`; the
    directory entry is flushed to disk."""
    directory = os.path.dirname(os.path.abspath(dst))
    tmp = os.path.join(directory, temp)
    if os.path.exists(tmp):
        os.unlink(tmp)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:  # (a copy cut short by a full disk: no partial file is left)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(directory)


@contextlib.contextmanager
def atomic_dir(path: str, *, what: str = "dir") -> Iterator[str]:
    """The one way nmt writes a directory (`nmt export`): a temporary directory next to `path`, filled in
    the block and renamed to `path` only when it ends without an error. An existing `path` is swapped out
    and removed after (put back if the swap is cut); a link is replaced, not followed. Mode 0o777 & ~umask.
    Whether `path` may be replaced is the caller's check."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{what}-", dir=parent)
    old = None
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~umask())
        if os.path.lexists(path):
            old = tempfile.mkdtemp(prefix=f".tmp-old-{what}-", dir=parent)
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not os.path.lexists(path):
            os.replace(old, path)
        raise
    if old is not None:
        if os.path.islink(old):
            os.unlink(old)
        else:
            shutil.rmtree(old, ignore_errors=True)


def fsync_dir(directory: str) -> None:
    """Flush a directory's entries (a rename) to disk, where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def umask() -> int:
    """The process's umask: a new file's mode is 0o666 & ~umask() (mkstemp makes 0o600 files; the
    atomic writers chmod their temporary file to this before renaming it). Read from /proc where it
    can be: os.umask(0) sets it to 0 for a moment, for every thread."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_lines(path: str | None, lines: Sequence[str], stdout: IO[bytes] | None = None) -> None:
    """One line per item (made safe by `one_line`), through `open_output`."""
    with open_output(path, stdout) as f:
        f.write("".join(one_line(line) + "\n" for line in lines).encode("utf-8"))
        f.flush()


# --------------------------------------------------------------------------- checks

def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of a regular file (through symlinks), else None: devices such as /dev/null
    and pipes are never "the same file" as an input (nothing is overwritten by writing them)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _fd_identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of an open descriptor when it is a regular file, else None."""
    try:
        st = os.fstat(fd)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _std_fd(stream: object, default: int) -> int | None:
    if stream is None:
        return default
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None


def check_paths(inputs: dict[str, str | None], outputs: dict[str, str | None], *,
                stdin: IO[bytes] | None = None, stdout: IO[bytes] | None = None,
                input_dirs: Sequence[str] = (), output_dirs: Sequence[str] = (), new_files: Sequence[str] = ()) -> None:
    """Fail before any work (one-line UserError) when an input is missing or an output would overwrite an
    input. inputs / outputs: {option name: path}; None or "-" is standard input / output.

    Inputs in `input_dirs` may be directories (a CTranslate2 export). Outputs must not be directories,
    must have an existing parent, and must not be the same file as an input (by device and inode:
    symlinks, hard links and the files behind the standard streams are caught; devices and pipes are
    written, never replaced) or as another output. Outputs in `output_dirs` are directories the command
    replaces (an export): they must neither be nor contain an input. Outputs in `new_files` must not exist."""
    from_stdin = [option for option, path in inputs.items() if is_stdin(path)]
    if len(from_stdin) > 1:
        raise UserError(f"{' and '.join(from_stdin)} cannot both read standard input: give at least one of them a file")
    named: list[tuple[str, tuple[int, int]]] = []
    places: list[tuple[str, str]] = []  # (what, real path) of every input on disk
    for option, path in inputs.items():
        if is_stdin(path):
            ident = _fd_identity(_std_fd(stdin, 0)) if _std_fd(stdin, 0) is not None else None
            if ident is not None:
                named.append((f"{option} (standard input)", ident))
            continue
        if option not in input_dirs:
            if os.path.isdir(path):  # (a file is read: nothing else names the option)
                raise UserError(f"{option} {path} is a directory, not a file")
            _check_readable(path)
        elif not os.path.exists(path):
            raise UserError(f"{option} not found: {path}")
        named.append((f"{option} {path}", _identity(path)))  # type: ignore[arg-type]
        places.append((f"{option} {path}", os.path.realpath(path)))
    written: list[tuple[str, str, tuple[int, int] | None]] = []  # (what, real path, identity) of earlier outputs
    for option, path in outputs.items():
        if is_stdin(path):
            fd = _std_fd(stdout, 1)
            ident = _fd_identity(fd) if fd is not None else None
            where = "standard output"
        elif option in output_dirs:
            _check_output_dir(option, path, places)
            continue
        else:
            _check_output_file(option, path, new=option in new_files)
            ident = _identity(path)
            where = path
            real = os.path.realpath(path)
            for what, other_real, other_ident in written:
                if (ident is not None and ident == other_ident) or (real == other_real and not os.path.exists(path)):
                    raise UserError(f"{option} {where} is the same file as the output {what}: give two files")
            written.append((f"{option} {path}", real, ident))
        if ident is None:
            continue
        for what, other in named:
            if other == ident:
                raise UserError(f"{option} {where} is the same file as the input {what}: refusing to overwrite it")


def _check_output_file(option: str, path: str, *, new: bool) -> None:
    """An output file: not a directory, in an existing directory; with `new`, not there yet."""
    if os.path.isdir(path):
        raise UserError(f"{option} {path} is a directory")
    if path.endswith(("/", os.sep)):
        raise UserError(f"{option} {path} names a directory (it ends with '/'), which does not exist: "
                        "give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path}: directory {parent} does not exist")
    if new and os.path.lexists(path):
        raise UserError(f"{option} {path} already exists: refusing to overwrite it (remove it, or choose "
                        "another name)")
    if not os.path.exists(path) or (os.path.isfile(path) and not _special(path)):
        _check_writable(option, path)


def _check_writable(option: str, path: str) -> None:
    """UserError unless a file can be created in the directory `atomic_file` writes `path` from (its temporary
    file), before any work: a denied or read-only directory fails now, not after a long run."""
    directory = os.path.dirname(os.path.abspath(_written_path(path)))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".nmt-check-", dir=directory)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write into {directory} ({e.strerror})") from None
    os.close(fd)
    os.unlink(tmp)


def _check_output_dir(option: str, path: str, places: list[tuple[str, str]]) -> None:
    """An output directory (replaced as a whole; it may not exist yet) must be in an existing directory and
    must not be, or contain, an input."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"{option} {path}: directory {parent} does not exist")
    real = os.path.realpath(path)
    for what, other in places:
        if other == real or other.startswith(real.rstrip(os.sep) + os.sep):
            raise UserError(f"{option} {path} contains the input {what}: refusing to replace that directory "
                            "(write the output elsewhere)")
