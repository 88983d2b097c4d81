"""Text: reading corpora and files, tokenizers (nmt's SentencePiece models and imported ones), protected
spans, glossaries, terms, languages and language identification. No torch."""
