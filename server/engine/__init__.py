"""The engine core: requests and their sequences, the KV-cache blocks they hold, the
scheduler that batches them step by step, and the loop that runs it all."""
