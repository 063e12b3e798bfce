"""Pure orders: which episode, block or frame comes next (no I/O, no torch). `permute` (the seeded permutation),
`block_order` (blocks of shards), `rank_blocks` (blocks dealt to ranks), `mixture` (weighted sources), `shuffle` (the
frame table), `window` (frame windows).
"""

__all__: list[str] = []  # a folder of modules; import them by their own path
