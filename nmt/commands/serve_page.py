"""The page `nmt serve` shows at GET /: type or paste text (one sentence per line), translate, see each
translated line as it arrives (a streamed answer) and the time taken. Self-contained: no external scripts,
styles or fonts."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>nmt serve</title>
<style>
  body { font: 16px/1.45 system-ui, sans-serif; max-width: 56rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  h1 { font-size: 1.4rem; margin: 0 0 .2rem; }
  #model { color: #666; margin: 0 0 1rem; font-size: .9rem; }
  textarea, pre { box-sizing: border-box; width: 100%; min-height: 9rem; padding: .6rem; font: inherit;
                  border: 1px solid #bbb; border-radius: 4px; white-space: pre-wrap; margin: 0; }
  pre { background: #f6f6f6; }
  .bar { display: flex; gap: 1rem; align-items: center; margin: .7rem 0; flex-wrap: wrap; }
  button { font: inherit; padding: .35rem 1.2rem; cursor: pointer; }
  input { width: 4rem; font: inherit; }
  #time { color: #555; }
  #error { color: #b00020; margin: .5rem 0; }
</style>
</head>
<body>
<h1>nmt: translate</h1>
<p id="model">loading the model's details...</p>
<label for="source">Source text, one sentence per line</label>
<textarea id="source" autofocus placeholder="Type or paste text here"></textarea>
<div class="bar">
  <button id="translate" type="button">Translate</button>
  <label>beam <input id="beam" type="number" min="1" max="64" placeholder="model"></label>
  <span id="time" aria-live="polite"></span>
</div>
<div id="error" role="alert"></div>
<label for="output">Translation</label>
<pre id="output" tabindex="0"></pre>
<script>
"use strict";
const $ = (id) => document.getElementById(id);

fetch("/health").then((r) => r.json()).then((h) => {
  $("model").textContent = "model " + h.model + " (" + h.engine + "), batching " + (h.batching ? "on" : "off");
}).catch(() => { $("model").textContent = ""; });

async function translate() {
  const lines = $("source").value.replace(/\\r/g, "").split("\\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  const body = { text: lines, stream: true };
  if ($("beam").value) body.options = { beam_size: Number($("beam").value) };
  $("error").textContent = "";
  $("output").textContent = "";
  $("time").textContent = "translating...";
  $("translate").disabled = true;
  const start = performance.now();
  try {
    const response = await fetch("/translate", { method: "POST", headers: { "Content-Type": "application/json" },
                                                  body: JSON.stringify(body) });
    if (!response.ok) {
      const data = await response.json();
      throw new Error(data.error || response.statusText);
    }
    await showLines(response.body.pipeThrough(new TextDecoderStream()).getReader());
    const ms = Math.round(performance.now() - start);
    $("time").textContent = lines.length + (lines.length === 1 ? " line" : " lines") + " in " + ms + " ms";
  } catch (e) {
    $("time").textContent = "";
    $("error").textContent = String(e.message || e);
  } finally {
    $("translate").disabled = false;
  }
}

// A streamed answer: one JSON object a line, each translation shown as it arrives, then {"done": true, ...}
async function showLines(reader) {
  const shown = [];
  let rest = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the answer ended early");
    const parts = (rest + value).split("\\n");
    rest = parts.pop();
    for (const part of parts) {
      const item = JSON.parse(part);
      if (item.error) throw new Error(item.error);
      if (item.done) return;
      shown.push(item.text);
      $("output").textContent = shown.join("\\n");
    }
  }
}

$("translate").addEventListener("click", translate);
$("source").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) translate();
});
</script>
</body>
</html>
"""
