"""Private machinery of the decode and batch nodes: the executor and its pool, sinks, slabs and buffers, the batch
memo, mapped shards and the lifecycle helper. Nothing here is public; `episodepipes.pipes` wires it.
"""

__all__: list[str] = []  # a folder of modules; import them by their own path
