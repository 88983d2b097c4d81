"""nmt/textio.py: text read by one rule from files, gzip files and streams, whatever their kind."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from nmt import textio
from nmt.errors import UserError

from helpers import ROOT, make_pairs, make_tiny_checkpoint, one_line_error, run_nmt, tiny_config_dict, write, write_yaml

LINES = ["uno", "dos dos", "", "tres \u00e9"]
TEXT = "".join(line + "\n" for line in LINES).encode("utf-8")


def _pipe(data: bytes, first: int = 0) -> str:
    """A path like bash's <(...) gives: /dev/fd/N of a pipe that a thread writes `data` into (the first
    `first` bytes on their own, a moment before the rest)."""
    r, w = os.pipe()

    def write():
        with os.fdopen(w, "wb") as f:
            if first:
                f.write(data[:first])
                f.flush()
                time.sleep(0.2)
            f.write(data[first:])

    threading.Thread(target=write, daemon=True).start()
    return f"/dev/fd/{r}"


@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("compressed", [False, True])
def test_a_pipe_is_read_as_a_stream(compressed, first):
    """`nmt translate -i <(cat f)` said "not a valid gzip file (... not seekable)": the gzip test read two bytes
    and seeked back, which a pipe cannot. Plain text and gzip through a pipe now read like the file, also when
    the pipe delivers gzip's first byte on its own."""
    data = gzip.compress(TEXT) if compressed else TEXT
    path = _pipe(data, first)
    try:
        assert textio.read_lines(path) == LINES
    finally:
        os.close(int(path.rsplit("/", 1)[1]))
    r, w = os.pipe()  # standard input that is a pipe
    threading.Thread(target=lambda: (os.write(w, data), os.close(w)), daemon=True).start()
    with os.fdopen(r, "rb", buffering=0) as stdin:  # unbuffered: no peek()
        assert textio.read_lines("-", stdin=stdin) == LINES


def test_a_corrupt_gzip_stream_is_still_a_one_line_error():
    path = _pipe(gzip.compress(TEXT)[:-6])
    with pytest.raises(UserError, match="corrupt or truncated gzip data"):
        textio.read_lines(path)


# --------------------------------------------------------------------------- the commands, with bash's <(...)

@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("textio")
    pairs = make_pairs(30, 4)
    paths = {"ckpt": make_tiny_checkpoint(str(d / "tiny.pt"))}
    for name, lines in (("es", [p[0] for p in pairs]), ("en", [p[1] for p in pairs]),
                        ("prefix", ["the"] * 10 + [""] * 20)):
        paths[name] = str(d / name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        with gzip.open(paths[name] + ".gz", "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    paths["short"] = str(d / "short")
    with open(paths["short"], "w", encoding="utf-8") as f:
        f.write("one\n")
    return paths


def _bash(command: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for its <(...) process substitution")
def test_commands_read_process_substitutions(files):
    """`nmt translate -i <(cat f)` failed ("not a valid gzip file"), and so did `nmt score --src <(...)`; they
    counted an input (progress bar, line-count check) and then read it again, which a pipe cannot give twice.
    Now a pipe gives the same output as the file it carries, gzip or not."""
    nmt = f"{sys.executable} -m nmt"
    c = files["ckpt"]
    want = _bash(f"{nmt} translate -c {c} -i {files['es']} --prefix {files['prefix']}")
    assert want.returncode == 0, want.stderr
    for src, prefix in ((f"<(cat {files['es']}.gz)", f"<(cat {files['prefix']})"),
                        (f"<(cat {files['es']})", f"<(gzip -c {files['prefix']})")):
        got = _bash(f"{nmt} translate -c {c} -i {src} --prefix {prefix}")
        assert got.returncode == 0 and got.stdout == want.stdout, got.stderr
    want = _bash(f"{nmt} score -c {c} --src {files['es']} --tgt {files['en']}")
    assert want.returncode == 0 and len(want.stdout.splitlines()) == 30, want.stderr
    got = _bash(f"{nmt} score -c {c} --src <(cat {files['es']}.gz) --tgt <(cat {files['en']})")
    assert got.returncode == 0 and got.stdout == want.stdout, got.stderr
    # the line counts are still checked before any output
    for command in (f"score -c {c} --src <(cat {files['es']}) --tgt <(cat {files['short']})",
                    f"translate -c {c} -i {files['es']} --prefix <(cat {files['short']})"):
        bad = _bash(f"{nmt} {command}")
        assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, bad.stderr
        assert "line counts differ: 30 lines" in bad.stderr and "but 1 " in bad.stderr, bad.stderr


def _fifo_reader(path: str) -> tuple[threading.Thread, list[bytes]]:
    """A named pipe at `path` and a thread that reads everything written into it (its open waits for a
    writer; if the pipe is replaced instead, it never returns: a daemon thread)."""
    os.mkfifo(path)
    got: list[bytes] = []

    def read():
        with open(path, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t, got


@pytest.mark.slow
@pytest.mark.parametrize("command", ["average", "tune"])
def test_a_device_or_pipe_output_is_written_never_replaced(tmp_path, command):
    """`nmt average ck.pt -o /dev/null` (and tune -o) renamed a temporary file over the device: run as root,
    /dev/null became a regular file. Every writer goes through textio.atomic_file, which writes a device or
    named pipe directly; here a named pipe stands in for /dev/null (no root needed)."""
    import stat

    ckpt = str(tmp_path / "ck.pt")
    make_tiny_checkpoint(ckpt)
    out = str(tmp_path / "out.pipe")
    reader, got = _fifo_reader(out)
    src = tmp_path / "dev.txt"
    src.write_text("hola\nadios\n")
    args = {"average": ["average", ckpt, "-o", out],
            "tune": ["tune", "-c", ckpt, "--src", str(src), "--ref", str(src), "-o", out, "--max-time", "5",
                     "--max-loops", "1", "-q"]}[command]
    proc = subprocess.run([sys.executable, "-m", "nmt", *args], cwd=str(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    reader.join(timeout=30)
    assert stat.S_ISFIFO(os.stat(out).st_mode), "the named pipe was replaced by a file"
    assert got and got[0][:4] == b"PK\x03\x04"  # the checkpoint went through the pipe (torch.save's zip)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# --------------------------------------------------------------------------- one atomic writer

RENAMERS = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move"), ("tempfile", "mkstemp"),
            ("tempfile", "mkdtemp"), ("tempfile", "mktemp"), ("tempfile", "NamedTemporaryFile")}


def hand_rolled_writes(root: str = ROOT) -> list[str]:
    """`file:line module.function` of every call in nmt/ outside textio.py that makes a temporary file or
    directory or renames one (what only textio's atomic writers may do), also through `from os import replace`."""
    import ast

    found = []
    for directory, _, names in os.walk(os.path.join(root, "nmt")):
        for name in sorted(names):
            path = os.path.join(directory, name)
            if not name.endswith(".py") or os.path.relpath(path, root) == os.path.join("nmt", "textio.py"):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            aliases = {a.asname or a.name: (node.module, a.name) for node in ast.walk(tree)
                       if isinstance(node, ast.ImportFrom) for a in node.names}
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                    called = (f.value.id, f.attr)
                elif isinstance(f, ast.Name):
                    called = aliases.get(f.id)
                else:
                    continue
                if called in RENAMERS:
                    found.append(f"{os.path.relpath(path, root)}:{node.lineno} {'.'.join(called)}")
    return found


def test_every_writer_goes_through_textio():
    """Issue 35: atomic writes were hand-rolled in seven modules (`path + ".tmp"` then os.replace in the two
    tokenizers' save, the token cache's .bin.tmp files, link_checkpoint's temporary link...). Now
    textio's atomic_file / write_file / link_file / atomic_dir are the only writers that use a temporary
    name and rename it."""
    assert hand_rolled_writes() == []


def test_the_writer_check_finds_a_hand_rolled_write(tmp_path):
    """The check above can fail: a module that renames a temporary file itself is found."""
    pkg = tmp_path / "nmt"
    pkg.mkdir()
    (pkg / "textio.py").write_text("import os\nos.replace('a', 'b')\n")  # textio itself may
    (pkg / "saver.py").write_text("import os\nfrom os import rename as mv\nimport tempfile\n\n"
                                  "def save(p):\n    tempfile.mkstemp()\n    os.replace(p + '.tmp', p)\n    mv(p, p)\n")
    assert hand_rolled_writes(str(tmp_path)) == ["nmt/saver.py:6 tempfile.mkstemp", "nmt/saver.py:7 os.replace",
                                                 "nmt/saver.py:8 os.rename"]


def test_write_file_and_link_file_are_atomic(tmp_path):
    """write_file: the whole content or the old file; link_file: dst is src's content under a new name,
    untouched when src is later replaced; neither leaves a temporary file."""
    path = str(tmp_path / "a.bin")
    textio.write_file(path, b"old")
    with pytest.raises(ZeroDivisionError), textio.atomic_file(path) as f:
        f.write(b"half")
        1 / 0
    assert open(path, "rb").read() == b"old"
    textio.write_file(path, b"new")
    dst = str(tmp_path / "b.bin")
    textio.link_file(path, dst, temp=".tmp-link-b")
    textio.write_file(path, b"newer")
    assert open(dst, "rb").read() == b"new" and open(path, "rb").read() == b"newer"
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


# --------------------------------------------------------------------------- a full disk and corrupt gzip: one line, nothing half-written

@pytest.mark.slow
def test_disk_full_is_one_line_and_leaves_no_partial_file(ckpt, tmp_path):
    lines = [p[0] for p in make_pairs(300, 2)]
    src = write(tmp_path / "src.es", lines)
    out = tmp_path / "out.en"
    proc = run_nmt("translate", "-c", ckpt, "-i", src, "-o", str(out), "--beam", "1", "-q", limit_bytes=300)
    one_line_error(proc, 1, "File too large")
    assert sorted(os.listdir(tmp_path)) == ["src.es"]  # neither out.en nor its temporary
    proc = run_nmt("evaluate", "-c", ckpt, "--src", src, "--ref", src, "--save-hyps", str(out), "-q",
               "--beam", "1", limit_bytes=300)
    one_line_error(proc, 1, "File too large")
    assert sorted(os.listdir(tmp_path)) == ["src.es"]
    proc = run_nmt("average", ckpt, ckpt, "-o", str(tmp_path / "avg.pt"), limit_bytes=20_000)
    one_line_error(proc, 1, "File too large")
    assert sorted(os.listdir(tmp_path)) == ["src.es"]
    raw = tiny_config_dict(str(tmp_path / "t"), max_steps=3, warmup_steps=1, valid_every=1000, valid_bleu=False, metric="loss")
    path = write_yaml(tmp_path / "c.yaml", raw)
    proc = run_nmt("train", "--config", path, "--quiet", limit_bytes=400_000)  # data fits, a checkpoint does not
    err = proc.stderr
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "nmt train: error: File too large", err
    assert os.listdir(os.path.join(raw["output_dir"], raw["name"], "checkpoints")) == []  # no half checkpoint


@pytest.mark.slow
def test_corrupt_gzip_input(ckpt, tmp_path):
    lines = [p[0] for p in make_pairs(2000, 3)]
    good = gzip.compress("".join(x + "\n" for x in lines).encode())
    (tmp_path / "trunc.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "fake.gz").write_bytes(b"\x1f\x8b" + b"not really gzip at all")
    (tmp_path / "gz_named_otherwise.txt").write_bytes(good)  # gzip by content, whatever the name
    ref = write(tmp_path / "ref.en", lines)
    for name, pattern in (("trunc.gz", "corrupt or truncated gzip"), ("fake.gz", "gzip")):
        one_line_error(run_nmt("translate", "-c", ckpt, "-i", str(tmp_path / name), "-o", str(tmp_path / "o"),
                           "--beam", "1", "-q"), 2, pattern)
        one_line_error(run_nmt("evaluate", "--hyp", str(tmp_path / name), "--ref", ref), 2, pattern)
        assert not os.path.exists(tmp_path / "o")
    proc = run_nmt("evaluate", "--hyp", str(tmp_path / "gz_named_otherwise.txt"), "--ref", ref, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["bleu"]["score"] == pytest.approx(100.0)


# --------------------------------------------------------------------------- /dev/null is not an input's twin

@pytest.mark.slow
def test_dev_null_is_not_the_same_file_as_an_input(ckpt, tmp_path):
    """`-i /dev/null -o /dev/null` was refused as the same file."""
    proc = run_nmt("translate", "-c", ckpt, "-i", "/dev/null", "-o", "/dev/null", "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    text = tmp_path / "in.txt"
    text.write_text("la casa\n")
    one_line_error(run_nmt("translate", "-c", ckpt, "-i", str(text), "-o", str(text)), 2,
                   "is the same file as the input")  # a regular file still is


# --------------------------------------------------------------------------- the writers' edge cases (a review's findings)

def test_a_link_into_proc_is_written_not_replaced(tmp_path):
    """`-o /dev/stdout` of a shell that sent standard output to a file: /dev/stdout is a link to
    /proc/self/fd/1, which os.path.isfile follows to the file, so the writer renamed a temporary file
    over the link (as root: the output went nowhere). A link into /proc (or /dev) is written through."""
    out = tmp_path / "out.txt"
    link = tmp_path / "stdout"
    code = ("import os, sys; from nmt import textio; os.symlink('/proc/self/fd/1', sys.argv[1]); "
            "f = textio.atomic_file(sys.argv[1]); s = f.__enter__(); s.write(b'hello\\n'); f.__exit__(None, None, None)")
    with open(out, "wb") as f:
        subprocess.run([sys.executable, "-c", code, str(link)], stdout=f, check=True, cwd=ROOT)
    assert out.read_bytes() == b"hello\n"
    assert os.path.islink(link)  # still the link, not a file put in its place
    assert sorted(os.listdir(tmp_path)) == ["out.txt", "stdout"]


def test_an_interactive_first_line_shorter_than_gzip_magic_is_not_waited_on():
    """A pipe whose first line is empty ("\\n", one byte that cannot start gzip's magic) is read at once,
    not after the next write."""
    r, w = os.pipe()
    os.write(w, b"\n")
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.extend(next(iter(textio.iter_lines(f"/dev/fd/{r}"))) for _ in [0]),
                              daemon=True)
    reader.start()
    reader.join(timeout=10)  # the next write never comes while the reader waits
    alive = reader.is_alive()
    os.write(w, b"more\n")
    os.close(w)
    reader.join(timeout=10)
    os.close(r)
    assert not alive and got == [""]


def test_link_file_leaves_no_partial_copy(tmp_path, monkeypatch):
    """A copy cut short (a full disk, where hard links are not possible) leaves neither the temporary file
    nor a changed dst."""
    src, dst = tmp_path / "a.bin", tmp_path / "b.bin"
    src.write_bytes(b"x" * 100)
    dst.write_bytes(b"old")

    def no_link(a, b):
        raise OSError(18, "Invalid cross-device link")

    def short_copy(a, b):
        with open(b, "wb") as f:
            f.write(b"xx")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(shutil, "copyfile", short_copy)
    with pytest.raises(OSError, match="No space"):
        textio.link_file(str(src), str(dst), temp=".tmp-link-b")
    assert dst.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_atomic_dir_puts_the_old_directory_back_and_replaces_a_link(tmp_path, monkeypatch):
    """A swap cut between its two renames puts the old directory back; a link to an old export is
    replaced by the new directory without touching the link's target or leaving the link behind; the
    new directory is readable by others as the umask allows (mkdtemp alone: 0o700)."""
    path = tmp_path / "exp"
    path.mkdir()
    (path / "old.txt").write_text("old")
    real_replace = os.replace

    def cut(a, b):
        if os.path.basename(str(a)).startswith(".tmp-dir-"):
            raise KeyboardInterrupt
        real_replace(a, b)
    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt), textio.atomic_dir(str(path)) as tmp:
        (tmp_path / tmp / "new.txt").write_text("new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert sorted(os.listdir(path)) == ["old.txt"] and sorted(os.listdir(tmp_path)) == ["exp"]
    link = tmp_path / "current"
    link.symlink_to(path)
    with textio.atomic_dir(str(link)) as tmp:
        (tmp_path / tmp / "new.txt").write_text("new")
    assert not link.is_symlink() and sorted(os.listdir(link)) == ["new.txt"]
    assert sorted(os.listdir(path)) == ["old.txt"] and sorted(os.listdir(tmp_path)) == ["current", "exp"]
    assert os.stat(link).st_mode & 0o777 == 0o777 & ~textio.umask()


def test_two_outputs_may_both_be_dev_null(tmp_path):
    inp = write(tmp_path / "in.txt", ["a"])
    textio.check_paths({"--input": inp}, {"--output": os.devnull, "--config": os.devnull})
    with pytest.raises(UserError, match="same file"):
        textio.check_paths({"--input": inp}, {"--output": str(tmp_path / "o"), "--config": str(tmp_path / "o")})


def test_a_byte_order_mark_alone_is_an_empty_file(tmp_path):
    """A file holding only UTF-8's byte-order mark counted 1 line (`translate` wrote one empty line for it, `score`
    and `evaluate` called it 1 line against an empty file's 0); the mark is dropped, so it is empty."""
    cases = {"bom": (b"\xef\xbb\xbf", []), "bom-newline": (b"\xef\xbb\xbf\n", [""]), "bom-text": (b"\xef\xbb\xbfab", ["ab"]),
             "bom.gz": (gzip.compress(b"\xef\xbb\xbf"), [])}
    for name, (data, lines) in cases.items():
        (tmp_path / name).write_bytes(data)
        path = str(tmp_path / name)
        assert (textio.read_lines(path), textio.count_lines(path)) == (lines, len(lines)), name


def test_an_output_through_a_symlink_changes_its_target(tmp_path):
    """A symbolic link is followed as a shell's `>` does: `tune --in-place` on a link to a checkpoint wrote a new
    file in the link's place and left the checkpoint as it was. A dangling link's target is created."""
    target, link = tmp_path / "real.txt", tmp_path / "link.txt"
    target.write_text("old\n")
    link.symlink_to("real.txt")
    textio.write_file(str(link), b"new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    (tmp_path / "dangling").symlink_to("made.txt")
    textio.write_file(str(tmp_path / "dangling"), b"x\n")
    assert (tmp_path / "made.txt").read_text() == "x\n" and sorted(os.listdir(tmp_path)) == [
        "dangling", "link.txt", "made.txt", "real.txt"]


def test_outputs_that_cannot_be_written_and_two_inputs_from_stdin_fail_before_any_work(tmp_path):
    """`tune -o /sys/t.pt` failed after its whole search, naming its temporary file; `score --src - --tgt -` said
    "line counts differ: 5 lines in - but 0 in -"."""
    inp = write(tmp_path / "in.txt", ["a"])
    with pytest.raises(UserError, match=r"^--output /proc/nmt-out\.txt: cannot write into /proc \("):
        textio.check_paths({"--input": inp}, {"--output": "/proc/nmt-out.txt"})
    with pytest.raises(OSError) as e, textio.atomic_file("/proc/nmt-out.txt"):
        pass
    assert e.value.filename == "/proc/nmt-out.txt"
    with pytest.raises(UserError, match="^--src and --tgt cannot both read standard input"):
        textio.check_paths({"--src": "-", "--tgt": None, "--checkpoint": inp}, {})
    textio.check_paths({"--src": "-", "--checkpoint": inp}, {"--output": str(tmp_path / "out.txt")})
    assert sorted(os.listdir(tmp_path)) == ["in.txt"]  # (the check's probe file is gone)
