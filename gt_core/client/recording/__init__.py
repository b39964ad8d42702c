"""Recording: proxies of worker tensors, every aten op on them an instruction, the metadata and uploads it needs, and torch's own workflows (pickling, generators) on proxies."""
