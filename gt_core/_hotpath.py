"""Placeholder engine: runs everything eagerly (replaced by hot-path detection)."""

from __future__ import annotations


class Engine:
    def __init__(self, ex, options, publish):
        self.ex, self.options = ex, options

    def feed(self, instrs):
        for ins in instrs:
            self.ex.execute(ins)

    def control(self, what, value):
        if what == "options":
            self.options = value

    def close(self):
        pass
