"""What a consuming service (the batcher, a worker) does with its Kafka consumer besides
fetching: hear its partitions move (``Rebalance``) and stop fetching while it holds too
much (``Backpressure``). What each service does about it stays in the service."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition


class Rebalance(ConsumerRebalanceListener):
    """Hands partition moves to the service: ``revoked`` is awaited before the partitions
    go (commit, and drop or hold what they brought); ``assigned``, if given, hears (and,
    if a coroutine, is awaited on) the new ones."""

    def __init__(
        self,
        revoked: Callable[[list[TopicPartition]], Awaitable[None]],
        assigned: Callable[[list[TopicPartition]], Awaitable[None] | None] | None = None,
    ) -> None:
        self._revoked = revoked
        self._assigned = assigned

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._revoked(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        if self._assigned is not None and (pending := self._assigned(assigned)) is not None:
            await pending


class Backpressure:
    """Pauses consumption of every assigned partition while the service is full, and
    resumes it once there is room again; meanwhile Kafka keeps the backlog durable."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        self.paused = False

    def apply(self, *, full: bool, room: bool) -> bool:
        """Pause when ``full``; once paused, resume only when ``room`` (below ``full``'s
        limit, for some hysteresis; ``not full`` for none). Returns whether it changed."""
        parts = list(self.consumer.assignment())
        if full and not self.paused:
            self.consumer.pause(*parts)
            self.paused = True
            return True
        if self.paused and room:
            self.consumer.resume(*parts)
            self.paused = False
            return True
        return False
