"""The fleet simulator: replicas running the engine's own scheduler and KV-cache manager on a
profile's clock, behind a router, scaled by KEDA and the HPA as a cluster would scale them."""
