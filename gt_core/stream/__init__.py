"""The instruction stream's vocabulary, shared by client and worker: instructions, plans, canonical forms."""
