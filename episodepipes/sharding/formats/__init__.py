"""Source formats the shard writer reads: `raw`, `zarr_reader`, `lerobot` (+ `lerobot_meta`), `synthetic`, the
`video` and `imagehead` helpers, and `readers` (the name -> reader table, plugins included).
"""

__all__: list[str] = []  # a folder of modules; import them by their own path
