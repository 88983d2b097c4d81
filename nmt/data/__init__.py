"""Training data: encoded corpora cached on disk, mixed into token-budget batches, prefetched."""
