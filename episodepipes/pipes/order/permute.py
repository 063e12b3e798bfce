"""A keyed bijective index shuffle over ``[0, n)`` in O(1) memory, and the elastic global order built on it.

`IndexShuffle` is a 4-round Feistel network over the smallest power-of-two domain holding ``n``, with
cycle-walking: a value that lands outside ``[0, n)`` is permuted again until it falls inside, which keeps
a bijection of ``[0, n)``. Up to ``SMALL`` elements a Feistel net on a few bits is measurably biased
(halves of one or two bits), so there the order is numpy's exact permutation drawn from the same keys
(at most ``SMALL`` entries, kept). Keys come from ``SeedSequence(seed, spawn_key=(epoch, *stream))``,
so an epoch's order is a pure function of ``(seed, epoch)``, and nothing proportional to ``n`` is stored.

The elastic order: epoch ``e``'s global stream is ``perm_e(0), perm_e(1), ...``. Global step ``s`` at
world size ``W`` and per-rank batch ``B`` consumes the block ``[s*G, (s+1)*G)`` with ``G = W*B``; rank
``r`` takes ``s*G + i*W + r`` for ``i < B`` (ranks interleaved: strided slices of each global
block). So the blocks, and with them the stream, depend on ``G`` only, and a run
that has consumed ``c`` samples of an epoch resumes exactly at any size whose ``G'`` divides ``c``.
Drop-last: an epoch has ``n // G`` steps, the same on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

ROUNDS = 4  # Luby-Rackoff: four rounds of a pseudo-random function give a pseudo-random permutation
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
SMALL = 128
MISMATCH = ("refuse", "next_step", "next_epoch")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijective 64-bit hash (uint64 arithmetic wraps, as intended)."""
    x = x ^ (x >> _S30)
    x = x * _M1
    x = x ^ (x >> _S27)
    x = x * _M2
    return x ^ (x >> _S31)


_MASK = (1 << 64) - 1


def _mix_int(x: int) -> int:
    """`_mix` on a Python int: a scalar lookup is ~10x cheaper without numpy's per-call overhead."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@lru_cache(maxsize=1024)
def _small_table(n: int, keys: tuple[int, ...], forward: bool) -> np.ndarray:
    """The order of a domain of at most SMALL elements (or its inverse), read-only."""
    perm = np.random.default_rng(list(keys)).permutation(n)
    out = perm if forward else np.argsort(perm)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=4096)
def _round_keys(seed: int, spawn_key: tuple[int, ...]) -> tuple[int, ...]:
    """Cached: a mixture batch asks for the same few (source, pass) keys again and again."""
    state = np.random.SeedSequence(seed, spawn_key=spawn_key).generate_state(ROUNDS, dtype=np.uint64)
    return tuple(int(k) for k in state)


def _count(name: str, value: Any, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name}={value!r} should be an int >= {low}")
    return int(value)


@dataclass(frozen=True)
class IndexShuffle:
    """A bijection of ``[0, n)`` from a few integer keys; picklable, and cheap to rebuild anywhere.

    Attributes:
        n: the domain size.
        keys: one 64-bit round key per Feistel round.
    """

    n: int
    keys: tuple[int, ...]

    @classmethod
    def of(cls, n: int, *, seed: int, epoch: int, stream: tuple[int, ...] = ()) -> IndexShuffle:
        """The permutation of epoch ``epoch``; ``stream`` separates independent orders (e.g. mixture sources).

        Args:
            n: the domain size.
            seed: the run's seed.
            epoch: the epoch; every epoch has an independent order.
            stream: extra non-negative ints mixed into the key (source id, pass of a cycled source, ...).
        """
        _count("n", n)
        for name, v in (("seed", seed), ("epoch", epoch), *((f"stream[{i}]", s) for i, s in enumerate(stream))):
            _count(name, v)
        return cls(int(n), _round_keys(int(seed), (int(epoch), *map(int, stream))))

    @property
    def bits(self) -> int:
        return max(2, (self.n - 1).bit_length())

    def __len__(self) -> int:
        return self.n

    def __call__(self, positions: int | np.ndarray) -> Any:
        """``perm(positions)`` as int64 (an int for an int): vectorised over any array of positions."""
        return self._apply(positions, forward=True)

    def inverse(self, values: int | np.ndarray) -> Any:
        """The positions that ``self`` maps to ``values``: ``self.inverse(self(p)) == p``."""
        return self._apply(values, forward=False)

    def _apply(self, positions: int | np.ndarray, *, forward: bool) -> Any:
        small = _small_table(self.n, self.keys, forward) if self.n <= SMALL else None
        if isinstance(positions, int | np.integer) and not isinstance(positions, bool):
            if not 0 <= positions < self.n:
                raise IndexError(f"position {positions} should be in [0, {self.n})")
            if small is not None:
                return int(small[positions])
            w = _widths(self.bits)
            y = _net(int(positions), self.keys, w, forward)
            while y >= self.n:  # cycle-walking: the cycle through any x < n comes back below n
                y = _net(y, self.keys, w, forward)
            return y
        x = _positions(positions, self.n)
        if small is not None:
            return small[x].astype(np.int64).reshape(np.shape(positions))
        w = tuple(np.uint64(v) for v in _widths(self.bits))
        y = _walk(x.astype(np.uint64), np.uint64(self.n), [np.uint64(k) for k in self.keys], w, forward)  # type: ignore
        return y.astype(np.int64).reshape(np.shape(positions))


def _positions(positions: Any, n: Any) -> np.ndarray:
    x = np.asarray(positions).ravel()
    if x.dtype.kind not in "iu":
        raise TypeError(f"positions of dtype {x.dtype} should be integers")
    if x.size and (int(x.min()) < 0 or (x >= n).any()):
        top = n if np.ndim(n) == 0 else "the n of each one's shuffle"
        raise IndexError(f"positions should be in [0, {top}); got [{int(x.min())}, {int(x.max())}]")
    return x


def _net(x: Any, keys: Any, w: tuple[Any, Any, Any, Any], forward: bool) -> Any:
    """The Feistel network on an int, or on uint64 arrays; ``w`` = (left width, right width, their masks),
    ints, uint64 scalars or per-element arrays (precomputed: numpy scalar arithmetic is slow)."""
    lw, rw, lm, rm = w
    mix = _mix_int if isinstance(x, int) else _mix
    if forward:
        for k in keys:
            left, right = x >> rw, x & rm
            x = (right << lw) | (left ^ (mix(right ^ k) & lm))
            lw, rw, lm, rm = rw, lw, rm, lm
        return x
    if ROUNDS % 2 == 0:  # the widths the last round started with
        lw, rw, lm, rm = rw, lw, rm, lm
    for k in reversed(keys):  # undo one round: x = (right << lw) | (left ^ f(right))
        right, lf = x >> lw, x & lm
        x = ((lf ^ (mix(right ^ k) & lm)) << rw) | right
        lw, rw, lm, rm = rw, lw, rm, lm
    return x


def _widths(bits: Any) -> tuple[Any, Any, Any, Any]:
    """Left and right widths of a ``bits``-wide network (an odd width gives an unbalanced one), and masks."""
    if isinstance(bits, int):
        lw, rw = (bits + 1) // 2, bits // 2
        return lw, rw, (1 << lw) - 1, (1 << rw) - 1
    one = np.uint64(1)
    lw, rw = (bits + one) >> one, bits >> one
    return lw, rw, (one << lw) - one, (one << rw) - one


def _walk(x: np.ndarray, n: Any, keys: list[Any], w: tuple[Any, Any, Any, Any], forward: bool) -> np.ndarray:
    """Cycle-walk uint64 ``x`` through the network until every value is below its ``n``."""
    def at(v: Any, i: np.ndarray) -> Any:
        return v if np.ndim(v) == 0 else v[i]

    y = _net(x, keys, w, forward)
    out = np.flatnonzero(y >= n)
    while out.size:
        y[out] = _net(y[out], [at(k, out) for k in keys], tuple(at(v, out) for v in w), forward)  # type: ignore
        out = out[y[out] >= at(n, out)]
    return y


def shuffle_many(shuffles: Sequence[IndexShuffle], which: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``shuffles[which[i]](positions[i])`` for every ``i`` in one vectorised pass (int64, of the shape of
    ``positions``): a mixture batch draws from several sources' orders at the cost of one.

    Args:
        shuffles: the permutations.
        which: for each position, the index of its permutation in ``shuffles``.
        positions: the positions, each in the domain of its permutation.
    """
    which = np.asarray(which, np.int64).ravel()
    if which.shape != np.shape(np.asarray(positions).ravel()) or (which.size and not
                                                                  0 <= which.min() <= which.max() < len(shuffles)):
        raise ValueError(f"which should give, for each of the {np.size(positions)} positions, an index into the "
                         f"{len(shuffles)} shuffles")
    if not which.size:
        return np.zeros(np.shape(positions), np.int64)
    ns = np.array([s.n for s in shuffles], np.int64)[which]
    x = _positions(positions, ns)
    y = np.empty(x.shape, np.int64)
    big = ns > SMALL
    for i in np.unique(which[~big]).tolist():  # small domains: their tables
        at = which == i
        y[at] = shuffles[i](x[at])
    if big.any():
        wb = which[big]
        bits = np.array([s.bits for s in shuffles], np.uint64)[wb]
        keys = np.array([s.keys for s in shuffles], np.uint64)[wb].T
        y[big] = _walk(x[big].astype(np.uint64), ns[big].astype(np.uint64), list(keys), _widths(bits), True)
    return y.reshape(np.shape(positions))


def steps_per_epoch(n: int, *, world_size: int, batch_size: int) -> int:
    """Global steps in an epoch of ``n`` samples (drop-last: every rank gets the same ``n // (W*B)`` batches)."""
    _count("n", n)
    return n // (_count("world_size", world_size, low=1) * _count("batch_size", batch_size, low=1))


def global_position(step: int, *, rank: int, index: int, world_size: int, batch_size: int) -> int:
    """Where sample ``index`` of ``rank``'s batch at global step ``step`` sits in the epoch's global stream."""
    if not 0 <= rank < world_size or not 0 <= index < batch_size:
        raise ValueError(f"rank={rank} should be in [0, world_size={world_size}) and index={index} in "
                         f"[0, batch_size={batch_size})")
    return step * world_size * batch_size + index * world_size + rank


def rank_positions(step: int, *, rank: int, world_size: int, batch_size: int, steps: int = 1) -> np.ndarray:
    """Global-stream positions of ``rank``'s batches for ``steps`` global steps from ``step`` (int64, in order).

    Args:
        step: the first global step.
        rank, world_size: this rank and the number of ranks.
        batch_size: the per-rank batch size.
        steps: how many consecutive steps.
    """
    _count("step", step)
    _count("steps", steps)
    global_position(0, rank=rank, index=0, world_size=world_size, batch_size=batch_size)  # validates rank
    s = np.arange(step, step + steps, dtype=np.int64)[:, None]
    return (s * (world_size * batch_size) + np.arange(batch_size, dtype=np.int64) * world_size + rank).ravel()


def rank_samples(shuffle: IndexShuffle, step: int, *, rank: int, world_size: int, batch_size: int) -> np.ndarray:
    """The sample ids of ``rank``'s batch at global ``step``: ``shuffle(rank_positions(...))``."""
    if step >= steps_per_epoch(shuffle.n, world_size=world_size, batch_size=batch_size):
        raise IndexError(f"step={step} is past the epoch's {shuffle.n // (world_size * batch_size)} steps")
    return shuffle(rank_positions(step, rank=rank, world_size=world_size, batch_size=batch_size))


def elastic_state(*, seed: int, epoch: int, step: int, world_size: int, batch_size: int, n: int) -> dict[str, int]:
    """The size-independent resume state after ``step`` global steps of ``epoch`` (at a batch boundary).

    Args:
        seed: the run's seed.
        epoch: the epoch in progress.
        step: global steps done in it.
        world_size, batch_size: the size the run had.
        n: samples per epoch in the global stream (it must match on resume).
    """
    g = _count("world_size", world_size, low=1) * _count("batch_size", batch_size, low=1)
    if not 0 <= step <= steps_per_epoch(n, world_size=world_size, batch_size=batch_size):
        raise ValueError(f"step={step} should be in [0, {n // g}], the epoch's global steps")
    return {"seed": _count("seed", seed), "epoch": _count("epoch", epoch), "consumed": step * g,
            "global_batch": g, "n": n}


def resume_point(state: Mapping[str, Any], *, world_size: int, batch_size: int, n: int, seed: int,
                 on_mismatch: str = "refuse") -> tuple[int, int]:
    """``(epoch, global step)`` at which a run of size ``world_size x batch_size`` continues ``state``.

    Exact (no sample repeated or skipped relative to an uninterrupted run at the new size) when the new
    global batch divides the samples consumed, which always holds when ``W*B`` is unchanged. Otherwise
    ``on_mismatch`` decides: ``"refuse"`` (the default) raises, saying what differs; ``"next_step"`` starts
    at the next step boundary of the new size, skipping fewer than ``W*B`` samples; ``"next_epoch"`` starts
    the next epoch. Both skips are logged as warnings.

    Args:
        state: from `elastic_state` (validated here: it may come from any checkpoint file).
        world_size, batch_size: the new size.
        n: samples per epoch now (a different dataset is refused).
        seed: the seed now (a different seed is refused).
        on_mismatch: one of ``"refuse"``, ``"next_step"``, ``"next_epoch"``.
    """
    if not isinstance(state, Mapping) or set(state) != {"seed", "epoch", "consumed", "global_batch", "n"}:
        raise ValueError(f"the elastic resume state should have keys consumed, epoch, global_batch, n, seed; "
                         f"got {sorted(state) if isinstance(state, Mapping) else type(state).__name__}")
    old = {k: _count(f"state[{k!r}]", state[k], low=int(k == "global_batch")) for k in state}
    if on_mismatch not in MISMATCH:
        raise ValueError(f"{on_mismatch=} should be one of {MISMATCH}")
    if old["seed"] != seed or old["n"] != n:
        raise ValueError(f"the checkpoint has seed={old['seed']} over n={old['n']} samples per epoch, this run "
                         f"seed={seed} over n={n}; resume with the checkpoint's seed and data")
    epoch, consumed, g = old["epoch"], old["consumed"], world_size * batch_size
    if consumed % old["global_batch"] or consumed > n:
        raise ValueError(f"state['consumed']={consumed} should be a multiple of state['global_batch']="
                         f"{old['global_batch']} and at most n={n}")
    steps = steps_per_epoch(n, world_size=world_size, batch_size=batch_size)
    if consumed % g == 0:
        step = consumed // g
    elif on_mismatch == "refuse":
        raise ValueError(f"the checkpoint consumed {consumed} samples of epoch {epoch} at global batch "
                         f"{old['global_batch']}; world_size*batch_size={world_size}*{batch_size}={g} does not "
                         f"divide it, so no step at the new size starts there; keep the global batch "
                         f"{old['global_batch']} (any world_size*batch_size equal to it), or pass "
                         "on_mismatch='next_step' or 'next_epoch' to skip ahead")
    elif on_mismatch == "next_step":
        step = -(-consumed // g)
        log.warning("resuming epoch %d at step %d of global batch %d: %d samples skipped", epoch, step, g,
                    min(step * g, n) - consumed)
    else:
        log.warning("resuming at epoch %d: the rest of epoch %d (%d samples) skipped", epoch + 1, epoch, n - consumed)
        step = steps
    return (epoch + 1, 0) if step >= steps else (epoch, step)
