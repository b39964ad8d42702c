"""Compiling a hot block: lowering to FX, backends, the compile process."""
