"""AgentPerfBench: agentic workload profiles, saturation sweeps, roofline."""

__all__: list[str] = []
