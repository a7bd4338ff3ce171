"""The slave framework every collector and learner runs on: registration, heartbeats,
task threads (`core.py`), the `/v1` routes the coordinator calls (`app.py`), their
client (`client.py`), and the process entry point (`main.py`)."""
