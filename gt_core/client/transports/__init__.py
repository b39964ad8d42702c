"""Transports: how the client reaches its worker (a spawned process, this process, a TCP connection, a group of ranks) and why one ended."""
