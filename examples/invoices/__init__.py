"""The invoices example: its own topology (``topology/invoices.json`` at the repository's
top level), a handler (:func:`examples.invoices.handler.handle`) and a producer (``python -m
examples.invoices.producer``). See README.md in this directory."""
