"""QwenGyre elastic scheduler: cells move between rollout and training under the watermark rule."""

__all__: list[str] = []
