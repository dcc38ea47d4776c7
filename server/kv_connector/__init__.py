"""KV connectors: what moves KV blocks between the device's cache and somewhere else."""
