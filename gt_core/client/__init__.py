"""The client, in the kernel's process: proxies, recording, plans followed, the session, jit."""
