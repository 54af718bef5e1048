"""Shared memory of one block, as the executor knows it (docs/structural.md, "The PTX engine").

The memory is the entries stored so far (a constant byte address, or a symbolic address such as a tile
element `kv[e / D][e % D]` of a loop over a runtime size, each mapped to the bits stored there) over the
unknown content of the current *epoch*:
- a read that an entry answers is that entry (a value stored then read back at the same address, constant
  or the same symbolic term, is that value; constant entries that tile the read are concatenated);
- any other read is the epoch's unknown content at that address, `fresh("shared memory", (epoch, address))`:
  two reads of one address with no store between them are one term (a score read once into the max and once
  into its exponential is the same value), a read after another store is not;
- every store instruction starts a new epoch; a store at a symbolic address may land anywhere, so it drops
  every entry but its own instruction's (lanes storing to one address in one instruction race: the engine
  runs lanes in lockstep and does not see races, Compute Sanitizer does); a store at a constant address drops
  the symbolic entries and the constant ones it overlaps partially.
The state is immutable (the executor's paths share it); `store` and `merge` return a new one. Statically
declared `.shared` arrays lie at distinct offsets (`layout`). Every stored value is kept (`stored`): what a
read of unknown content may be.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernalin_ci.ptx import terms as T

WHAT = "shared memory"  # the unknown content's `fresh` tag


@dataclass(frozen=True)
class SharedMemory:
    const: dict = field(default_factory=dict)  # byte address -> bits
    sym: dict = field(default_factory=dict)  # symbolic address term -> bits
    epoch: int = 0

    @staticmethod
    def unknown() -> SharedMemory:
        """Content nothing is known of (a new epoch): at the start, and at a loop's header (earlier
        iterations may have stored anything)."""
        return SharedMemory({}, {}, T.next_id())

    def read(self, a: T.Term, w: int) -> T.Term:
        if not T.is_const(a):
            hit = self.sym.get(a)
            return hit if hit is not None and hit.width == w else self._content(a, w)
        return self._read_const(T.value(a), w)

    def _read_const(self, addr: int, w: int) -> T.Term:
        hit = self.const.get(addr)
        if hit is not None and hit.width == w:
            return hit
        if hit is not None and hit.width > w:
            return T.extract(hit, 0, w)
        parts, pos = [], 0
        while pos < w and (x := self.const.get(addr + pos // 8)) is not None:
            parts.append(x)
            pos += x.width
        if pos == w:
            return T.concat(parts)
        if parts or self._overlapped(addr, w // 8):
            return T.fresh(WHAT, w)  # partly known: no one term says it
        return self._content(addr, w)

    def _content(self, addr: int | T.Term, w: int) -> T.Term:
        return T.mk("fresh", (WHAT, (self.epoch, addr)), "bv", w)

    def _overlapped(self, addr: int, size: int) -> bool:
        """Some constant entry overlaps [addr, addr + size) without starting at addr."""
        for b in range(addr - 7, addr + size):
            x = self.const.get(b)
            if x is not None and b != addr and b + x.width // 8 > addr:
                return True
        return False

    def store(self, writes: list[tuple[T.Term, T.Term, T.Term]]) -> SharedMemory:
        """One instruction's stores, (address, bits, guard) per lane and vector part, as one batch."""
        if not writes:
            return self
        const = {} if any(not T.is_const(a) for a, _, _ in writes) else dict(self.const)
        sym: dict = {}
        if const:
            for a, x, _ in writes:  # drop what the batch overlaps partially
                addr, size = T.value(a), x.width // 8
                for b in range(addr - 7, addr + size):
                    y = const.get(b)
                    if y is not None and b + y.width // 8 > addr and (b != addr or y.width != x.width):
                        del const[b]
        out = SharedMemory(const, sym, T.next_id())
        for a, x, g in writes:
            key = T.value(a) if T.is_const(a) else a
            table = const if T.is_const(a) else sym
            if g is not T.TRUE:
                old = table.get(key)
                old = old if old is not None and old.width == x.width else self.read(a, x.width)
                x = T.ite(g, x, old)
            table[key] = x
        return out


def merge(a: SharedMemory, b: SharedMemory, ca: T.Term) -> SharedMemory:
    """Two paths' memories at a join: ca holds where the first path came."""
    if a is b:
        return a
    if a.const is b.const and a.sym is b.sym and a.epoch == b.epoch:
        return a
    const = {}
    for addr in set(a.const) | set(b.const):
        x, y = a.const.get(addr), b.const.get(addr)
        if x is y:
            const[addr] = x
            continue
        w = (x if x is not None else y).width
        x = x if x is not None and x.width == w else a._read_const(addr, w)
        y = y if y is not None and y.width == w else b._read_const(addr, w)
        const[addr] = T.ite(ca, x, y)
    sym = {k: v for k, v in a.sym.items() if b.sym.get(k) is v}
    return SharedMemory(const, sym, a.epoch if a.epoch == b.epoch else T.next_id())


def merge_split(a: SharedMemory, b: SharedMemory, base: SharedMemory) -> SharedMemory:
    """Lanes split by a branch meet again: both sides ran (`if (tid == 0) item = ...`), so what either
    stored since the split (BASE, the memory there) is in the block's memory; an address both changed, or
    any symbolic entry they do not share, is unknown content."""
    if a is base or a == base:
        return b
    if b is base or b == base:
        return a
    const = {}
    for addr in set(a.const) | set(b.const) | set(base.const):
        x, y, o = a.const.get(addr), b.const.get(addr), base.const.get(addr)
        v = y if x is o else x if y is o else None
        if v is not None:
            const[addr] = v
    sym = {k: v for k, v in a.sym.items() if b.sym.get(k) is v}
    return SharedMemory(const, sym, T.next_id())


def layout(globals_: dict) -> dict[str, int]:
    """Each `.shared` array's byte offset: the static arrays one after another (16-byte aligned), then the
    extern (dynamic) ones, which all start where the static ones end."""
    out, end = {}, 0
    for name, g in globals_.items():
        if g.space == "shared" and g.size:
            out[name] = end
            end += (g.size + 15) // 16 * 16
    for name, g in globals_.items():
        if g.space == "shared" and not g.size:
            out[name] = end
    return out
