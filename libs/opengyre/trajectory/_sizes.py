"""How large each recorded execution is, read from the proxy's trajectory store by its table names (what the
scheduler's simulator fits a workload's tokens from, without importing the proxy).

A call's size is ``prefix_len + n_prompt_delta + n_output``: the lengths every row keeps, also when the tokens
themselves are in the payload store (the row's token columns are empty then, so counting the ids would count
only the prefix of such a call).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, column, func, inspect, select, table

__all__ = ["CALLS_TABLE", "EXECUTIONS_TABLE", "ExecutionSize", "execution_sizes"]

CALLS_TABLE = "proxy_calls"  # the proxy's call rows (opengyre.proxy.TrajectoryProjection)
EXECUTIONS_TABLE = "proxy_executions"  # its per-execution counters


@dataclass(frozen=True, slots=True)
class ExecutionSize:
    execution_id: str
    largest_call: int  # tokens of its largest call: prompt (prefix + delta) + output, the context it needed
    stored_tokens: int  # prompt deltas + outputs of all its calls: what its trajectory tree keeps


def execution_sizes(conn: Connection) -> list[ExecutionSize]:
    """Every execution of the trajectory store with at least one call, in the order first recorded; none when
    the store's tables are not in this database."""
    names = set(inspect(conn).get_table_names())
    if not {CALLS_TABLE, EXECUTIONS_TABLE} <= names:
        return []
    c = table(CALLS_TABLE, column("execution_id"), column("prefix_len"), column("n_prompt_delta"), column("n_output"))
    x = table(EXECUTIONS_TABLE, column("execution_id"), column("stored_tokens"), column("first_seq"))
    largest = func.max(c.c.prefix_len + c.c.n_prompt_delta + c.c.n_output)
    q = (
        select(x.c.execution_id, largest, x.c.stored_tokens)
        .join(c, c.c.execution_id == x.c.execution_id)
        .group_by(x.c.execution_id, x.c.stored_tokens, x.c.first_seq)
        .order_by(x.c.first_seq)
    )
    return [ExecutionSize(r[0], int(r[1]), int(r[2])) for r in conn.execute(q).all()]
