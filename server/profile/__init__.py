"""The engine's profile on its hardware: step time as a function of the step's shape."""
