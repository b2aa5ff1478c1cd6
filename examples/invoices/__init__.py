"""The invoices example: its own topology (``topology.json``), a handler
(:func:`examples.invoices.handler.handle`) and a producer (``python -m
examples.invoices.producer``). See README.md in this directory."""
