"""Devices, threads and the process: which device a command runs on, how many batches decode at once,
and the process-wide CPU settings (`cpu_tuning`: NMT_CPU_TUNING=0 turns every CPU fast path off, those
of nmt/model/fast.py and nmt/search/fast.py too; `tune_malloc`: glibc's allocator thresholds).

Used by training (`nmt train`) and by both inference engines; torch is imported only inside
the functions that need it (resolving a torch device, reading torch's thread count).
"""

from __future__ import annotations

import ctypes
import os
import sys

from nmt.errors import UserError

M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
_THRESHOLD = 2**31 - 1  # mallopt takes an int: blocks of up to 2 GiB come from the heap
INFERENCE_MMAP = 16 << 20  # inference: blocks above 16 MiB are mapped (and returned when freed)
INFERENCE_TRIM = 64 << 20  # inference: free memory above 64 MiB at the heap's top is returned

_malloc_tuned = False


def cpu_tuning() -> bool:
    """False when the environment variable NMT_CPU_TUNING is 0: the CPU fast paths are off."""
    return os.environ.get("NMT_CPU_TUNING", "1") != "0"



def parse_device(name: str | None) -> tuple[str, int | None]:
    """"auto"/None -> ("auto", None); "cpu" -> ("cpu", None); "cuda" -> ("cuda", None); "cuda:N" -> ("cuda", N).
    Anything else is a one-line UserError (both engines parse devices with this)."""
    if name is None or name == "auto":
        return "auto", None
    kind, sep, index = str(name).partition(":")
    if kind not in ("cpu", "cuda") or (sep and not index.isdigit()) or (kind == "cpu" and sep):
        raise UserError(f"invalid device {name!r} (use auto, cpu, cuda or cuda:N)")
    return kind, int(index) if sep else None


def resolve_torch_device(name):
    """"auto"/None -> CUDA if available, else CPU; otherwise that device (UserError if unavailable)."""
    import torch

    if isinstance(name, torch.device):
        return name
    kind, index = parse_device(name)
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r} requested but CUDA is not available")
    return torch.device(kind, index) if index is not None else torch.device(kind)


def resolve_workers(workers: int, device, threads: int | None = None) -> int:
    """decode.workers with 0 (auto) resolved: 2 on a CPU with at least 2 threads (default: torch's
    intra-op threads), else 1 (measurements: BENCHMARKS.md, "Decoding workers")."""
    if workers:
        return workers
    kind = device.type if hasattr(device, "type") else parse_device(str(device))[0]
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    return 2 if kind == "cpu" and threads >= 2 else 1


def allow_recompiles(shapes: int) -> None:
    """Raise torch.compile's recompile limit (process-wide) so that a function compiled with static shapes
    keeps a graph for each of `shapes` shapes (data.length_buckets); Dynamo's default (8) runs the others
    eagerly."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, shapes + 1)


def avoid_cudnn_attention() -> None:
    """Take cuDNN out of the kernels `scaled_dot_product_attention` may pick on CUDA (process-wide:
    `torch.backends.cuda.enable_cudnn_sdp(False)`; flash / memory-efficient attention take over).
    cuDNN's attention builds an execution plan for each new sequence length, and nmt brings a new
    length at nearly every call (each decoding step, each batch): BENCHMARKS.md, "On a GPU"."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


def tune_malloc(inference: bool = False) -> bool:
    """Raise glibc's mmap and trim thresholds for this process; True if applied (Linux/glibc only).
    Training: blocks up to 2 GiB come from the heap, never trimmed. Inference: blocks up to
    `INFERENCE_MMAP` come from the heap, larger ones (cache buffers, encoder activations) are mapped, and
    the heap keeps at most `INFERENCE_TRIM` free at its top, so changing buffer sizes do not fragment it."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if not cpu_tuning() or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own symbols: libc's, without a library search
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap, trim = (INFERENCE_MMAP, INFERENCE_TRIM) if inference else (_THRESHOLD, _THRESHOLD)
    _malloc_tuned = bool(mallopt(M_MMAP_THRESHOLD, mmap)) & bool(mallopt(M_TRIM_THRESHOLD, trim))
    return _malloc_tuned
