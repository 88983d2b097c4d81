"""The ONNX graphs of a transformers MarianMT / M2M100 model, laid out as optimum's exporter lays them out, so
that optimum's `ORTModelForSeq2SeqLM` and transformers.js load them (nmt/interop/onnx_export.py writes the rest).

    encoder_model.onnx         input_ids, attention_mask [B,S] -> last_hidden_state [B,S,D]
    decoder_model_merged.onnx  input_ids [B,T], encoder_hidden_states [B,S,D], encoder_attention_mask [B,S],
                               past_key_values.{i}.{decoder,encoder}.{key,value} [B,H,*,Dh], use_cache_branch [1]
                               -> logits [B,T,V], present.{i}.{decoder,encoder}.{key,value}

Both come from torch.onnx's dynamo exporter (`torch.onnx.export(dynamo=True)`, opset `OPSET`), run on
transformers' own modules with the cache passed in and out as tensors (`_Decoder`). The merged decoder is
made as optimum's `merge_decoders` makes it (optimum's exporter needs transformers 4; nmt runs on 5): the
decoder without past (the first step: it computes the encoder's keys and values) and the decoder with past
(every later step) are exported apart and joined under one `If` on `use_cache_branch`; the weights both
use are stored once, in the outer graph. The first step gets empty past tensors (their length 0); later
steps feed back the decoder's presents and the first step's encoder presents (which the with-past branch
returns unchanged).

`quantize_int8`: onnxruntime's dynamic quantization (int8 weights of MatMul and Gather, activations
quantized per call; in the decoder's branches too), the `*_quantized.onnx` files transformers.js loads with
`dtype: "q8"`. The exporter's notes on each node (stack traces, module names) are left out of the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os

import torch
from torch import nn

OPSET = 18  # onnxruntime >= 1.14 and onnxruntime-web run it
ENCODER, DECODER = "encoder_model.onnx", "decoder_model_merged.onnx"


class _Encoder(nn.Module):
    """The encoder; with `unk`, an id past the source vocabulary is read as `unk` (nmt/interop/onnx_tokenizer.py:
    the pieces an imported vocabulary lacks)."""

    def __init__(self, model, unk: int | None = None):
        super().__init__()
        self.encoder, self.unk = model.get_encoder(), unk

    def forward(self, input_ids, attention_mask):
        if self.unk is not None:
            vocab = self.encoder.embed_tokens.num_embeddings
            input_ids = torch.where(input_ids < vocab, input_ids, torch.full_like(input_ids, self.unk))
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _Decoder(nn.Module):
    """Decoder steps with the cache as tensors: past_key_values (4 per layer: self key, self value, cross key,
    cross value) in, the logits and the presents out (the cross ones only without past: with past they are
    the inputs'). transformers' EncoderDecoderCache holds them during the call."""

    def __init__(self, model, with_past: bool):
        super().__init__()
        self.model, self.with_past = model, with_past

    def forward(self, encoder_attention_mask, input_ids, encoder_hidden_states, *past):
        import inspect

        from transformers.cache_utils import EncoderDecoderCache

        n = self.model.config.decoder_layers
        cache = EncoderDecoderCache([tuple(past[4 * i:4 * i + 4]) for i in range(n)]) if past else None
        name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"  # (renamed in 5.x)
        out = self.model(attention_mask=encoder_attention_mask, decoder_input_ids=input_ids,
                         encoder_outputs=(encoder_hidden_states,), use_cache=True, **{name: cache})
        cache = out.cache if name == "cache" else out.past_key_values
        self_cache, cross_cache = cache.self_attention_cache, cache.cross_attention_cache
        presents = []
        for i in range(n):
            presents += [self_cache.layers[i].keys, self_cache.layers[i].values]
            if not self.with_past:
                presents += [cross_cache.layers[i].keys, cross_cache.layers[i].values]
        return (out.logits, *presents)


def past_names(layers: int, prefix: str = "past_key_values") -> list[str]:
    return [f"{prefix}.{i}.{side}.{kv}" for i in range(layers) for side in ("decoder", "encoder")
            for kv in ("key", "value")]


def export_graphs(model, directory: str, unk_past_vocab: int | None = None) -> dict[str, str]:
    """Write ENCODER and DECODER of `model` (a transformers MarianMTModel / M2M100ForConditionalGeneration in
    eval mode, fp32) into `directory`; returns {file name: path}. `unk_past_vocab`: the encoder reads the
    ids past the vocabulary as this one (`_Encoder`)."""
    from torch.export import Dim

    c = model.config
    n = c.decoder_layers
    batch, src, tgt, past = (Dim("batch_size"), Dim("encoder_sequence_length"), Dim("decoder_sequence_length"),
                             Dim("past_decoder_sequence_length"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, c.vocab_size - 1, (2, 5), generator=g)  # (not 0 or 1 long: those sizes specialise)
    mask = torch.ones(2, 5, dtype=torch.long)
    with torch.no_grad():
        hidden = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        tgt_ids = torch.randint(4, c.vocab_size - 1, (2, 3), generator=g)
        first = _Decoder(model, False)(mask, tgt_ids, hidden)
    paths = {name: os.path.join(directory, name) for name in (ENCODER, DECODER)}
    _export(_Encoder(model, unk_past_vocab), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"],
            ({0: batch, 1: src}, {0: batch, 1: src}), paths[ENCODER])
    inputs = ["encoder_attention_mask", "input_ids", "encoder_hidden_states"]
    shapes = ({0: batch, 1: src}, {0: batch, 1: tgt}, {0: batch, 1: src})
    presents = past_names(n, "present")
    no_past = _export(_Decoder(model, False), (mask, tgt_ids, hidden), inputs, ["logits", *presents], shapes)
    past_shapes = tuple({0: batch, 2: past if ".decoder." in name else src} for name in past_names(n))
    with_past = _export(_Decoder(model, True), (mask, tgt_ids, hidden, *first[1:]), inputs + past_names(n),
                        ["logits", *[p for p in presents if ".decoder." in p]], (*shapes, past_shapes))
    merged = merge_decoders(no_past, with_past)
    for value in merged.graph.input:  # the first step's encoder past is empty, not encoder_sequence_length long
        if ".encoder." in value.name:
            value.type.tensor_type.shape.dim[2].dim_param = "encoder_sequence_length_out"
    _save(merged, paths[DECODER])
    return paths


@contextlib.contextmanager
def _quiet(*loggers: str):
    """Warnings of the exporter and the quantizer (torchvision missing, "consider pre-processing") off, then
    the loggers' levels as they were ("" is the root logger, which onnxruntime's quantizer writes to)."""
    import warnings

    levels = {name: logging.getLogger(name).level for name in loggers}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in loggers:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def _export(module: nn.Module, args: tuple, input_names: list[str], output_names: list[str], dynamic_shapes,
            path: str | None = None):
    """torch.onnx's dynamo export of `module` on example `args`; saved to `path`, else returned as a ModelProto."""
    with _quiet("torch.onnx"), torch.no_grad():
        program = torch.onnx.export(module, args, input_names=input_names, output_names=output_names,
                                    dynamic_shapes=dynamic_shapes, dynamo=True, opset_version=OPSET,
                                    verbose=False, report=False)
    proto = program.model_proto
    _strip(proto.graph)
    if path is None:
        return proto
    _save(proto, path)
    return proto


def _strip(graph) -> None:
    """Drop what the exporter notes on every node: stack traces with this machine's paths, module names."""
    for node in graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _strip(sub)


def _save(proto, path: str) -> None:
    import onnx

    if proto.ByteSize() < 2**31 - 2**20:
        onnx.save(proto, path)
    else:  # protobuf's 2 GiB limit: the weights beside it, as optimum does
        onnx.save(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=os.path.basename(path) + "_data")


def merge_decoders(no_past, with_past):
    """One ModelProto: If(use_cache_branch) then `with_past` else `no_past` (optimum's `merge_decoders`).
    The outputs are `no_past`'s; the ones `with_past` lacks (the encoder presents) are its past inputs,
    passed through. Initializers equal in both graphs (by content, whatever their names) move to the outer
    graph under one name; the others stay in their branch."""
    import onnx
    from onnx import helper

    outputs = [o.name for o in no_past.graph.output]
    have = {o.name: o for o in with_past.graph.output}
    for name in outputs:
        if name not in have:
            with_past.graph.node.append(helper.make_node("Identity", [name.replace("present", "past_key_values", 1)],
                                                         [name], name=f"pass_{name}"))
    by_name = {o.name: o for o in no_past.graph.output}
    ordered = [have.get(name, by_name[name]) for name in outputs]
    del with_past.graph.output[:]
    with_past.graph.output.extend(ordered)

    shared = _share_initializers(no_past.graph, with_past.graph)
    inputs = {}
    for graph in (no_past.graph, with_past.graph):
        for value in graph.input:
            inputs.setdefault(value.name, value)
    branch = lambda graph, name: helper.make_graph(list(graph.node), name, [], list(graph.output),
                                                   list(graph.initializer))
    flag = helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = helper.make_node("If", ["use_cache_branch"], outputs, name="optimum::if",
                            then_branch=branch(with_past.graph, "with_past"), else_branch=branch(no_past.graph, "no_past"))
    graph = helper.make_graph([node], "merged", [*inputs.values(), flag], list(no_past.graph.output), shared)
    domains = {}
    for opset in [*no_past.opset_import, *with_past.opset_import]:
        domains.setdefault(opset.domain, opset)
    merged = helper.make_model(graph, opset_imports=list(domains.values()), ir_version=no_past.ir_version,
                               producer_name="nmt")
    if merged.ByteSize() < 2**31 - 2**20:  # (the checker serializes the model: protobuf's 2 GiB limit)
        onnx.checker.check_model(merged, full_check=False)
    return merged


def _share_initializers(first, second) -> list:
    """Remove from both graphs the initializers (of 2 or more dimensions) the other graph also has, equal
    byte for byte, and return them, one copy each, renamed `shared.N` (node inputs follow)."""
    key = lambda t: (t.data_type, tuple(t.dims), hashlib.sha256(t.raw_data or t.SerializeToString()).hexdigest())
    in_second = {}
    for t in second.initializer:
        if len(t.dims) >= 2:
            in_second.setdefault(key(t), t)
    shared, done, renames = [], set(), ({}, {})
    for t in first.initializer:
        k = key(t)
        if len(t.dims) >= 2 and k in in_second and k not in done:
            name = f"shared.{len(shared)}"
            renames[0][t.name], renames[1][in_second[k].name] = name, name
            copy = type(t)()
            copy.CopyFrom(t)
            copy.name = name
            shared.append(copy)
            done.add(k)
    for graph, rename in zip((first, second), renames):
        if not rename:
            continue
        keep = [t for t in graph.initializer if t.name not in rename]
        del graph.initializer[:]
        graph.initializer.extend(keep)
        _rename_inputs(graph, rename)
    return shared


def _rename_inputs(graph, rename: dict[str, str]) -> None:
    """Node inputs named in `rename` take the new names, in subgraphs too."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_inputs(sub, rename)


def quantize_int8(path: str) -> str:
    """`path` -> the same name ending `_quantized.onnx`: onnxruntime's dynamic int8 quantization."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = path[: -len(".onnx")] + "_quantized.onnx"
    with _quiet(""):
        quantize_dynamic(path, out, weight_type=QuantType.QInt8, extra_options={"EnableSubgraph": True},
                         use_external_data_format=os.path.exists(path + "_data"))
    return out
