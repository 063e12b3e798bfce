"""A deterministic weighted interleave of sources: exact shares over every window, addressable by position.

The schedule is a binary tree of two-way Bresenham splits (a Huffman tree over the weights, so heavy
sources sit near the root). A node of rate ``a = p/q`` (the share of its left child) sends position
``k`` of its own subsequence left when ``floor(((k+1)p + h)/q) > floor((kp + h)/q)`` (``h = q // 2``):
a balanced (Sturmian) word, whose every window of ``N`` holds ``floor(aN)`` or ``ceil(aN)`` lefts. A window
of the whole sequence is a window of every node's subsequence, so source ``i``'s count over any window
of ``N`` samples is within ``bound(i) = sum(w_i / w_X for each node X on its path, the root excluded)``
of ``w_i * N``: exactly within one for two sources, and in general within a small constant that does not
grow with ``N`` (within one is impossible for most weights of three or more sources: Fraenkel's problem).

Weights are exact rationals (``Fraction(str(w))`` for a float, so ``0.6`` is ``3/5``) and the integer
arithmetic is exact, so the schedule never drifts. ``locate(g)`` (the g-th sample's source and its index
in that source) and ``position(source, k)`` (the inverse) walk the tree, O(depth), without replaying.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from episodepipes.pipes.order.permute import IndexShuffle, shuffle_many

STOPS = ("cycle", "first_exhausted")


@dataclass(frozen=True)
class _Node:
    """An internal node: its left share ``p/q`` of its subsequence, and its children (int = a source)."""

    p: int
    q: int
    left: _Node | int
    right: _Node | int

    def lefts(self, k: int) -> int:
        """How many of positions ``0..k-1`` go left (the right count is ``k - lefts(k)``)."""
        return (k * self.p + self.q // 2) // self.q

    def nth(self, j: int, *, left: bool) -> int:
        """The position of the ``j``-th left (or right) item: the least ``k`` with ``count(k + 1) > j``."""
        p, h = (self.p, self.q // 2) if left else (self.q - self.p, self.q - 1 - self.q // 2)
        return -(-((j + 1) * self.q - h) // p) - 1


MAX_RATIO = 10**9  # the largest weight over the smallest: far past any useful mixture, and epochs stay countable
MAX_EPOCH = 2**62  # samples per epoch: positions stay int64 (and len() a Python index) with room for a batch


def _weight(name: str, w: Any) -> Fraction:
    if isinstance(w, bool) or not isinstance(w, int | float | Fraction | np.integer | np.floating):
        raise ValueError(f"weight of {name!r}={w!r} should be a positive number")
    if isinstance(w, float | np.floating) and not np.isfinite(w):  # Fraction("nan") names no source
        raise ValueError(f"weight of {name!r}={w!r} should be a finite positive number")
    f = Fraction(str(w)) if isinstance(w, float | np.floating) else Fraction(w)  # 0.6 means 3/5
    if not f > 0:
        raise ValueError(f"weight of {name!r}={w!r} should be positive; leave the source out instead")
    return f


def _check_ratio(names: tuple[str, ...], raw: list[Fraction], given: Mapping[str, Any]) -> None:
    hi, lo = max(range(len(raw)), key=raw.__getitem__), min(range(len(raw)), key=raw.__getitem__)
    if raw[hi] > MAX_RATIO * raw[lo]:
        raise ValueError(f"weight of {names[hi]!r}={given[names[hi]]!r} is more than {MAX_RATIO} times that of "
                         f"{names[lo]!r}={given[names[lo]]!r}; keep the weights within a ratio of {MAX_RATIO}, or "
                         "leave the light source out")


@dataclass(frozen=True)
class Mixture:
    """The interleave of named sources with weights and sizes; picklable, O(#sources) state.

    Attributes:
        names: the sources, in the order given (source ids are positions in it).
        weights: each source's exact share (they sum to 1).
        sizes: samples per epoch of each source.
        stop: ``"cycle"`` or ``"first_exhausted"`` (see `Mixture.of`).
    """

    names: tuple[str, ...]
    weights: tuple[Fraction, ...]
    sizes: tuple[int, ...]
    stop: str
    _root: _Node | int
    _paths: tuple[tuple[tuple[_Node, bool], ...], ...]  # per source: (node, went left) from the root down

    @classmethod
    def of(cls, weights: Mapping[str, Any], sizes: Mapping[str, int], *, stop: str = "cycle") -> Mixture:
        """Build the schedule.

        ``stop="cycle"`` (the default, as torchdata's ``CYCLE_UNTIL_ALL_DATASETS_EXHAUSTED``): an epoch
        lasts until every source has given each of its samples at least once; a source that runs out
        first restarts, in a new order (its next *pass*). So every frame is seen each epoch, and the
        epoch's length follows the data, not the smallest source. ``"first_exhausted"``: the epoch ends
        just before any source would repeat; the rest of the larger sources sit that epoch out.

        Args:
            weights: source name -> positive weight (normalised; ints, fractions or floats).
            sizes: source name -> samples per epoch (positive), the same names.
            stop: ``"cycle"`` or ``"first_exhausted"``.
        """
        if not weights or set(weights) != set(sizes):
            raise ValueError(f"weights {sorted(weights)} and sizes {sorted(sizes)} should name the same sources, "
                             "at least one")
        if stop not in STOPS:
            raise ValueError(f"{stop=} should be one of {STOPS}")
        names = tuple(weights)
        for s in names:
            if isinstance(sizes[s], bool) or not isinstance(sizes[s], int | np.integer) or sizes[s] < 1:
                raise ValueError(f"size of {s!r}={sizes[s]!r} should be a positive int (samples per epoch)")
        raw = [_weight(s, weights[s]) for s in names]
        _check_ratio(names, raw, weights)
        total = sum(raw)
        ws = tuple(w / total for w in raw)
        heap: list[tuple[Fraction, int, _Node | int]] = [(w, i, i) for i, w in enumerate(ws)]
        heapq.heapify(heap)
        tie = len(ws)
        while len(heap) > 1:  # Huffman: merge the two lightest; ties by creation order, so deterministic
            (wa, _, a), (wb, _, b) = heapq.heappop(heap), heapq.heappop(heap)
            share = wa / (wa + wb)
            heapq.heappush(heap, (wa + wb, tie, _Node(share.numerator, share.denominator, a, b)))
            tie += 1
        root = heap[0][2]
        paths: list[tuple[tuple[_Node, bool], ...]] = [()] * len(ws)
        todo: list[tuple[_Node | int, tuple[tuple[_Node, bool], ...]]] = [(root, ())]
        while todo:
            node, path = todo.pop()
            if isinstance(node, int):
                paths[node] = path
            else:
                todo += [(node.left, (*path, (node, True))), (node.right, (*path, (node, False)))]
        out = cls(names, ws, tuple(int(sizes[s]) for s in names), stop, root, tuple(paths))
        n = out._length()
        if n > MAX_EPOCH:
            raise ValueError(f"the mixture of {dict(zip(names, out.sizes))} samples with weights "
                             f"{ {s: weights[s] for s in names} } makes an epoch of {n} samples, more than "
                             f"{MAX_EPOCH}; bring the weights closer to the sources' sizes")
        return out

    def locate(self, g: int) -> tuple[int, int]:
        """``(source id, k)``: global sample ``g`` is the ``k``-th sample drawn from that source."""
        if isinstance(g, bool) or not isinstance(g, int | np.integer) or g < 0:
            raise ValueError(f"g={g!r} should be a non-negative int")
        node, k = self._root, int(g)
        while not isinstance(node, int):
            c = node.lefts(k)
            if node.lefts(k + 1) > c:
                node, k = node.left, c
            else:
                node, k = node.right, k - c
        return node, k

    def locate_many(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`locate` over an array of positions, vectorised per tree node: (source ids, k), int64 arrays."""
        g = np.asarray(g)
        flat = g.ravel().astype(np.int64)
        if flat.size and int(flat.min()) < 0:
            raise ValueError(f"positions should be non-negative; got {int(flat.min())}")
        src, ks = np.empty(flat.size, np.int64), np.empty(flat.size, np.int64)
        todo: list[tuple[_Node | int, np.ndarray, np.ndarray]] = [(self._root, np.arange(flat.size), flat)]
        while todo:
            node, at, k = todo.pop()
            if isinstance(node, int):
                src[at], ks[at] = node, k
                continue
            if k.size and (int(k.max()) + 1) * node.p + node.q >= 2**62:
                k = k.astype(object)  # exact Python ints where int64 could overflow
            c = (k * node.p + node.q // 2) // node.q
            left = ((k + 1) * node.p + node.q // 2) // node.q > c
            todo += [(node.left, at[left], c[left].astype(np.int64)),
                     (node.right, at[~left], (k - c)[~left].astype(np.int64))]
        return src.reshape(g.shape), ks.reshape(g.shape)

    def position(self, source: int, k: int) -> int:
        """The global position of the ``k``-th sample of ``source`` (the inverse of `locate`)."""
        if not 0 <= source < len(self.names) or k < 0:
            raise ValueError(f"source={source} should be in [0, {len(self.names)}) and k={k} non-negative")
        for node, left in reversed(self._paths[source]):
            k = node.nth(k, left=left)
        return k

    def counts(self, g: int) -> list[int]:
        """How many of the first ``g`` global samples each source gives."""
        out = [0] * len(self.names)

        def walk(node: _Node | int, k: int) -> None:
            if isinstance(node, int):
                out[node] = k
            else:
                c = node.lefts(k)
                walk(node.left, c)
                walk(node.right, k - c)
        walk(self._root, g)
        return out

    def bound(self, source: int) -> Fraction:
        """The tested bound: over any window of ``N`` samples, ``|count - weight * N| < bound(source)``
        (1 for a lone source, whose count is exact)."""
        w = self.weights[source]
        share, total = Fraction(1), Fraction(0)
        for node, left in self._paths[source]:  # the weight of each node below the root, top down
            share *= Fraction(node.p, node.q) if left else 1 - Fraction(node.p, node.q)
            total += w / share
        return total if self._paths[source] else Fraction(1)

    def __len__(self) -> int:
        """Global samples per epoch under the stop rule (at most `MAX_EPOCH`, checked by `of`)."""
        return self._length()

    def _length(self) -> int:
        if self.stop == "cycle":  # the last source to finish its first pass ends the epoch
            return max(self.position(s, n - 1) + 1 for s, n in enumerate(self.sizes))
        return min(self.position(s, n) for s, n in enumerate(self.sizes))  # just before the first repeat

    def draw(self, g: int) -> tuple[int, int, int]:
        """``(source id, pass, index)``: the sample at global ``g`` is item ``index`` of the source's
        ``pass``-th order of the epoch (pass > 0 only for a cycled source); shuffle it with
        ``IndexShuffle.of(size, seed=seed, epoch=epoch, stream=(source, pass))``."""
        s, k = self.locate(g)
        return s, k // self.sizes[s], k % self.sizes[s]

    def samples(self, g: np.ndarray, *, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source ids, sample ids within each source)`` of global positions ``g`` in ``epoch``: `draw`,
        then each source pass's own `IndexShuffle` (stream ``(source, pass)``). A pure function of its
        arguments, so a resumed run or any rank computes the same samples without replaying."""
        src, k = self.locate_many(g)
        sizes = np.asarray(self.sizes, np.int64)[src]
        passes = k // sizes
        ns = len(self.names)
        groups, which = np.unique((passes * ns + src).ravel(), return_inverse=True)  # one per (source, pass)
        shuffles = [IndexShuffle.of(self.sizes[g % ns], seed=seed, epoch=epoch, stream=(g % ns, g // ns))
                    for g in groups.tolist()]
        return src, shuffle_many(shuffles, which.ravel(), (k % sizes).ravel()).reshape(src.shape)
