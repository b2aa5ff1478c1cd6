"""The command line: the only part of amqp_lab that reads the environment (EAI_AMQP_URL,
EAI_MGMT_URL, EAI_LOG_LEVEL, EAI_TRACEBACK). scripts/ and the console entry points call it."""

__all__ = ["common", "topology", "worker"]  # the modules: import amqp_lab.cli.worker
