"""The kopf operator that reconciles InferenceService resources."""
