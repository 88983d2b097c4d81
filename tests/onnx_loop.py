"""The greedy loop a user of an `nmt export --format onnx` directory writes (imported as `onnx_loop` by
tests/test_onnx.py and tests/test_onnx_web.py): onnxruntime over the encoder and the merged decoder, the
`tokenizers` library over tokenizer.json, generation_config.json's limits. No nmt code runs in it."""

from __future__ import annotations

import json
import os

import numpy as np


def ort_greedy(directory: str, lines: list[str], *, quantized: bool = False, max_new_tokens: int | None = None,
               logits: bool = False):
    """Greedy search with onnxruntime over the export's encoder and merged decoder, tokenizer.json for the text,
    generation_config.json's max_length, bad_words_ids and forced_bos_token_id: ([output ids], [finished],
    [text]); with `logits` the last step's logits [B,V] instead."""
    import onnxruntime as ort
    from tokenizers import Tokenizer as HFTokenizer

    suffix = "_quantized" if quantized else ""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    encoder = ort.InferenceSession(os.path.join(directory, "onnx", f"encoder_model{suffix}.onnx"), opts)
    decoder = ort.InferenceSession(os.path.join(directory, "onnx", f"decoder_model_merged{suffix}.onnx"), opts)
    read = lambda name: json.load(open(os.path.join(directory, name), encoding="utf-8"))
    config, gen = read("config.json"), read("generation_config.json")
    tokenizer = HFTokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    sources = [e.ids for e in tokenizer.encode_batch(lines)]  # (the post-processor appends </s>)
    batch, width = len(lines), max(map(len, sources))
    ids = np.full((batch, width), config["pad_token_id"], np.int64)
    mask = np.zeros((batch, width), np.int64)
    for row, source in enumerate(sources):
        ids[row, :len(source)], mask[row, :len(source)] = source, 1
    hidden = encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    heads = config["decoder_attention_heads"]
    past = {i.name: np.zeros((batch, heads, 0, config["d_model"] // heads), np.float32)
            for i in decoder.get_inputs() if i.name.startswith("past_key_values.")}
    names = [o.name for o in decoder.get_outputs()]
    step_ids = np.full((batch, 1), config["decoder_start_token_id"], np.int64)
    out, finished = [[] for _ in lines], [False] * batch
    limit = max_new_tokens or gen["max_length"] - 1
    for step in range(limit):
        step_logits, *presents = decoder.run(None, {"input_ids": step_ids, "encoder_hidden_states": hidden,
                                               "encoder_attention_mask": mask, "use_cache_branch": np.array([step > 0]),
                                               **past})
        last = step_logits[:, -1]
        for (bad,) in gen.get("bad_words_ids", []):
            last[:, bad] = -np.inf
        best = last.argmax(-1)
        if step == 0 and gen.get("forced_bos_token_id") is not None:  # (a multilingual model's target language)
            best[:] = gen["forced_bos_token_id"]
        for row in range(batch):
            if not finished[row] and len(out[row]) == step:
                if best[row] == config["eos_token_id"]:
                    finished[row] = True
                else:
                    out[row].append(int(best[row]))
        for name, value in zip(names[1:], presents):
            if step == 0 or ".decoder." in name:  # the encoder's keys and values come from the first step
                past[name.replace("present", "past_key_values")] = value
        step_ids = best[:, None].astype(np.int64)
    if logits:
        return last
    return out, finished, tokenizer.decode_batch(out, skip_special_tokens=True)
