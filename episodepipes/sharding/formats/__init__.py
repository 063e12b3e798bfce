"""Source formats the shard writer reads: `raw`, `zarr_reader`, `lerobot` (+ `lerobot_meta`), `synthetic`, the
`video` and `imagehead` helpers, and `readers` (the name -> reader table, plugins included).
"""
