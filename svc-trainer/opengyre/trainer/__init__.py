"""QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, weight publishing."""

__all__: list[str] = []
