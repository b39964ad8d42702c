"""Periods nested in a longer one: when a shorter block gives way to the loop around it, and
when it comes back.

The rule: the shorter block is found first (it repeats sooner), and its occurrences join the
history instead of clearing it, so the longer period is found as soon as it has repeated too.
The longer block then runs the shorter one's instructions with the rest of its period, so the
shorter one is matched no more (retired): the longest period that repeats wins. Where the
shorter block's own period repeats again outside the longer block's runs, the stream went
back to the loop it was found in (a cell run again after another), and it is matched again
(revived): refused for good, that loop had no block at all, every step run op by op.
"""

from __future__ import annotations

__all__ = ["retire_nested", "inside_its_loop", "revive"]


def retire_nested(block, sigs, blocks, matcher) -> None:
    """Retire the blocks ``sigs`` whose occurrences ran inside ``block``'s."""
    for sig in sigs:
        inner = blocks[sig]
        if not inner.retired:
            matcher.retire(
                inner,
                f"its occurrences lie inside the period of hot path {block.sig} "
                f"({len(block.form.canon.ops)} ops): part of a larger loop's body, which runs "
                "it from now on",
                by=block.sig,
            )


def inside_its_loop(block, begins, blocks, history) -> bool:
    """Whether occurrences of the retired ``block`` found at ``begins`` in ``history`` lie
    inside runs of the longer block that retired it: its nested period seen again within
    that loop's body, where the loop's block still runs it."""
    by = blocks.get(block.retirement.by) if block.retirement.by else None
    if by is None or by.form.keys is None:
        return True
    n = len(by.form.keys)
    return any(at <= b < at + n for at, sig in history.runs if sig == by.sig for b in begins)


def revive(block, matcher, client_match: bool) -> None:
    """Match the retired ``block`` again: its own loop is back."""
    matcher.revive(
        block,
        f"its period repeats again outside hot path {block.retirement.by}, which ran it: the "
        "stream went back to the loop it was found in",
        client_match,
    )
