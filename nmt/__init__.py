"""nmt: end-to-end neural machine translation on PyTorch.

The Python API is `nmt.Translator` (nmt/api.py); it is imported on first use, so that
`import nmt` (and `nmt --help`) stays fast.
"""

__version__ = "0.1.0"
__all__ = ["Translator", "__version__"]


def __getattr__(name: str):
    if name == "Translator":
        from nmt.api import Translator

        return Translator
    raise AttributeError(f"module 'nmt' has no attribute {name!r}")
