"""Pure planner that maps live GPUs to Ulysses sequence-parallel (SP) groups.

Why a planner: a preemption removes GPUs from SP groups and a new spot node adds GPUs. Persistent
workers survive, so the cheapest recovery keeps as many workers as possible in the group they are
already in (no re-sharding of their role, no new peers to wait for) and only re-forms what broke.

The objective, in priority order:

1. **Degree profile.** Every live GPU is in exactly one group. Group sizes are valid degrees
   (divisors of the head count, of the image-token count when given, and at most the preferred
   degree). As many groups as possible have the preferred degree; the remainder is split greedily
   into the largest valid degrees. The profile depends only on the GPU count.
2. **Fewest moves.** A move is a GPU that is not in the new group's matched old group (groups are
   matched one-to-one to maximise overlap), so surviving members that stay together cost nothing
   and every newcomer costs one. The minimum is reached by pairing survivor fragments (old group
   intersected with the live GPUs) with profile slots, both sorted by size: the kept count
   ``sum(min(fragment, slot))`` is maximised by that pairing because ``min`` is supermodular.
3. **Intra-node preference.** Among such plans, groups should span as few nodes as possible. The
   planner tries up to ``_PAIRING_CAP`` survivor-keeping pairings; for each it fills the slots
   (own nodes first, then best-fit) and runs a local search of member exchanges between two groups
   that cut node spans without losing kept survivors; the plan with the fewest spans wins, and a
   few span-neutral exchanges then let it leave a plateau if that cuts spans further. The search
   evaluates at most ``_EXCHANGE_CAP`` candidate exchanges (a count, so plans stay deterministic;
   about 0.3 s of planning on 128 GPUs here). This
   matches a brute-force optimum on every small case the tests draw; for large clusters it is a
   heuristic, not a proof.

Moves rank above locality on purpose: a regroup interrupts rollouts, while an existing cross-node
group keeps working. A fresh plan (no previous) has equal moves everywhere, so locality decides.

Invariants: plans are deterministic functions of their inputs; members are sorted ``(node, gpu)``
tuples; the generation grows by one whenever the groups change and stays otherwise.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import combinations, islice
from math import comb
from typing import Iterable, Iterator, Mapping, Sequence

Member = tuple[str, int]

_SWAP_CAP = 256  # most member exchanges tried per (group pair, node, size)
_PAIRING_CAP = 64  # most survivor-keeping pairings compared for locality
_PLATEAU_CAP = 16  # most span-neutral exchanges in a row while searching for a better plan
_EXCHANGE_CAP = 200_000  # most candidate exchanges evaluated over all pairings (and again for plateaus)

__all__ = [
    "Member",
    "Plan",
    "SPGroup",
    "degree_for_resolution",
    "degree_profile",
    "moves",
    "plan_groups",
    "valid_degrees",
]


@dataclass(frozen=True)
class SPGroup:
    """One SP group: its members in rank order (sorted) and its degree (= member count)."""

    members: tuple[Member, ...]
    degree: int

    def __post_init__(self) -> None:
        assert self.degree == len(self.members) >= 1, (self.degree, self.members)
        assert list(self.members) == sorted(set(self.members)), self.members

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(node for node, _ in self.members)


@dataclass(frozen=True)
class Plan:
    """A full assignment of live GPUs to SP groups, tagged with its regroup generation."""

    groups: tuple[SPGroup, ...]
    generation: int
    idle: tuple[Member, ...] = ()  # live GPUs no group of at least the minimum degree can hold

    def __post_init__(self) -> None:
        seen = [m for g in self.groups for m in g.members]
        assert len(seen) == len(set(seen)), "a GPU is in two groups"
        assert not set(seen) & set(self.idle), "a GPU is both idle and in a group"
        assert self.generation >= 0, self.generation

    @property
    def members(self) -> frozenset[Member]:
        return frozenset(m for g in self.groups for m in g.members)

    @property
    def extra_node_spans(self) -> int:
        """Sum over groups of (nodes spanned - 1): 0 when every group is intra-node."""
        return sum(len(g.nodes) - 1 for g in self.groups)

    def group_of(self, member: Member) -> SPGroup | None:
        for group in self.groups:
            if member in group.members:
                return group
        return None


@dataclass
class _Slot:
    """A group under construction and the survivors of the old group it is matched to."""

    members: list[Member]
    origin: frozenset[Member]

    @property
    def kept(self) -> int:
        return len(self.origin.intersection(self.members))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_degrees(num_heads: int, preferred_degree: int, num_tokens: int | None = None) -> tuple[int, ...]:
    """Degrees a group may take, descending: divisors of the head count (and of the token count,
    since Ulysses shards image tokens evenly and does not pad) up to the preferred degree."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    if preferred_degree < 1 or num_heads % preferred_degree:
        raise ValueError(f"preferred_degree={preferred_degree} must divide num_heads={num_heads}")
    if num_tokens is not None and (num_tokens < 1 or num_tokens % preferred_degree):
        raise ValueError(f"preferred_degree={preferred_degree} must divide num_tokens={num_tokens}")
    tokens = num_tokens if num_tokens is not None else num_heads
    return tuple(d for d in reversed(_divisors(num_heads)) if d <= preferred_degree and tokens % d == 0)


def degree_profile(total: int, degrees: Sequence[int]) -> tuple[int, ...]:
    """Group sizes for ``total`` GPUs: greedy largest-valid-degree first (1 is always valid)."""
    assert 1 in degrees, degrees
    sizes: list[int] = []
    remaining = total
    for degree in sorted(degrees, reverse=True):
        count, remaining = divmod(remaining, degree)
        sizes.extend([degree] * count)
    return tuple(sizes)


def floor_profile(total: int, degrees: Sequence[int]) -> tuple[int, ...]:
    """Group sizes for ``total`` GPUs when some counts cannot be covered (1 is not a valid
    degree): the most GPUs in groups, then the largest groups first; the rest wait."""
    best: list[tuple[int, ...] | None] = [()] + [None] * total
    for n in range(1, total + 1):
        options = [best[n - d] + (d,) for d in degrees if d <= n and best[n - d] is not None]
        best[n] = max((tuple(sorted(o, reverse=True)) for o in options), default=None)
    used = max(n for n in range(total + 1) if best[n] is not None)
    return best[used]


def degree_for_resolution(
    height: int,
    width: int,
    *,
    num_heads: int,
    max_tokens_per_gpu: int = 4096,
    vae_scale_factor: int = 8,
    patch_size: int = 2,
) -> int:
    """The smallest SP degree that keeps at most ``max_tokens_per_gpu`` image tokens on each GPU
    and divides both the head count and the image-token count (Ulysses needs both)."""
    cell = vae_scale_factor * patch_size
    if height <= 0 or width <= 0 or height % cell or width % cell:
        raise ValueError(f"height={height} and width={width} must be positive multiples of {cell}")
    tokens = (height // cell) * (width // cell)
    for degree in _divisors(num_heads):
        if tokens % degree == 0 and tokens // degree <= max_tokens_per_gpu:
            return degree
    raise ValueError(
        f"no degree dividing num_heads={num_heads} and tokens={tokens} keeps "
        f"max_tokens_per_gpu={max_tokens_per_gpu}"
    )


def _augment(cost: list[list[int]], row: int, u: list[int], v: list[int], row_of: list[int]) -> None:
    """Add ``row`` (1-based) to the matching along a shortest augmenting path on reduced costs."""
    n, inf = len(cost), float("inf")
    row_of[0], col = row, 0
    minv, used, prev = [inf] * (n + 1), [False] * (n + 1), [0] * (n + 1)
    while row_of[col]:
        used[col] = True
        r, delta, nxt = row_of[col], inf, 0
        for c in range(1, n + 1):
            if not used[c]:
                reduced = cost[r - 1][c - 1] - u[r] - v[c]
                if reduced < minv[c]:
                    minv[c], prev[c] = reduced, col
                if minv[c] < delta:
                    delta, nxt = minv[c], c
        for c in range(n + 1):
            if used[c]:
                u[row_of[c]] += delta
                v[c] -= delta
            else:
                minv[c] -= delta
        col = nxt
    while col:
        row_of[col] = row_of[prev[col]]
        col = prev[col]


def _max_weight_assignment(weights: list[list[int]]) -> int:
    """Maximum total weight of a one-to-one row/column matching (Hungarian algorithm, O(n^3))."""
    n = max(len(weights), max((len(r) for r in weights), default=0))
    padded = [[weights[i][j] if i < len(weights) and j < len(weights[i]) else 0 for j in range(n)]
              for i in range(n)]
    cost = [[-w for w in row] for row in padded]
    u, v, row_of = [0] * (n + 1), [0] * (n + 1), [0] * (n + 1)  # column 0 is scratch
    for row in range(1, n + 1):
        _augment(cost, row, u, v, row_of)
    return sum(padded[row_of[c] - 1][c - 1] for c in range(1, n + 1))


def moves(old: Plan | None, new: Plan) -> int:
    """GPUs of ``new`` outside their group's matched old group (optimal one-to-one matching)."""
    if old is None:
        return len(new.members)
    overlaps = [[len(set(n.members) & set(o.members)) for o in old.groups] for n in new.groups]
    return len(new.members) - _max_weight_assignment(overlaps)


def _live_members(live: Mapping[str, Iterable[int]]) -> list[Member]:
    members = sorted({(str(node), int(gpu)) for node, gpus in live.items() for gpu in gpus})
    for node, gpus in live.items():
        gpus = list(gpus)
        if len(gpus) != len(set(gpus)):
            raise ValueError(f"live[{node!r}] lists a GPU twice: {gpus}")
    return members


def _fragments(previous: Plan | None, live: set[Member]) -> list[list[Member]]:
    """Survivors of each old group, largest first (ties: old group order, for determinism)."""
    if previous is None:
        return []
    parts = [[m for m in g.members if m in live] for g in previous.groups]
    return sorted((p for p in parts if p), key=len, reverse=True)


def _keep_local(fragment: list[Member], size: int) -> list[Member]:
    """The ``size`` members of a shrinking fragment that span the fewest nodes."""
    by_node = Counter(node for node, _ in fragment)
    order = sorted(fragment, key=lambda m: (-by_node[m[0]], m))
    return order[:size]


def _take_from_pool(pool: list[Member], count: int, home: Counter[str]) -> list[Member]:
    """Pick ``count`` pool members: first the slot's own nodes (most represented first), then
    best-fit: the node with the fewest spare GPUs that still covers the need, else the largest."""
    taken: list[Member] = []
    spare = Counter(node for node, _ in pool)
    while len(taken) < count:
        need = count - len(taken)
        own = [n for n, _ in home.most_common() if spare[n]]
        fits = sorted((c, n) for n, c in spare.items() if c >= need)
        node = own[0] if own else (fits[0][1] if fits else max(spare, key=lambda n: (spare[n], n)))
        for member in [m for m in pool if m[0] == node][:need]:
            taken.append(member)
            pool.remove(member)
        spare = Counter(n for n, _ in pool)
        home[node] += 1
    return taken


def _best_kept(fragment_sizes: list[int], slot_sizes: list[int]) -> int:
    """Most survivors that can stay with their group: sorted (assortative) pairing of sizes."""
    pairs = zip(sorted(fragment_sizes, reverse=True), sorted(slot_sizes, reverse=True))
    return sum(min(f, s) for f, s in pairs)


def _kept_optimal_pairings(fragments: list[list[Member]], sizes: Sequence[int]) -> Iterator[list[int | None]]:
    """Fragment-to-slot pairings (slot -> fragment index or None) that keep the most survivors.

    Depth-first over fragments, each picking a slot size (slots of one size are interchangeable)
    or none; the exact bound :func:`_best_kept` prunes every branch that cannot reach the optimum,
    so each explored branch yields a pairing.
    """
    lengths = [len(f) for f in fragments]
    target = _best_kept(lengths, list(sizes))
    free = Counter(sizes)

    def extend(i: int, kept: int, picks: list[int | None]) -> Iterator[list[int | None]]:
        if i == len(fragments):
            yield _pairing_from_picks(picks, sizes)
            return
        for size in sorted((s for s in free if free[s]), reverse=True) + [None]:
            gain = 0 if size is None else min(lengths[i], size)
            if size is not None:
                free[size] -= 1
            if kept + gain + _best_kept(lengths[i + 1:], list(free.elements())) >= target:
                yield from extend(i + 1, kept + gain, picks + [size])
            if size is not None:
                free[size] += 1

    yield from extend(0, 0, [])


def _pairing_from_picks(picks: list[int | None], sizes: Sequence[int]) -> list[int | None]:
    """Turn each fragment's picked slot size into a slot -> fragment index list."""
    pairing: list[int | None] = [None] * len(sizes)
    for fragment, size in enumerate(picks):
        if size is not None:
            slot = next(j for j, s in enumerate(sizes) if s == size and pairing[j] is None)
            pairing[slot] = fragment
    return pairing


def _build(members: list[Member], sizes: Sequence[int], fragments: list[list[Member]],
           pairing: list[int | None]) -> list[_Slot]:
    """Slots holding their paired fragment's kept members, then filled from the spare GPUs."""
    slots = [
        _Slot(members=[], origin=frozenset()) if f is None
        else _Slot(members=_keep_local(fragments[f], size), origin=frozenset(fragments[f]))
        for f, size in zip(pairing, sizes)
    ]
    taken = {m for slot in slots for m in slot.members}
    pool = [m for m in members if m not in taken]
    for i in sorted(range(len(sizes)), key=lambda i: (-(sizes[i] - len(slots[i].members)), i)):
        home = Counter(node for node, _ in slots[i].members)
        slots[i].members += _take_from_pool(pool, sizes[i] - len(slots[i].members), home)
    assert not pool, pool
    return slots


def _spans(group: Iterable[Member]) -> int:
    return len({node for node, _ in group})


def _swap_candidates(a: list[Member], b: list[Member]) -> Iterator[tuple[list[Member], list[Member]]]:
    """Exchanges of some of ``a``'s members on one node for as many of ``b``'s members elsewhere.

    The search is capped (at most ``_SWAP_CAP`` exchanges per node and size) so large groups stay
    cheap.
    """
    for node in sorted({n for n, _ in a}):
        part = [m for m in a if m[0] == node]
        others = [m for m in b if m[0] != node]
        for k in range(1, min(len(part), len(others)) + 1):
            if comb(len(part), k) * comb(len(others), k) > _SWAP_CAP:
                continue
            for out_a in combinations(part, k):
                for out_b in combinations(others, k):
                    yield list(out_a), list(out_b)


class _Budget:
    """Candidate exchanges the locality search may still evaluate for one plan (a count, not a
    clock, so plans stay deterministic)."""

    def __init__(self, left: int) -> None:
        self.left = left


def _exchanges(a: _Slot, b: _Slot, budget: _Budget) -> Iterator[tuple[int, list[Member], list[Member], bool]]:
    """Exchanges between ``a`` and ``b`` that keep as many survivors with their matched old group
    (the two may trade old groups), as (span change, new a, new b, whether origins trade)."""
    kept_before = a.kept + b.kept
    count_a = Counter(node for node, _ in a.members)
    count_b = Counter(node for node, _ in b.members)
    for out_a, out_b in _swap_candidates(a.members, b.members):
        if budget.left <= 0:
            return
        budget.left -= 1
        # Span change from node counts alone (cheap); lists are built only for candidates.
        node, k = out_a[0][0], len(out_a)  # out_a lies on one node, out_b on others
        leaving: dict[str, int] = {}
        for other, _ in out_b:
            leaving[other] = leaving.get(other, 0) + 1
        delta = ((count_b[node] == 0) - (count_a[node] == k)
                 + sum((count_a[n] == 0) - (count_b[n] == c) for n, c in leaving.items()))
        if delta > 0:
            continue
        new_a = [m for m in a.members if m not in out_a] + out_b
        new_b = [m for m in b.members if m not in out_b] + out_a
        same = len(a.origin.intersection(new_a)) + len(b.origin.intersection(new_b))
        crossed = len(b.origin.intersection(new_a)) + len(a.origin.intersection(new_b))
        if max(same, crossed) < kept_before:
            continue
        yield delta, new_a, new_b, crossed > same


def _total_spans(slots: list[_Slot]) -> int:
    return sum(_spans(s.members) for s in slots)


def _signature(slots: list[_Slot]) -> frozenset[frozenset[Member]]:
    return frozenset(frozenset(s.members) for s in slots)


def _next_exchange(slots: list[_Slot], seen: set | None, budget: _Budget):
    """The first exchange that cuts node spans; with ``seen``, else the first that keeps them
    and leads to a partition not in ``seen`` (a plateau step). One pass over the candidates."""
    nodes = [{node for node, _ in s.members} for s in slots]
    # A span cut needs a shared node (one side's members must land where it already is); plateau
    # steps are searched among the same pairs, which keeps them cheap on large clusters.
    pairs = [(i, j) for i in range(len(slots)) if len(nodes[i]) > 1
             for j in range(len(slots)) if j != i and nodes[i] & nodes[j]]
    plateau = None
    for i, j in pairs:
        for delta, new_a, new_b, trade in _exchanges(slots[i], slots[j], budget):
            if delta < 0:
                return i, j, new_a, new_b, trade
            if seen is not None and plateau is None:
                trial = frozenset([*(frozenset(s.members) for k, s in enumerate(slots) if k not in (i, j)),
                                   frozenset(new_a), frozenset(new_b)])
                if trial not in seen:
                    plateau = i, j, new_a, new_b, trade
    return plateau


def _improve_locality(slots: list[_Slot], budget: _Budget, plateau_cap: int = 0) -> list[_Slot]:
    """Local search over pairwise exchanges (see :func:`_exchanges`).

    Span-cutting exchanges first; when none is left, up to ``plateau_cap`` exchanges that keep
    the span count and reach a partition not visited before (some optima need a neutral exchange
    first, e.g. freeing a member so that it can join a spare GPU of its own node). The best
    partition seen is returned. Every exchange keeps the kept-survivor count under the current
    matching of new to old groups (only the two exchanging groups may trade matches), so the
    moves never grow.
    """
    def snapshot() -> list[_Slot]:
        return [_Slot(list(s.members), s.origin) for s in slots]

    best, best_spans = snapshot(), _total_spans(slots)
    seen = {_signature(slots)}
    plateau = 0
    while plateau <= plateau_cap:
        step = _next_exchange(slots, seen if plateau < plateau_cap else None, budget)
        if step is None:
            break
        i, j, new_a, new_b, trade = step
        slots[i].members, slots[j].members = new_a, new_b
        if trade:
            slots[i].origin, slots[j].origin = slots[j].origin, slots[i].origin
        seen.add(_signature(slots))
        spans = _total_spans(slots)
        if spans < best_spans:
            best, best_spans, plateau = snapshot(), spans, 0
        else:
            plateau += 1
    return best


def _group(members: Iterable[Member]) -> SPGroup:
    ordered = tuple(sorted(members))
    return SPGroup(members=ordered, degree=len(ordered))


def plan_groups(
    live: Mapping[str, Sequence[int]],
    *,
    num_heads: int,
    preferred_degree: int,
    previous: Plan | None = None,
    num_tokens: int | None = None,
    min_degree: int = 1,
) -> Plan:
    """Assign the live GPUs (node -> GPU ids) to SP groups; see the module docstring for the
    objective. ``min_degree``: the smallest group that can run (a model that fits in memory only
    when split that many ways); GPUs no such group can hold wait in ``Plan.idle`` (newcomers
    first, then survivors of the smallest broken groups) until newcomers let them merge. Returns
    ``previous`` itself when nothing changes."""
    members = _live_members(live)
    degrees = [d for d in valid_degrees(num_heads, preferred_degree, num_tokens) if d >= min_degree]
    if not degrees:
        raise ValueError(f"min_degree={min_degree}: no valid SP degree between it and "
                         f"preferred_degree={preferred_degree} (heads {num_heads}, tokens {num_tokens})")
    sizes = degree_profile(len(members), degrees) if 1 in degrees else floor_profile(len(members), degrees)
    idle = _choose_idle(members, previous, len(members) - sum(sizes))
    members = [m for m in members if m not in idle]
    fragments = _fragments(previous, set(members))
    best: list[_Slot] | None = None
    budget = _Budget(_EXCHANGE_CAP)
    for pairing in islice(_kept_optimal_pairings(fragments, sizes), _PAIRING_CAP):
        slots = _improve_locality(_build(members, sizes, fragments, pairing), budget)
        if best is None or _total_spans(slots) < _total_spans(best):
            best = slots
        if _total_spans(best) == len(best) or budget.left <= 0:
            break  # every group inside one node (nothing left to gain), or the work cap is spent
    assert best is not None
    slots = _improve_locality(best, _Budget(_EXCHANGE_CAP), plateau_cap=_PLATEAU_CAP)
    groups = tuple(sorted((_group(s.members) for s in slots), key=lambda g: (-g.degree, g.members)))
    if previous is not None and set(groups) == set(previous.groups) and idle == previous.idle:
        return previous
    return Plan(groups=groups, generation=0 if previous is None else previous.generation + 1, idle=idle)


def _choose_idle(members: list[Member], previous: Plan | None, count: int) -> tuple[Member, ...]:
    """The ``count`` GPUs that wait: newcomers (in no previous group) first, then survivors of
    the smallest previous groups; ties by member order."""
    if count <= 0:
        return ()
    fragment = {m: len(g.members) for g in (previous.groups if previous else ()) for m in g.members}
    order = sorted(members, key=lambda m: (m in fragment, fragment.get(m, 0), m))
    return tuple(sorted(order[:count]))
