"""Structured outputs: a request's output held to a JSON schema, a regular expression, a list
of choices or a grammar. The constraint (params.py) and its schema check (json_schema.py) are
plain data; the engine compiles grammars off its step loop (grammar_compiler.py); the device side
masks each constrained row's logits to what its grammar allows next (grammar_mask.py)."""
