"""The Transformer (nmt/model/transformer.py), its checkpoint record, reduced precision and CPU fast paths."""
