"""The loss lab (scripts/loss_lab.py, docs/loss-lab.md): the same crash scenario against seven
queue designs, from a Redis list to RabbitMQ with manual acks and de-duplication, and the
measured table of messages lost, messages processed twice and memory per 100k kept."""
