"""Where a plan's ops sit in the DALI graph: the slots it builds for a recipe (op_bounds, read from the
planner's stages) and the rows DALI's source sends per sample (the flat ops, AugMix's chains), each
op at a fixed slot so that one graph serves every sample. Pure Python, like the planner."""
from __future__ import annotations

from dataclasses import dataclass

from .ops import KIND_ID
from .plan import STAGES, AugMixPlan, Op, SamplePlan
from .recipe import Recipe

MAX_OPS = 8  # flat op slots of a row: vflip + up to 4 auto-augment ops or 4 jitter factors + grayscale
IDENTITY_OP: Op = (KIND_ID["identity"], 0.0)


@dataclass(frozen=True)
class OpBounds:
    """What a recipe's plans can hold: `slots` flat ops at most, the first `augmix_at` of them before
    AugMix's `chains` chains of up to `depth` ops each (none: no AugMix), of `kinds` (names in id
    order, identity first). What the DALI graph builds (augment.dali)."""

    slots: int
    kinds: tuple[str, ...]
    augmix_at: int = 0
    chains: int = 0
    depth: int = 0

    @property
    def applies(self) -> bool:
        """Whether a plan within these bounds can hold any op (else the graph has no op and no conditional)."""
        return self.slots > 0 or self.chains > 0


def op_bounds(recipe: Recipe | None) -> OpBounds:
    """The most ops and the kinds the planner can draw for `recipe`, read from its stages (plan.STAGES)
    in draw order; none for None or the default recipe."""
    if recipe is None:
        return OpBounds(0, ("identity",))
    before = after = chains = depth = 0
    kinds = {"identity"}
    for stage in STAGES:
        if not stage.used(recipe):
            continue
        if stage.augmix:
            chains, depth, drawn = stage.bounds(recipe)
        else:
            count, drawn = stage.bounds(recipe)
            before, after = (before, after + count) if chains else (before + count, after)
        kinds |= drawn
    return OpBounds(before + after, tuple(sorted(kinds, key=KIND_ID.__getitem__)), before, chains, depth)


def merged_bounds(bounds: list[OpBounds]) -> OpBounds:
    """One graph for several recipes' plans (a mix's sources' own recipes): the most slots, every kind.
    AugMix's chain slots sit at a fixed place, so recipes with AugMix must agree on it: else a ValueError."""
    mixes = {(b.augmix_at, b.chains, b.depth) for b in bounds if b.chains}
    if len(mixes) > 1 or (mixes and any(not b.chains and b.slots for b in bounds)):
        raise ValueError("the DALI backend builds one op graph for all of a mix's recipes, and these place AugMix "
                         "differently (or beside a recipe without it): give the sources the same AugMix recipe, or "
                         "use backend='threads' or 'dataloader'")
    augmix_at, chains, depth = mixes.pop() if mixes else (0, 0, 0)
    kinds = sorted({k for b in bounds for k in b.kinds}, key=KIND_ID.__getitem__)
    return OpBounds(max(b.slots for b in bounds), tuple(kinds), augmix_at, chains, depth)


def placed_ops(plan: SamplePlan, bounds: OpBounds) -> list[Op]:
    """The plan's flat ops at their slots (MAX_OPS of them, identity elsewhere): those before AugMix
    from slot 0, those after it from slot bounds.augmix_at."""
    placed = [IDENTITY_OP] * MAX_OPS
    before = plan.ops[:plan.augmix_at] if plan.augmix is not None else plan.ops
    after = plan.ops[plan.augmix_at:] if plan.augmix is not None else ()
    for slot, op in [*enumerate(before), *enumerate(after, bounds.augmix_at)]:
        placed[slot] = op
    return placed


def placed_chains(mix: AugMixPlan, bounds: OpBounds) -> list[Op]:
    """AugMix's chains at their slots: chain c's ops from slot c * depth, identity-padded."""
    placed = [IDENTITY_OP] * (bounds.chains * bounds.depth)
    for c, chain in enumerate(mix.chains):
        placed[c * bounds.depth:c * bounds.depth + len(chain)] = chain
    return placed


def ops_row(ops: list[Op] | tuple[Op, ...]) -> list[float]:
    """Placed ops as 2 numbers each (kind id, parameter): what DALI's source sends; fewer than
    MAX_OPS are identity-padded to MAX_OPS."""
    row = [0.0] * (2 * max(MAX_OPS, len(ops)))
    for k, (kind, value) in enumerate(ops):
        row[2 * k], row[2 * k + 1] = float(kind), float(value)
    return row
