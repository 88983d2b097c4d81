"""nmt/interop/web_export.py and web_page.py: `nmt export --format web`, the page in headless Chromium.

The page is served as its guide says (a static HTTP server on the export directory) to a Chromium that can
resolve no host but 127.0.0.1, so whatever it loads comes from the directory. The references are nmt's greedy
search (the page's outputs), nmt's SentencePiece ids (tokenizer.json under transformers.js) and the
onnxruntime loop of tests/onnx_loop.py (the int8 page). The JavaScript packages come from npm (`npm pack` into
a cache directory, $NMT_NPM_CACHE or one per test session): without npm or a registry the browser tests skip
and say so.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import os
import shutil
import threading

import pytest

from helpers import make_tiny_checkpoint

REASON = 'the onnx extra is not installed: pip install -e ".[onnx]"'
for _module in ("onnx", "onnxruntime", "onnxscript", "transformers", "tokenizers"):
    pytest.importorskip(_module, reason=REASON)

from onnx_loop import ort_greedy  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
BIBLE = os.path.join(os.path.dirname(__file__), "..", "data", "bible-es-en")
LINES = ["el perro rojo ve la casa grande", "", "la luna come el sol y el gato lee el libro"]  # (the empty line stays)


@pytest.fixture(scope="module")
def npm_packages(tmp_path_factory):
    """require_npm_packages() into $NMT_NPM_CACHE (else a directory of this session), or skip saying why."""
    from nmt.errors import UserError
    from nmt.interop.web_export import require_npm_packages

    cache = os.environ.get("NMT_NPM_CACHE") or str(tmp_path_factory.mktemp("npm"))
    try:
        return require_npm_packages(cache, timeout=300)
    except UserError as e:
        pytest.skip(reason=f"the JavaScript packages cannot be had here: {e}")


def export_web(checkpoint: str, out: str, cache: str, *args: str) -> str:
    from nmt.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NMT_NPM_CACHE", cache)
        assert main(["export", "-c", checkpoint, "--format", "web", "-o", out, *args]) == 0
    return out


@pytest.fixture(scope="module")
def page(npm_packages, tmp_path_factory):
    """(checkpoint, web export directory) of an untrained tiny post-norm model (MarianMT graphs, fp32)."""
    d = tmp_path_factory.mktemp("web")
    ckpt = make_tiny_checkpoint(str(d / "tiny.pt"), norm="post")
    cache = os.path.dirname(next(iter(npm_packages.values())))
    return ckpt, export_web(ckpt, str(d / "web"), cache)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """serve(directory) -> the URL of `python3 -m http.server -d directory`'s equivalent, in a thread."""
    servers = []

    def start(directory: str) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=directory))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def browser(profile: str, *extra: str):
    """Headless Chromium (selenium) that resolves no host but 127.0.0.1, or pytest.skip with the reason."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip(reason="no headless browser: apt-get install chromium chromium-driver")
    from selenium.webdriver.chrome.service import Service as DriverService

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", f"--user-data-dir={profile}", *extra):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=DriverService(executable_path=driver))
    driver.set_script_timeout(300)
    return driver


STATUS_LOG = """new MutationObserver(() => { const s = document.getElementById("status");
  if (s) (window.nmtStatuses = window.nmtStatuses || []).push(s.textContent); })
  .observe(document, { subtree: true, childList: true, characterData: true });"""


def translate_in_page(driver, url: str, lines: list[str], timeout: float = 240) -> tuple[list[str], dict]:
    """Open the page, wait until the model is ready, translate `lines`; (output lines, what the page showed)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": STATUS_LOG})
    driver.get(url)
    text = lambda element: driver.find_element(By.ID, element).text
    WebDriverWait(driver, timeout).until(lambda d: text("status") in ("ready", "stopped"))
    assert text("status") == "ready", text("error")
    driver.find_element(By.ID, "source").send_keys("\n".join(lines))
    driver.find_element(By.ID, "translate").click()
    WebDriverWait(driver, timeout).until(lambda d: " ms" in text("time") or text("error"))
    shown = {k: text(k) for k in ("model", "time", "error")}
    shown["statuses"] = driver.execute_script("return window.nmtStatuses || []")
    return driver.find_element(By.ID, "output").get_attribute("textContent").split("\n"), shown


def nmt_greedy_texts(checkpoint: str, model_dir: str, lines: list[str], **options) -> list[str]:
    """nmt translate's greedy output with the length limit of the export's generation_config.json."""
    from nmt.api import Translator

    limit = json.load(open(os.path.join(model_dir, "generation_config.json")))["max_length"] - 1
    return [r.text for r in Translator(checkpoint, device="cpu", beam_size=1, max_len_a=0.0, max_len_b=limit,
                                       **options).translate(lines)]


@pytest.mark.slow
def test_the_page_translates_as_nmt_greedy_offline(page, serve, tmp_path):
    """Two lines (and an empty one between) typed into the page: nmt's greedy outputs, the empty line empty;
    a progress bar while loading; nothing from another host."""
    ckpt, out = page
    driver = browser(str(tmp_path / "profile"))
    try:
        got, shown = translate_in_page(driver, serve(out), LINES)
    finally:
        driver.quit()
    assert shown["error"] == ""
    assert got == nmt_greedy_texts(ckpt, os.path.join(out, "model"), LINES)
    assert got[1] == "" and got[0] and got[2]
    assert shown["time"].startswith("2 lines in ") and shown["model"].startswith("tiny.pt, step 0: MarianMTModel")
    assert any(s.startswith("loading the model: ") and s.endswith(" MiB") for s in shown["statuses"]), shown
    assert sorted(os.listdir(os.path.join(out, "vendor"))) == [
        "LICENSE", "NOTICE.md", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm",
        "transformers.min.js"]


@pytest.mark.slow
def test_without_webassembly_or_a_server_the_page_says_why(page, serve, tmp_path):
    from selenium.webdriver.common.by import By

    _, out = page
    driver = browser(str(tmp_path / "nowasm"))
    try:  # as a browser with WebAssembly turned off (Safari's Lockdown Mode, Edge's enhanced security)
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "delete globalThis.WebAssembly;"})
        driver.get(serve(out))
        assert "cannot run WebAssembly" in driver.find_element(By.ID, "error").text
        assert driver.find_element(By.ID, "status").text == "stopped"
    finally:
        driver.quit()
    driver = browser(str(tmp_path / "file"))
    try:
        driver.get("file://" + os.path.join(out, "index.html"))
        assert "python3 -m http.server" in driver.find_element(By.ID, "error").text
    finally:
        driver.quit()


@pytest.mark.slow
def test_tokenizer_json_under_transformers_js_gives_nmts_ids(page, serve, tmp_path):
    """transformers.js (the page's copy) on tokenizer.json of a unigram model trained on the Bible: nmt's ids on
    every line of test.es and test.en, and nmt's text back from them."""
    from nmt.config import TokenizerConfig
    from nmt.interop.onnx_tokenizer import dumps, tokenizer_config, tokenizer_json
    from nmt.text.tokenizer import Tokenizer, train_sentencepiece

    read = lambda split, lang, n=None: [line.rstrip("\n") for line in
                                        gzip.open(os.path.join(BIBLE, f"{split}.{lang}.gz"), "rt", encoding="utf-8")][:n]
    tok = Tokenizer(train_sentencepiece(read("train", "es", 3000) + read("train", "en", 3000),
                                        TokenizerConfig(vocab_size=2000, model_type="unigram", threads=1),
                                        seed=1, what="joint", log=lambda m: None))
    lines = read("test", "es") + read("test", "en")
    root = tmp_path / "site"
    shutil.copytree(os.path.join(page[1], "vendor"), root / "vendor")
    (root / "tok").mkdir()
    (root / "tok" / "tokenizer.json").write_bytes(tokenizer_json(tok)[0])
    (root / "tok" / "tokenizer_config.json").write_bytes(dumps(tokenizer_config(tok, 512)))
    ours = tok.encode_src(lines)
    (root / "data.json").write_text(json.dumps({"lines": lines, "ids": [[2, *x, 3] for x in ours]}))
    driver = browser(str(tmp_path / "profile"))
    try:
        driver.get(serve(str(root)) + "data.json")
        result = driver.execute_async_script("""const done = arguments[arguments.length - 1];
            import("/vendor/transformers.min.js").then(async (t) => {
              Object.assign(t.env, { allowRemoteModels: false, allowLocalModels: true, localModelPath: "/",
                                     useBrowserCache: false });
              const tok = await t.AutoTokenizer.from_pretrained("tok");
              const data = await (await fetch("/data.json")).json();
              done({ ids: data.lines.map((l) => tok.encode(l, { add_special_tokens: false })),
                     texts: data.ids.map((x) => tok.decode(x, { skip_special_tokens: true })) });
            }).catch((e) => done({ error: String(e) }));""")
    finally:
        driver.quit()
    assert "error" not in result, result
    assert len(lines) > 2900
    assert [i for i, (a, b) in enumerate(zip(ours, result["ids"])) if a != b] == []
    assert result["texts"] == tok.decode_tgt(ours)


@pytest.mark.slow
def test_the_int8_page_loads_the_quantized_graphs_alone(npm_packages, serve, tmp_path):
    """--quantization int8: model/onnx holds the `*_quantized.onnx` graphs only, and the page's outputs are
    onnxruntime's on them (tests/onnx_loop.py)."""
    ckpt = make_tiny_checkpoint(str(tmp_path / "tiny.pt"), norm="pre")
    out = export_web(ckpt, str(tmp_path / "web"), os.path.dirname(next(iter(npm_packages.values()))),
                     "--quantization", "int8")
    model = os.path.join(out, "model")
    assert sorted(os.listdir(os.path.join(model, "onnx"))) == ["decoder_model_merged_quantized.onnx",
                                                               "encoder_model_quantized.onnx"]
    driver = browser(str(tmp_path / "profile"))
    try:
        got, shown = translate_in_page(driver, serve(out), LINES)
    finally:
        driver.quit()
    assert shown["error"] == "" and "int8" in shown["model"]
    lines = [line for line in LINES if line]  # (one at a time, as the page: int8 activations are quantized per batch)
    assert [g for g in got if g] == [ort_greedy(model, [line], quantized=True)[2][0] for line in lines]


def test_without_npm_the_web_export_says_what_to_put_where(tmp_path, capsys, monkeypatch):
    """No npm and no tarball in the cache: one line naming the tarball, `npm pack` and the cache directory,
    before any work; a tarball that is not the registry's is refused."""
    from nmt.cli import main
    from nmt.interop import web_export

    monkeypatch.setenv("NMT_NPM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(web_export.shutil, "which", lambda name: None)
    ckpt = make_tiny_checkpoint(str(tmp_path / "t.pt"))
    assert main(["export", "-c", ckpt, "--format", "web", "-o", str(tmp_path / "web")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "npm is not installed" in err
    assert f"npm pack {web_export.TRANSFORMERS_JS.spec}" in err and str(tmp_path / "cache") in err
    assert not os.path.exists(tmp_path / "web")
    (tmp_path / "cache").mkdir()
    for package in web_export.NPM_PACKAGES:
        (tmp_path / "cache" / package.tarball).write_bytes(b"not the package")
    assert main(["export", "-c", ckpt, "--format", "web", "-o", str(tmp_path / "web")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "its sha512 differs" in err and web_export.TRANSFORMERS_JS.tarball in err


@pytest.mark.slow
def test_an_unreachable_registry_is_one_line(tmp_path, monkeypatch):
    """npm cannot reach its registry (nor has the package in its cache): the reason and what to do, one line."""
    from nmt.errors import UserError
    from nmt.interop.web_export import TRANSFORMERS_JS, require_npm_packages

    if shutil.which("npm") is None:
        pytest.skip(reason="npm is not installed")
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9")
    monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm"))
    with pytest.raises(UserError) as e:
        require_npm_packages(str(tmp_path / "cache"), timeout=120)
    message = str(e.value)
    assert "\n" not in message and "ECONNREFUSED" in message and f"put {TRANSFORMERS_JS.tarball}" in message


@pytest.mark.slow
def test_an_imported_nllb_page_translates_into_the_chosen_language(npm_packages, serve, tmp_path):
    """A tiny NLLB model (tests/hf_fixtures.py) imported and exported: the page passes the source and target
    languages as transformers.js's NLLB tokenizer wants them, and shows nmt's greedy output for the default
    target language and for another one chosen in the page."""
    import hf_fixtures as fx
    from selenium.webdriver.support.ui import Select

    from nmt.commands.import_model import ImportOptions, import_command

    d = str(tmp_path / "nllb")
    fx.m2m100_model(d, nllb=True)
    ckpt = str(tmp_path / "nllb.pt")
    assert import_command(ImportOptions(d, ckpt, quiet=True)) == 0
    out = export_web(ckpt, str(tmp_path / "web"), os.path.dirname(next(iter(npm_packages.values()))))
    lines = fx.corpus_lines("test", "es", 3)
    driver = browser(str(tmp_path / "profile"))
    try:
        got, shown = translate_in_page(driver, serve(out), lines)
        assert got == nmt_greedy_texts(ckpt, os.path.join(out, "model"), lines, tgt_lang="eng_Latn"), shown
        Select(driver.find_element("id", "language")).select_by_value("fra_Latn")
        driver.execute_script('document.getElementById("time").textContent = ""')
        driver.find_element("id", "translate").click()
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, 120).until(lambda d: " ms" in d.find_element("id", "time").text)
        french = driver.find_element("id", "output").get_attribute("textContent").split("\n")
    finally:
        driver.quit()
    assert french == nmt_greedy_texts(ckpt, os.path.join(out, "model"), lines, tgt_lang="fra_Latn") != got
