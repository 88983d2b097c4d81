"""Scores of translations: sacreBLEU's metrics, significance tests, degenerate outputs."""
