"""Flow-GRPO training on one process: the trainer, tiny-base pretraining, evaluation and prompt pools."""
