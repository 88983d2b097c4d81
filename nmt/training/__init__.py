"""Training: the loop, one optimizer step, loss, schedule, validation, checkpoints of a run, fine-tuning,
growing a model's languages, distributed training."""
