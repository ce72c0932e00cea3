"""The proxy's recording: every answered call's event through a durable outbox (recorder, outbox), the
trajectory store and its readers (store, trees), TITO state restored after a restart, ATIF export."""

__all__: list[str] = []
