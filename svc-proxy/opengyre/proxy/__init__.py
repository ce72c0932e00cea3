"""QwenGyre token-in/token-out model gateway with trajectory trees."""

__all__: list[str] = []
