"""The page `nmt export --format web` writes as index.html (nmt/interop/web_export.py fills in SETTINGS): type or
paste text, one sentence per line, and translate it in the browser with transformers.js and onnxruntime-web
(greedy search, as transformers.js searches; one line at a time, as its batched search does not stop a line
at its end). Everything it loads is in the export's directory: the model
(model/), the JavaScript and WebAssembly (vendor/); nothing from the network. While the model loads, a bar
shows the bytes read; a browser without WebAssembly, or the page opened as a file, gets a message instead."""

SETTINGS = "__NMT_SETTINGS__"  # replaced by a JSON object: title, dtype, max_new_tokens, languages, ...

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nmt: translate in the browser</title>
<link rel="icon" href="data:,">
<style>
  body { font: 16px/1.45 system-ui, sans-serif; max-width: 56rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  h1 { font-size: 1.4rem; margin: 0 0 .2rem; }
  #model { color: #666; margin: 0 0 1rem; font-size: .9rem; }
  textarea, pre { box-sizing: border-box; width: 100%; min-height: 9rem; padding: .6rem; font: inherit;
                  border: 1px solid #bbb; border-radius: 4px; white-space: pre-wrap; margin: 0; }
  pre { background: #f6f6f6; }
  .bar { display: flex; gap: 1rem; align-items: center; margin: .7rem 0; flex-wrap: wrap; }
  button { font: inherit; padding: .35rem 1.2rem; cursor: pointer; }
  progress { width: 14rem; }
  #status, #time { color: #555; }
  #error { color: #b00020; margin: .5rem 0; }
</style>
</head>
<body>
<h1>nmt: translate in the browser</h1>
<p id="model"></p>
<div id="error" role="alert"></div>
<div class="bar"><progress id="progress" max="1" value="0"></progress><span id="status" aria-live="polite">starting...</span></div>
<label for="source">Source text, one sentence per line</label>
<textarea id="source" autofocus placeholder="Type or paste text here"></textarea>
<div class="bar">
  <button id="translate" type="button" disabled>Translate</button>
  <label id="language-label" hidden>into <select id="language"></select></label>
  <span id="time" aria-live="polite"></span>
</div>
<label for="output">Translation</label>
<pre id="output" tabindex="0"></pre>
<script type="application/json" id="settings">__NMT_SETTINGS__</script>
<script>
"use strict";
// Before any module loads: say why the page cannot work, rather than fail silently.
(function () {
  const fail = (text) => { document.getElementById("error").textContent = text;
                           document.getElementById("status").textContent = "stopped"; window.nmtStopped = true; };
  const wasm = typeof WebAssembly === "object" && typeof WebAssembly.instantiate === "function" &&
    WebAssembly.validate(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0]));
  if (!wasm) {
    fail("This browser cannot run WebAssembly, which the translator needs: use a current Chrome, Edge, " +
         "Firefox or Safari, with WebAssembly (and JavaScript) enabled.");
  } else if (location.protocol === "file:") {
    fail("Open this page through a web server, not as a file: python3 -m http.server -d THIS_DIRECTORY, " +
         "then http://localhost:8000/");
  }
})();
</script>
<script type="module">
const $ = (id) => document.getElementById(id);
const settings = JSON.parse($("settings").textContent);
$("model").textContent = settings.title;
const status = (text) => { $("status").textContent = text; };
const languages = Object.keys(settings.languages);
if (languages.length > 1) {
  for (const code of languages) $("language").add(new Option(code, code, false, code === settings.tgt_lang));
  $("language-label").hidden = false;
}

async function load() {
  let transformers;
  try {
    transformers = await import("./vendor/transformers.min.js");
  } catch (e) {
    throw new Error("cannot load vendor/transformers.min.js: " + e.message);
  }
  const { pipeline, env } = transformers;
  const base = new URL(".", location.href).href;
  env.allowRemoteModels = false;  // nothing from the network: the model is in model/
  env.allowLocalModels = true;
  env.localModelPath = new URL(".", location.href).pathname;  // (a path: transformers.js takes a URL for remote)
  env.useBrowserCache = false;  // a model exported again into this directory is read again
  env.backends.onnx.wasm.wasmPaths = { mjs: base + "vendor/ort-wasm-simd-threaded.asyncify.mjs",
                                       wasm: base + "vendor/ort-wasm-simd-threaded.asyncify.wasm" };
  env.backends.onnx.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  const files = {};
  const progress = (p) => {
    if (p.status === "progress" && p.total) {
      files[p.file] = [p.loaded, p.total];
      const loaded = Object.values(files).reduce((s, f) => s + f[0], 0);
      const total = Object.values(files).reduce((s, f) => s + f[1], 0);
      $("progress").value = loaded / total;
      status(`loading the model: ${(loaded / 2 ** 20).toFixed(1)} of ${(total / 2 ** 20).toFixed(1)} MiB`);
    } else if (p.status === "done" && Object.keys(files).length) {
      status("starting the runtime...");
    }
  };
  status("loading the model...");
  return await pipeline("translation", "model", { dtype: settings.dtype, device: "wasm", progress_callback: progress });
}

async function translate(translator) {
  const lines = $("source").value.split("\\n");
  const todo = lines.map((line, i) => [line.trim(), i]).filter(([line]) => line);
  const tgt = languages.length ? ($("language").value || settings.tgt_lang) : null;
  const options = { num_beams: 1, do_sample: false, max_new_tokens: settings.max_new_tokens };
  if (settings.language_kwargs && tgt) Object.assign(options, { src_lang: settings.src_lang, tgt_lang: tgt });
  else if (tgt) options.forced_bos_token_id = settings.languages[tgt];
  const out = lines.map(() => "");
  const t0 = performance.now();
  for (const [k, [line, i]] of todo.entries()) {  // one line at a time: in a batch, transformers.js's greedy
    status(`translating: line ${k + 1} of ${todo.length}`);  // search goes on after a line's end
    out[i] = (await translator(line, options))[0].translation_text;
  }
  status("ready");
  $("output").textContent = out.join("\\n");
  $("time").textContent = `${todo.length} line${todo.length === 1 ? "" : "s"} in ${Math.round(performance.now() - t0)} ms`;
}

if (!window.nmtStopped) {
  load().then((translator) => {
    $("progress").value = 1;
    status("ready");
    $("translate").disabled = false;
    $("translate").addEventListener("click", async () => {
      $("translate").disabled = true;
      $("error").textContent = "";
      try { await translate(translator); } catch (e) { $("error").textContent = "translation failed: " + e.message; }
      $("translate").disabled = false;
    });
  }).catch((e) => { $("error").textContent = "cannot start the translator: " + e.message; status("stopped"); });
}
</script>
</body>
</html>
"""
