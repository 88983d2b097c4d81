"""Translating text: the one pipeline, the engines (PyTorch, CTranslate2), batching, scoring, tuning."""
