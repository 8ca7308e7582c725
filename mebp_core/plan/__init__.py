"""The memory/time planner: predicts a configuration's peak memory by component and its step
time, from the architecture and a host calibration, without importing torch (the service
calls it in its API process)."""
