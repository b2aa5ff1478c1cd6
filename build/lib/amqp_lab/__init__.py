"""amqp-lab: reliable messaging on RabbitMQ - publisher confirms, persistence, manual acks
after the work is committed, idempotent processing through a dedup store, DLQ records and
replay. Import the parts: :mod:`amqp_lab.topology`, :mod:`amqp_lab.publishing`,
:mod:`amqp_lab.consuming`, :mod:`amqp_lab.retry`, :mod:`amqp_lab.dedup`, :mod:`amqp_lab.dlq`,
:mod:`amqp_lab.settings`, :mod:`amqp_lab.errors`."""

__version__ = "0.2.0"

__all__ = ["__version__"]
