"""Speculative decoding: a proposer guesses a sequence's next k tokens, one step computes them
all with the target model, and the guesses the target model would have drawn itself are kept.
The configuration (config.py) and the n-gram proposer (ngram.py) are the engine's, in tokens;
the acceptance rule (rejection.py) is the device side's, on probabilities."""
