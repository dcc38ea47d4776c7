"""Text in and out: the checkpoint's tokenizer, its chat template, incremental detokenization."""
