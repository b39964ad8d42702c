"""The stream's recent history: the instructions run eagerly, and the occurrences of detected
blocks among them, since the last occurrence of a block a signal or a jit call marked.

Detection searches it. Each instruction is kept three ways: as sent, as a key without its
ids (``local_key``: equal for the same op at the same place in a period), and as the paths of
its result's tensors (what a block built from it returns). An occurrence of a detected block
joins it with the keys and paths its block was found with; its instructions are expanded only
when something reads them (a RUN from the client carries none).
"""

from __future__ import annotations

import time

import torch

from gt_core.stream.instructions import FREE, MARK, OP, PUT, RNG, Ref, without_ids
from gt_core.stream.meta import ValueMeta

__all__ = ["History", "local_key", "exact_key", "out_paths", "value_ids"]


class History:
    """The instructions run eagerly lately, their keys and out paths; bounded by ``window``."""

    def __init__(self, meta):
        self.meta = meta  # value id -> the ValueMeta of a live value, or None
        self._instrs: list = []  # (None at a joined occurrence's place until it is read)
        self._joined: list = []  # [position, length, Occurrence] of joined occurrences not yet read
        self.runs: list = []  # [position, signature] of blocks' occurrences (joined, or found)
        self.keys: list = []
        self.hashes: list = []  # hash of each key: detection searches these (ints compare fast)
        self.paths: list = []  # out paths of the OP instructions' results (None for others)
        # ms each OP instruction took to run (None for others): a block's profile, read
        # when it is found (how the time of an occurrence splits over its ops and lines)
        self.ms: list = []
        # Metadata of values freed lately: a block's input may be freed before it is named.
        self.freed_meta: dict[int, ValueMeta] = {}
        # [position, time.time()] where eager recording (re)started: at the first instruction
        # kept, and after each joined occurrence (when_recorded)
        self._since: list = []

    @property
    def instrs(self) -> list:
        """The instructions, joined occurrences' expanded in place."""
        return self.read_from(0)

    def read_from(self, lo: int) -> list:
        """The instructions, the joined occurrences that reach position ``lo`` or later
        expanded in place (before it, a joined occurrence's places may still be None):
        detection reads only the last few periods."""
        joined = self._joined
        if joined and joined[-1][0] + joined[-1][1] > lo:
            self._joined = [j for j in joined if j[0] + j[1] <= lo]
            for at, n, occ in joined:
                if at + n > lo:
                    self._instrs[at : at + n] = occ.instructions
        return self._instrs

    def __len__(self) -> int:
        return len(self._instrs)

    def __getitem__(self, i):
        lo = (i.start or 0) if isinstance(i, slice) else i
        return self.read_from(max(0, lo))[i]

    def meta_of(self, vid: int):
        """The metadata of a value, live or freed lately; None if unknown."""
        m = self.meta(vid)
        return self.freed_meta.get(vid) if m is None else m

    def remember(self, vid: int) -> None:
        """Keep the metadata of a value about to be freed."""
        m = self.meta(vid)
        if m is not None:
            self.freed_meta[vid] = m

    def append(self, ins, result, window: int, ms: float | None = None) -> int:
        """Record an instruction run eagerly (in ``ms``); how many old ones were dropped to
        make room."""
        if not self._instrs:
            self._since = [[0, time.time()]]
        # An upload's value is the worker's now; kept here, every batch uploaded would stay
        # alive for two windows of instructions (61 MB of batches after 40 small epochs).
        if ins.code == PUT:
            ins = ins._replace(value=None)
        elif ins.code == RNG:
            ins = ins._replace(state=None)
        self._instrs.append(ins)
        key = local_key(ins)
        self.keys.append(key)
        self.hashes.append(hash(key))
        self.paths.append(out_paths(result) if ins.code == OP else None)
        self.ms.append(ms)
        return self._bound(window)

    def stamp(self, block, occurrences, length: int) -> None:
        """Give a block found at ``occurrences`` its ops' times there, and the keys, hashes
        and out paths of its last occurrence: join reads them back for each later one."""
        op_ms = self.profile(occurrences, length)
        begin, end = occurrences[-1], occurrences[-1] + length
        keys, hashes = tuple(self.keys[begin:end]), tuple(self.hashes[begin:end])
        block.found_at(op_ms, keys, hashes, tuple(self.paths[begin:end]))

    def join(self, block, occ, window: int) -> int:
        """Record an occurrence of a detected ``block`` (its form: BlockForm), with the keys
        and out paths of the instructions it was found in; how many old instructions were
        dropped to make room."""
        keys, nones = block.keys, block.nones
        self.runs.append([len(self._instrs), block.sig])
        self._joined.append([len(self._instrs), len(keys), occ])
        self._instrs.extend(nones)
        self.keys.extend(keys)
        # (the hashes it was found with; hashed anew for a block that came without them,
        # so keys and hashes never fall out of step)
        hashes = block.hashes
        self.hashes.extend(hashes if len(hashes) == len(keys) else map(hash, keys))
        self.paths.extend(block.entry_paths)
        self.ms.extend(nones)  # (a block's run is timed whole, not per op)
        for j in block.freed_inputs:  # (an input it frees may be an input of a longer block)
            self.remember(occ.free_ids[j])
        self._since.append([len(self._instrs), time.time()])
        return self._bound(window)

    def when_recorded(self, position: int) -> float | None:
        """When the eager recording that reached ``position`` began: the first instruction
        kept, or the end of the last joined occurrence before it."""
        return next((t for at, t in reversed(self._since) if at <= position), None)

    def _bound(self, window: int) -> int:
        if len(self._instrs) <= 2 * window:
            return 0
        drop = len(self._instrs) - window
        kept = []
        for at, n, occ in self._joined:
            if at >= drop:
                kept.append([at - drop, n, occ])
            elif at + n > drop:  # (partly dropped: what stays of it is read now)
                self._instrs[at : at + n] = occ.instructions
        self._joined = kept
        self.runs = [[at - drop, sig] for at, sig in self.runs if at >= drop]
        kept = [m for m in self._since if m[0] > drop]
        before = [m for m in self._since if m[0] <= drop][-1:]  # (what the first kept began in)
        self._since = [[max(0, at - drop), t] for at, t in before + kept]
        del (
            self._instrs[:drop],
            self.keys[:drop],
            self.hashes[:drop],
            self.paths[:drop],
            self.ms[:drop],
        )
        if len(self.freed_meta) > 4 * window:
            self.freed_meta.clear()
        return drop

    def clear(self) -> None:
        """Forget the instructions (an occurrence of a block not detected here ran: the period
        starts again)."""
        self._instrs.clear(), self._joined.clear(), self.runs.clear(), self._since.clear()
        self.keys.clear(), self.hashes.clear()
        self.paths.clear(), self.ms.clear()

    def ran(self, sig: str, begins) -> None:
        """Block ``sig`` was found in the instructions at ``begins``: count them as its
        occurrences (runs_within)."""
        self.runs += [[b, sig] for b in begins]

    def runs_within(self, begins, length: int) -> set:
        """The signatures of the joined occurrences that began inside [b, b + length) for a
        b in ``begins``."""
        return {sig for at, sig in self.runs if any(b <= at < b + length for b in begins)}

    def profile(self, begins, length: int) -> list:
        """ms per entry of a block found at ``begins`` (None where an entry is no op): the
        fastest of its occurrences, as timeit reports, since a busy machine only adds time."""
        out = []
        for k in range(length):
            ms = [self.ms[b + k] for b in begins if self.ms[b + k] is not None]
            out.append(round(min(ms), 5) if ms else None)
        return out

    def out_paths_of(self, positions) -> list:
        """The out paths of the OP instructions at ``positions``, in order."""
        return [self.paths[i] for i in positions if self.paths[i] is not None]


def out_paths(result) -> list[tuple]:
    """Where the tensors of an op's result are: [()] for a single tensor, else index paths."""
    if isinstance(result, torch.Tensor):
        return [()]
    out = []
    if isinstance(result, (list, tuple)):
        for i, r in enumerate(result):
            out.extend((i, *p) for p in out_paths(r))
    return out


def local_key(ins):
    """An instruction without its ids: equal for the same op at the same place in a period."""
    code = ins.code
    if code == OP:
        return (OP, ins.op, without_ids(ins.args), len(ins.outs))
    if code == FREE:
        return (FREE,)
    return (code, ins.name if code == MARK else None)


def exact_key(ins):
    """An instruction without its ids but with its floats: equal where nothing changed."""
    if ins.code != OP:
        return (ins.code,)
    return (OP, ins.op, repr(_strip_refs(ins.args)), repr(ins.kwargs))


def _strip_refs(a):
    t = type(a)
    if t is Ref:
        return None
    if t is list or t is tuple:
        return tuple(_strip_refs(x) for x in a)
    return a


def value_ids(ins):
    """The ids an instruction reads, writes or frees."""
    if ins.code == FREE:
        return (ins.vid,)
    if ins.code != OP:
        return ()
    out = []
    _collect(ins.args, out)
    _collect(tuple(ins.kwargs.values()), out)
    out.extend(ins.outs)
    return out


def _collect(a, out) -> None:
    t = type(a)
    if t is Ref:
        out.append(a.id)
    elif t is list or t is tuple:
        for x in a:
            _collect(x, out)
