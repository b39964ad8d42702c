"""Plans: the worker's blocks as the client follows them, op by op, and where each block's ops come from (the user's lines)."""
