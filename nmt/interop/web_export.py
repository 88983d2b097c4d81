"""The web writer of `nmt export --format web` (nmt/commands/export.py): a static page that translates typed text
in the browser with transformers.js and onnxruntime-web, fully client-side (`write_web`):

    index.html        the page (nmt/interop/web_page.py), its settings filled in
    model/            the ONNX export (nmt/interop/onnx_export.py): fp32, or with quantization int8 the
                      `*_quantized.onnx` graphs alone (the smaller download)
    vendor/           transformers.min.js (@huggingface/transformers), ort-wasm-simd-threaded.asyncify.mjs and
                      .wasm (onnxruntime-web: the build transformers.min.js loads), NOTICE.md and LICENSE
    nmt_export.json

`python3 -m http.server -d DIR` serves it (the page needs http: modules and fetch do not work from file:);
nothing is fetched from another host, so it works offline and behind a firewall.

The JavaScript comes from the npm packages `NPM_PACKAGES` names, each pinned by version and by the sha512
integrity the npm registry publishes for it (the onnxruntime-web version is the one transformers.js
depends on, exactly). Their tarballs are read from a cache directory (`npm_cache`: $NMT_NPM_CACHE, else
~/.cache/nmt/npm); one not there yet is fetched with `npm pack` (npm's own cache first, then the
registry). Without npm or a registry, `require_npm_packages` says in one line which files to put there
(`npm pack NAME@VERSION` on a machine that has both). A tarball whose integrity differs is refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass

from nmt import textio
from nmt.errors import UserError
from nmt.interop.export_dir import METADATA_FILE, check_output_dir

FORMAT = "nmt-web"


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    integrity: str  # the registry's dist.integrity of the tarball
    license: str

    @property
    def tarball(self) -> str:
        """The file name `npm pack` gives the tarball."""
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


TRANSFORMERS_JS = NpmPackage("@huggingface/transformers", "4.3.2", "sha512-V3+dqf3iWlRYJ9I9GreM3zGQd0lAXnnoPeddmkOQYWA"
                             "EE4l/+Fi6p7tx/qVUJlKQgLXGim2W76rTOzz+eC0i7g==", "Apache-2.0")
ONNXRUNTIME_WEB = NpmPackage("onnxruntime-web", "1.31.0-dev.20260914-8d85527a0", "sha512-Iy7rtadoBgxS/LLvDr3QW38DB1PNX"
                             "Rnr0GJMcL0TAt7c9qjgVQl83UlGCVyeAnK2InpmW8Uc3PL8XIuqtDeF6g==", "MIT")
NPM_PACKAGES = (TRANSFORMERS_JS, ONNXRUNTIME_WEB)
VENDOR = {  # file in vendor/: (package, path in its tarball)
    "transformers.min.js": (TRANSFORMERS_JS, "package/dist/transformers.min.js"),
    "LICENSE": (TRANSFORMERS_JS, "package/LICENSE"),
    "ort-wasm-simd-threaded.asyncify.mjs": (ONNXRUNTIME_WEB, "package/dist/ort-wasm-simd-threaded.asyncify.mjs"),
    "ort-wasm-simd-threaded.asyncify.wasm": (ONNXRUNTIME_WEB, "package/dist/ort-wasm-simd-threaded.asyncify.wasm"),
}


def npm_cache() -> str:
    """Where the tarballs are kept: $NMT_NPM_CACHE, else ~/.cache/nmt/npm."""
    return os.environ.get("NMT_NPM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nmt", "npm")


def _integrity(path: str) -> str:
    h = hashlib.sha512()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha512-" + base64.b64encode(h.digest()).decode()


def require_npm_packages(cache: str | None = None, timeout: float = 600) -> dict[NpmPackage, str]:
    """{package: path of its checked tarball} for NPM_PACKAGES, fetched into `cache` (default `npm_cache()`)
    with `npm pack` where missing; one-line UserError when they cannot be had."""
    cache = cache or npm_cache()
    out = {}
    for package in NPM_PACKAGES:
        path = os.path.join(cache, package.tarball)
        if not os.path.isfile(path):
            _npm_pack(package, cache, timeout)
        if _integrity(path) != package.integrity:
            raise UserError(f"{path} is not {package.spec} as the npm registry publishes it (its sha512 "
                            "differs): remove it, and export again")
        out[package] = path
    return out


def _npm_pack(package: NpmPackage, cache: str, timeout: float) -> None:
    """`npm pack NAME@VERSION` into `cache`, or UserError saying how to put the tarball there by hand."""
    hint = (f"put {package.tarball} (`npm pack {package.spec}` on a machine with npm and the registry) into {cache}, "
            f"or set NMT_NPM_CACHE to a directory that has it")
    npm = shutil.which("npm")
    if npm is None:
        raise UserError(f"the web export needs the JavaScript of {package.spec} and npm is not installed: {hint}")
    os.makedirs(cache, exist_ok=True)
    try:
        proc = subprocess.run([npm, "pack", package.spec, "--prefer-offline", "--fetch-retries=1", "--loglevel=error",
                               "--pack-destination", cache], capture_output=True, text=True, timeout=timeout, cwd=cache)
    except subprocess.TimeoutExpired:
        raise UserError(f"npm pack {package.spec} did not finish in {timeout:.0f} s: {hint}") from None
    if proc.returncode != 0 or not os.path.isfile(os.path.join(cache, package.tarball)):
        errors = [line for line in proc.stderr.splitlines() if line.startswith("npm error") and "log of this" not in line]
        reason = next((line for line in errors if "reason:" in line), errors[0] if errors else "")
        reason = textio.one_line(reason.removeprefix("npm error").strip()) or f"exit status {proc.returncode}"
        raise UserError(f"npm pack {package.spec} failed ({reason}): {hint}")


def _vendor(packages: dict[NpmPackage, str], directory: str) -> None:
    """The files of VENDOR, taken out of the tarballs, and NOTICE.md."""
    os.makedirs(directory)
    by_package: dict[NpmPackage, dict[str, str]] = {}
    for name, (package, member) in VENDOR.items():
        by_package.setdefault(package, {})[member] = name
    for package, members in by_package.items():
        with tarfile.open(packages[package], "r:gz") as tar:
            for member, name in members.items():
                source = tar.extractfile(member)
                if source is None:
                    raise UserError(f"{packages[package]} has no {member}: not the package nmt expects")
                with source, open(os.path.join(directory, name), "wb") as f:
                    shutil.copyfileobj(source, f)
    notice = "# Third-party code in this directory\n\n" + "".join(
        f"- {p.spec} ({p.license} license): {', '.join(n for n, (q, _) in VENDOR.items() if q == p)}\n"
        for p in NPM_PACKAGES) + "\nLICENSE is @huggingface/transformers' licence text.\n"
    textio.write_file(os.path.join(directory, "NOTICE.md"), notice.encode())


def page_settings(directory: str, languages, checkpoint: str, step: int | None, quantization: str | None) -> dict:
    """What index.html needs to know of the model written to `directory` (its JSON files); `languages`: its
    nmt.text.languages.TargetLanguages."""
    read = lambda name: textio.read_json(os.path.join(directory, name))
    config, gen, tok = read("config.json"), read("generation_config.json"), read("tokenizer_config.json")
    title = (f"{os.path.basename(checkpoint) or 'model'}" + (f", step {step}" if step is not None else "") +
             f": {config['architectures'][0]}, {config['encoder_layers']}+{config['decoder_layers']} layers, "
             f"d_model {config['d_model']}, {quantization or 'float32'}")
    return {"title": title, "dtype": "q8" if quantization == "int8" else "fp32",
            "max_new_tokens": gen["max_length"] - 1, "languages": dict(languages.tokens), "tgt_lang": languages.default,
            "src_lang": tok.get("src_lang"), "language_kwargs": tok["tokenizer_class"] in ("M2M100Tokenizer",
                                                                                            "NllbTokenizer")}


def write_web(model, tokenizer, cfg, output_dir: str, *, packages: dict[NpmPackage, str] | None = None,
              quantization: str | None = None, force: bool = False, checkpoint: str = "",
              step: int | None = None) -> tuple[dict[str, str], list[str]]:
    """Write the page's directory for (model in eval mode, tokenizer, cfg) to `output_dir`, atomically (as
    `write_onnx`). `packages`: `require_npm_packages()`'s answer (asked here when None). Returns ({file
    name: path relative to output_dir} of the graphs and the runtime, notes)."""
    from nmt.interop.onnx_export import check_quantization, require_onnx, write_into
    from nmt.interop.web_page import PAGE, SETTINGS
    from nmt.text.languages import target_languages

    require_onnx()
    check_quantization(quantization)
    check_output_dir(output_dir, force)
    packages = packages if packages is not None else require_npm_packages()
    with textio.atomic_dir(output_dir, what="export") as tmp:
        model_dir = os.path.join(tmp, "model")
        os.makedirs(model_dir)
        graphs, notes = write_into(model_dir, model, tokenizer, cfg, quantization=quantization)
        if quantization == "int8":  # the page loads the quantized graphs alone
            for name in [n for n in graphs if not n.endswith("_quantized.onnx")]:
                os.remove(os.path.join(model_dir, graphs.pop(name)))
        settings = page_settings(model_dir, target_languages(tokenizer), checkpoint, step, quantization)
        _vendor(packages, os.path.join(tmp, "vendor"))
        page = PAGE.replace(SETTINGS, json.dumps(settings, ensure_ascii=False).replace("</", "<\\/"))
        textio.write_file(os.path.join(tmp, "index.html"), page.encode("utf-8"))
        meta = {"format": FORMAT, "checkpoint": os.path.basename(checkpoint), "step": step,
                "quantization": quantization or "float32", "npm": [p.spec for p in NPM_PACKAGES]}
        textio.write_file(os.path.join(tmp, METADATA_FILE), json.dumps(meta, indent=1).encode())
    files = {name: f"model/{path}" for name, path in graphs.items()}
    files["ort-wasm-simd-threaded.asyncify.wasm"] = "vendor/ort-wasm-simd-threaded.asyncify.wasm"
    return files, notes
