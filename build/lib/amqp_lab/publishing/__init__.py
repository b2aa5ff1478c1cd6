"""Publishing with publisher confirms + mandatory + persistence: the blocking
:class:`Publisher` (one message at a time) and the :class:`PipelinedPublisher` (a window of
unconfirmed messages)."""

from amqp_lab.publishing.blocking import Publisher, PublishRetry
from amqp_lab.publishing.pipelined import PipelinedPublisher, PublishBatch

__all__ = ["PipelinedPublisher", "PublishBatch", "PublishRetry", "Publisher"]
