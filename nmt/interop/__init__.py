"""Hugging Face MarianMT / M2M100 / NLLB import and export, CTranslate2 export, and the directories they write."""
