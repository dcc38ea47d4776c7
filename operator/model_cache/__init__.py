"""The node-local model cache: the ModelCache kind, what the operator makes of it, and the
agent that holds copies on each node (agent/)."""
