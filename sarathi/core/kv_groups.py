"""KV-cache groups: which layers share a block table, so that sliding-window layers can drop old blocks.

Layers of one attention kind (global, or a sliding window of W keys) need the same blocks of a sequence:
global layers every block, sliding layers only the blocks their window still reaches. Layers are split
into groups of equal size, each group of one kind; every group has its own block table per sequence, and
all groups draw pages from one pool. A page holds one block of KV for each of a group's layers (its
"slots"), so a page freed by a sliding group can be reused by any group. The group size is the gcd of
the kinds' layer counts: Gemma 3 270M (15 sliding, 3 global layers) has six groups of three layers, one
global and five sliding. A model with global attention only has one group of all its layers: one table
per sequence, as without groups.

Pure Python: the block manager, the scheduler and the simulator use it, the workers map layers to pages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers (model indices) whose KV lives in one block table; ``window``: keys a query sees (None: all)."""

    layers: tuple[int, ...]
    window: int | None


def kv_cache_groups(layer_windows: Sequence[int | None]) -> tuple[KVCacheGroup, ...]:
    """Split layers into equal-size groups of one kind each (kinds: None for global attention, else the
    window); layers keep their order within a kind."""
    if not layer_windows:
        raise ValueError("a model needs at least one layer")
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(layer_windows):
        if window is not None and window < 1:
            raise ValueError(f"layer {layer}: sliding window must be >= 1, got {window}")
        kinds.setdefault(window, []).append(layer)
    size = math.gcd(*(len(layers) for layers in kinds.values()))
    return tuple(
        KVCacheGroup(tuple(layers[i : i + size]), window)
        for window, layers in kinds.items()
        for i in range(0, len(layers), size)
    )


@dataclass(frozen=True)
class LayerSlots:
    """Where each layer of a stage keeps its KV: its group's block table and its slot in that group's pages.

    ``group_of[j]`` and ``slot_of[j]`` are for the stage's j-th layer; the stage allocates ``num_slots``
    page arrays and layer j reads and writes array ``slot_of[j]`` at the pages of group ``group_of[j]``.
    """

    group_of: tuple[int, ...]
    slot_of: tuple[int, ...]
    num_slots: int


def layer_slots(groups: Sequence[KVCacheGroup], first_layer: int, end_layer: int) -> LayerSlots:
    """The slots of layers [first_layer, end_layer) (one pipeline stage): a group's layers on the stage
    take slots 0, 1, ... in order, so a stage holds as many page arrays as its largest group share."""
    where = {layer: (g, i) for g, group in enumerate(groups) for i, layer in enumerate(group.layers)}
    group_of, slot_of = [], []
    used: dict[int, int] = {}
    for layer in range(first_layer, end_layer):
        g, _ = where[layer]
        group_of.append(g)
        slot_of.append(used.get(g, 0))
        used[g] = used.get(g, 0) + 1
    return LayerSlots(tuple(group_of), tuple(slot_of), max(used.values(), default=0))
