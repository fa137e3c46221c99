"""The daemon keeps its start-up heap out of the cyclic garbage collector."""

from __future__ import annotations

import gc

from sandboxd.daemon import freeze_startup_heap


def test_freeze_startup_heap_moves_what_exists_out_of_collections() -> None:
    before = gc.get_freeze_count()
    long_lived = [[i] for i in range(20_000)]
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= before + len(long_lived)
        # A full collection no longer walks them: none is left in a generation.
        tracked = {id(x) for x in gc.get_objects()}
        assert not any(id(x) in tracked for x in long_lived[:100])
    finally:
        gc.unfreeze()
