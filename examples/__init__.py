"""Applications built on amqp_lab, runnable from the repository root (not part of the
installed package): ``examples.invoices`` is a worker of one's own, on its own topology."""
