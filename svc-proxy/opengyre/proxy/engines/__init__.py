"""The proxy's engine side: the pool (routing, drain, queue) following cell events, one generation dispatched
across engines, the engine clients (SGLang native, vLLM) and TITO prompt planning."""

__all__: list[str] = []
