"""Retries: the one backoff type (:class:`Backoff`, which also gives tenacity's wait), the
consumer's :class:`RetryPolicy`, and the broker-held wait-queue maths."""

from amqp_lab.retry.policy import REQUEUE_ONCE, Backoff, RetryPolicy

__all__ = ["REQUEUE_ONCE", "Backoff", "RetryPolicy"]
