"""The harness-facing HTTP gateway: ``_routes`` (the route table, model lists), ``_auth`` (the key check and
``infer_role``), ``_streams`` (a call's streamed body, the merge of ``n`` samples' streams) and ``_gateway``
(``Gateway``: lifecycle, TITO state, the one call pipeline every call, ``n > 1`` included, goes through, and
recording)."""

from ._gateway import Gateway, GatewayConfig, ServedContext

__all__ = ["Gateway", "GatewayConfig", "ServedContext"]
