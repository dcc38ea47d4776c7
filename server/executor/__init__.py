"""The seam between the engine (which decides each step) and the device side (which runs it):
the step plan, plain data, and the Executor that carries it out."""
