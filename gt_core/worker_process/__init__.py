"""The worker process (the remote side): its serve loop, the executor of instructions, its CPU share."""
