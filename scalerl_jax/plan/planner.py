"""The plan for a RunConfig on a TPU slice: roles, meshes, per-device batch, whether it fits.

`resolve(cfg, topology(name))` splits each host's chips between trainer and sampler, shapes the
trainer mesh (fsdp, tensor only when activations need it, micro-batches and remat until one
fits) and each host's sampler mesh (the most decode slots with the least tensor parallelism
that fits), keeping the fields the user set (`pinned`). Pure arithmetic on the config and the
topology table, so any slice's plan prints on a laptop; the memory and time formulas are in
plan/estimate.py. The search, step by step: docs/tpu.md, "How the plan is chosen".
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from scalerl_jax.config import MeshConfig, RunConfig
from scalerl_jax.plan.estimate import (
    GIB,
    Assumptions,
    Layout,
    SamplerMemory,
    StepTime,
    TrainerMemory,
    per_shard,
    rows_per_chip,
    sampler_memory,
    seq_len,
    step_time,
    trainer_memory,
)
from scalerl_jax.plan.topology import CHIPS, PlanError, Topology, slices


# ------------------------------------------------------------------------------ resolution
PLANNED = (
    "mesh.trainer_devices_per_host",
    "mesh.colocate",
    "mesh.data",
    "mesh.fsdp",
    "mesh.tensor",
    "mesh.sampler_tensor",
    "optim.micro_batches",
    "model.remat",
    "sampler.max_concurrent_decodes",
)


@dataclasses.dataclass(frozen=True)
class Plan:
    topology: Topology
    layout: Layout
    trainer: TrainerMemory
    sampler: SamplerMemory
    time: StepTime
    assumptions: Assumptions
    config: RunConfig  # the input config with the planned fields (PLANNED) filled in
    changes: tuple  # (key, old, new) of the planned fields that changed
    problems: tuple  # sentences naming the numbers; empty when the plan can run
    requested: Optional[RunConfig] = None  # the input config, before planning

    @property
    def budget(self) -> int:
        """Usable HBM bytes per chip."""
        return int(self.topology.chip.hbm_gib * GIB * (1 - self.assumptions.headroom))

    @property
    def chip_peaks(self) -> tuple[int, int]:
        """(trainer chip, sampler chip) peak bytes; one chip does both when colocated."""
        if self.layout.colocated:
            both = self.trainer.peak + self.sampler.peak
            return both, both
        return self.trainer.peak, self.sampler.peak

    @property
    def fits(self) -> bool:
        return max(self.chip_peaks) <= self.budget

    @property
    def ok(self) -> bool:
        return not self.problems


def _trainer_options(cfg: RunConfig, n: int, pinned: frozenset):
    """(mesh (data, fsdp, tensor), micro_batches, remat) for n trainer chips, cheapest first:
    no remat before remat (remat recomputes the forward), then less tensor parallelism, then
    fewer micro-batches; a micro-batch count that does not lower the rows per chip is skipped."""
    mc, pipe = cfg.mesh, cfg.pipeline
    remats = [cfg.model.remat] if "model.remat" in pinned else [False, True]
    tensors = (
        [mc.tensor]
        if "mesh.tensor" in pinned and mc.tensor != -1
        else [t for t in (1, 2, 4, 8) if n % t == 0]
    )
    data = mc.data if "mesh.data" in pinned and mc.data != -1 else 1
    micros = (
        [cfg.optim.micro_batches]
        if "optim.micro_batches" in pinned
        else range(1, pipe.prompts_per_step + 1)
    )  # whole prompts per micro-batch: M <= P
    for remat in remats:
        for t in tensors:
            if n % (data * t):
                continue
            fsdp = n // (data * t)
            if "mesh.fsdp" in pinned and mc.fsdp not in (-1, fsdp):
                continue
            last = None
            for micro in micros:
                rows = rows_per_chip(cfg, data * fsdp, micro)
                if rows != last:
                    last = rows
                    yield (data, fsdp, t), micro, remat


def _sampler_options(cfg: RunConfig, chips: int, pinned: frozenset):
    """(data, tensor, slots) of one host's replica on `chips` chips: the most slots first (the
    configured count, then halves of it down to one group: generations_per_prompt slots decode
    a whole group at once), and for each the least tensor parallelism; slots are rounded up to
    a multiple of `data`. Tensor parallelism shards the expert weights too (their `mlp` dim),
    so it is what splits an MoE model's experts over a host's chips."""
    st = cfg.mesh.sampler_tensor
    tensors = (
        [chips if st == -1 else st]
        if "mesh.sampler_tensor" in pinned
        else [t for t in range(1, chips + 1) if chips % t == 0]
    )
    fixed = "sampler.max_concurrent_decodes" in pinned
    counts = [cfg.sampler.max_concurrent_decodes]
    if not fixed:
        floor = min(counts[0], cfg.pipeline.generations_per_prompt)
        while counts[-1] // 2 >= floor:
            counts.append(counts[-1] // 2)
    seen = set()
    for want in counts:
        for t in tensors:
            if chips % t:
                continue
            data = chips // t
            slots = want if fixed else -(-want // data) * data
            if (data, t, slots) not in seen:
                seen.add((data, t, slots))
                yield data, t, slots


def _host_problems(cfg: RunConfig, topo: Topology) -> list[str]:
    from scalerl_jax.config import ConfigError
    from scalerl_jax.train.pipeline import Schedule

    try:  # the trainer's own rule: every host samples at least one prompt per step
        Schedule.from_config(cfg.pipeline, topo.hosts)
    except ConfigError as err:
        p = cfg.pipeline.prompts_per_step
        smaller = [t for t in slices() if t.chip == topo.chip and t.hosts <= p]
        other = f" (e.g. {smaller[-1].name}, {smaller[-1].hosts} hosts)" if smaller else ""
        return [
            f"{err}: set pipeline.prompts_per_step={topo.hosts} or more, or use a slice "
            f"with at most {p} hosts{other}"
        ]
    return []


def _memory_problem(
    cfg: RunConfig,
    topo: Topology,
    layout: Layout,
    tmem: TrainerMemory,
    smem: SamplerMemory,
    budget: int,
) -> str:
    g = lambda n: f"{n / GIB:.1f}"  # noqa: E731
    trainer = (
        f"params {g(tmem.params)}, optimizer {g(tmem.optimizer)}, gradients "
        f"{g(tmem.gradients)}, activations {g(tmem.activations)}, weight-sync copy "
        f"{g(tmem.weight_sync)}"
    )
    sampler = (
        f"params {g(smem.params)}, weight-sync copy {g(smem.incoming)}, KV cache {g(smem.kv_cache)}"
    )
    head = (
        f"{cfg.model.name} does not fit on {topo.name} ({g(budget)} GiB usable of "
        f"{topo.chip.hbm_gib:g} GiB per chip): "
    )
    if layout.colocated:
        return head + (
            f"each chip trains and samples and needs "
            f"{g(tmem.peak + smem.peak)} GiB (trainer: {trainer}; sampler: "
            f"{sampler}) with {layout.trainer_chips} chips"
        )
    parts = []
    if tmem.peak > budget:
        parts.append(
            f"a trainer chip needs {g(tmem.peak)} GiB ({trainer}) with "
            f"{layout.trainer_chips} trainer chips"
        )
    if smem.peak > budget:
        parts.append(
            f"a sampler chip needs {g(smem.peak)} GiB ({sampler}) with "
            f"{layout.sampler_per_host} sampler chips per host"
        )
    return head + "; ".join(parts)


def resolve(
    cfg: RunConfig, topo: Topology, pinned=frozenset(), assume: Assumptions = Assumptions()
) -> Plan:
    """The plan for `cfg` on `topo` (see the module docstring). Keys in `pinned` (from PLANNED)
    keep the config's value. A plan that cannot run has `problems`; it still holds the numbers
    of the layout that came closest (the default split with its smallest-memory options)."""
    pinned = frozenset(pinned)
    budget = int(topo.chip.hbm_gib * GIB * (1 - assume.headroom))
    problems = _host_problems(cfg, topo)
    roles = _roles(cfg, topo, pinned, problems)
    chosen, closest = _search(cfg, topo, pinned, roles, budget)
    if closest is None:
        raise PlanError(
            f"no trainer / sampler mesh on {topo.describe()} matches the pinned "
            f"settings (mesh: {dataclasses.asdict(cfg.mesh)})"
        )
    layout, tmem, smem = chosen or closest
    if chosen is None:
        problems.append(_memory_problem(cfg, topo, layout, tmem, smem, budget))
    resolved = _apply(cfg, layout)
    changes = tuple(
        (key, _get(cfg, key), _get(resolved, key))
        for key in PLANNED
        if _get(cfg, key) != _get(resolved, key)
    )
    return Plan(
        topo,
        layout,
        tmem,
        smem,
        step_time(resolved, topo, layout, smem, assume),
        assume,
        resolved,
        changes,
        tuple(problems),
        cfg,
    )


def _roles(cfg: RunConfig, topo: Topology, pinned, problems: list) -> list[tuple[int, bool]]:
    """(trainer chips per host, colocated) in the order they are tried; a pinned split that
    cannot be adds to `problems` and falls back to the default one."""
    c = topo.chips_per_host
    colocate = cfg.mesh.colocate if "mesh.colocate" in pinned else c == 1
    if colocate:
        splits = [c]
    elif "mesh.trainer_devices_per_host" in pinned and cfg.mesh.trainer_devices_per_host:
        splits = [cfg.mesh.trainer_devices_per_host]
    else:
        splits = list(range(max(1, c // 4), c))
    if not colocate and (c < 2 or not all(0 < k < c for k in splits)):
        problems.append(
            f"mesh.trainer_devices_per_host={splits[0]} must be in [1, {c - 1}] with "
            f"{c} chips per host (the rest sample); or colocate"
        )
        splits = [max(1, c // 4)] if c >= 2 else [c]
        colocate = colocate or c < 2
    roles = [(k, colocate) for k in splits]
    if not colocate and not pinned & {"mesh.colocate", "mesh.trainer_devices_per_host"}:
        # The last resort: every chip trains and samples. A host's sampler replica then spans
        # all its chips, which a model too large for the non-trainer chips needs (PipelineRL
        # loses its overlap: the step is trainer + sampler time).
        roles.append((c, True))
    return roles


def _evaluator(cfg: RunConfig, topo: Topology):
    """evaluate(trainer chips per host, colocated, trainer option, sampler option) -> (layout,
    trainer memory, sampler memory), memoised: the search asks for the same options often."""
    c = topo.chips_per_host

    @functools.lru_cache(maxsize=None)
    def tmemory(k, tr):
        mesh, micro, remat = tr
        return trainer_memory(cfg, dict(zip(("data", "fsdp", "tensor"), mesh)), micro, remat, k)

    @functools.lru_cache(maxsize=None)
    def smemory(sa):
        return sampler_memory(cfg, *sa)

    def evaluate(k, co, tr, sa):
        mesh, micro, remat = tr
        data, tensor, slots = sa
        layout = Layout(topo.hosts, c, k, co, mesh, (data, tensor), micro, remat, slots)
        return layout, tmemory(k, tr), smemory(sa)

    return evaluate


def _search(cfg: RunConfig, topo: Topology, pinned, roles, budget: int):
    """(the first layout that fits in the order of `roles` and the options, or None; the
    closest one), each as (layout, trainer memory, sampler memory)."""
    evaluate = _evaluator(cfg, topo)
    c = topo.chips_per_host
    chosen = closest = None
    for k, co in roles:
        trs = list(_trainer_options(cfg, (c if co else k) * topo.hosts, pinned))
        sas = list(_sampler_options(cfg, c if co else c - k, pinned))
        if not trs or not sas:
            continue
        # For the numbers of a plan that cannot run: the roles whose smallest-memory options
        # come closest to the budget.
        least = evaluate(
            k,
            co,
            min(trs, key=lambda o: evaluate(k, co, o, sas[0])[1].peak),
            min(sas, key=lambda o: evaluate(k, co, trs[0], o)[2].peak),
        )
        if closest is None or _worst(least, co) < _worst(closest, closest[0].colocated):
            closest = least
        if co:
            tms = [evaluate(k, co, tr, sas[0])[1].peak for tr in trs]
            sms = [evaluate(k, co, trs[0], sa)[2].peak for sa in sas]
            chosen = next(
                (
                    evaluate(k, co, tr, sa)
                    for (tr, tm) in zip(trs, tms)
                    for (sa, sm) in zip(sas, sms)
                    if tm + sm <= budget
                ),
                None,
            )
        else:
            tr = next((o for o in trs if evaluate(k, co, o, sas[0])[1].peak <= budget), None)
            sa = next((o for o in sas if evaluate(k, co, trs[0], o)[2].peak <= budget), None)
            chosen = evaluate(k, co, tr, sa) if tr and sa else None
        if chosen:
            break
    return chosen, closest


def _worst(evaluated, colocated: bool) -> int:
    """The larger per-chip peak of (layout, trainer memory, sampler memory)."""
    _, tmem, smem = evaluated
    return tmem.peak + smem.peak if colocated else max(tmem.peak, smem.peak)


def _get(cfg: RunConfig, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _apply(cfg: RunConfig, layout: Layout) -> RunConfig:
    data, fsdp, tensor = layout.trainer_mesh
    mesh = MeshConfig(
        trainer_devices_per_host=None if layout.colocated else layout.trainer_per_host,
        colocate=layout.colocated,
        data=data,
        fsdp=fsdp,
        tensor=tensor,
        sampler_tensor=layout.sampler_mesh[1],
    )
    return dataclasses.replace(
        cfg,
        mesh=mesh,
        optim=dataclasses.replace(cfg.optim, micro_batches=layout.micro_batches),
        model=cfg.model.replace(remat=layout.remat),
        sampler=dataclasses.replace(cfg.sampler, max_concurrent_decodes=layout.slots),
    )


def smallest_fitting(
    cfg: RunConfig, pinned=frozenset(), assume: Assumptions = Assumptions()
) -> list[str]:
    """Per generation, the smallest slice whose plan fits in memory (for error messages), with
    the prompts per step it needs when it has more hosts than the config's prompts."""
    out = []
    for chip in CHIPS:
        for topo in (t for t in slices() if t.chip == chip):
            try:
                if resolve(cfg, topo, pinned, assume).fits:
                    short = topo.hosts > cfg.pipeline.prompts_per_step
                    out.append(
                        topo.name
                        + (
                            f" (with pipeline.prompts_per_step={topo.hosts}: one prompt per host)"
                            if short
                            else ""
                        )
                    )
                    break
            except PlanError:
                continue
    return out


def explain(plan: Plan, pinned=frozenset()) -> str:
    """One line: why the plan cannot run, and what would."""
    text = "; ".join(plan.problems)
    if not plan.fits:
        # From the requested config: the failed plan's own choices (its reduced slot count,
        # its micro-batches) are no constraint on another slice.
        fits = smallest_fitting(plan.requested or plan.config, pinned, plan.assumptions)
        cfg = plan.config
        hints = ["model.param_dtype=bfloat16"] if cfg.model.param_dtype == "float32" else []
        hints += [
            f"fewer decode slots (sampler.max_concurrent_decodes="
            f"{cfg.sampler.max_concurrent_decodes} now)",
            "a smaller --model",
        ]
        text += (
            f". Smallest slices that fit: {', '.join(fits)}"
            if fits
            else f". No slice in the table fits it as configured; try {', '.join(hints)}"
        )
    return text


# ----------------------------------------------------------------------------- the printout
def _gib(n: float) -> str:
    return f"{n / GIB:9.2f}"


def _flop(x: float) -> str:
    for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{x / 1e6:.1f} MFLOP"


def _secs(t: float) -> str:
    return f"{t:.1f} s" if t >= 1 else f"{t * 1e3:.1f} ms" if t >= 1e-3 else f"{t * 1e6:.0f} us"


def _n(k: int, what: str) -> str:
    return f"{k} {what}" + ("" if k == 1 else "es" if what.endswith("h") else "s")


def _host_roles(lay) -> str:
    """What each host's chips do, e.g. 'chips 0-3 train, chips 4-7 sample'."""
    k, c = lay.trainer_per_host, lay.chips_per_host
    if lay.colocated:
        roles = "its chip trains and samples" if c == 1 else f"all {c} chips train and sample"
        roles += " (colocated)"
    else:
        roles = (
            ("chip 0" if k == 1 else f"chips 0-{k - 1}")
            + " train, "
            + (f"chip {k}" if k == c - 1 else f"chips {k}-{c - 1}")
            + " sample"
        )
    return roles


def _layout_lines(plan: Plan) -> list[str]:
    cfg, topo, lay, a, chip = (
        plan.config,
        plan.topology,
        plan.layout,
        plan.assumptions,
        plan.topology.chip,
    )
    m, pipe = cfg.model, cfg.pipeline
    rows = pipe.prompts_per_step * pipe.generations_per_prompt
    per_chip_rows = rows_per_chip(cfg, lay.trainer_mesh[0] * lay.trainer_mesh[1], lay.micro_batches)
    sdata, stensor = lay.sampler_mesh
    roles = _host_roles(lay)
    return [
        f"plan for {m.name} ({m.num_params() / 1e9:.2f}B params in {m.param_dtype}, "
        f"{m.compute_dtype} compute) on {topo.name}",
        f"  slice     {_n(topo.hosts, 'host')} x {chip.generation} chips = "
        f"{_n(topo.chips, 'chip')}; per chip {chip.hbm_gib:g} GiB HBM ({plan.budget / GIB:.1f} "
        f"usable, {a.headroom:.0%} left to XLA), {chip.bf16_tflops:g} TFLOP/s bf16, "
        f"{chip.hbm_gbps:g} GB/s",
        f"  roles     every host: {roles}",
        f"  trainer   {_n(lay.trainer_chips, 'chip')}, mesh data={lay.trainer_mesh[0]} "
        f"fsdp={lay.trainer_mesh[1]} tensor={lay.trainer_mesh[2]}; {rows} rows per step "
        f"({pipe.prompts_per_step} prompts x {pipe.generations_per_prompt}) in "
        f"{_n(lay.micro_batches, 'micro-batch')}: {_n(per_chip_rows, 'row')} per chip per "
        f"micro-batch, up to {seq_len(cfg)} tokens each; remat {'on' if lay.remat else 'off'}",
        f"  sampler   one replica per host on {_n(lay.sampler_per_host, 'chip')}, mesh "
        f"data={sdata} tensor={stensor}; {lay.slots} decode slots ({per_shard(lay.slots, sdata)} "
        f"per chip), KV cache length {cfg.sampler.max_target_length}; weights in "
        + (
            "the dtype of use (fp32 norms, router"
            + (", LM head" if m.fp32_head else "")
            + f"; {m.compute_dtype} the rest)"
            if cfg.sampler.weight_dtype == "compute"
            else m.param_dtype
        ),
    ]


def _memory_lines(plan: Plan) -> list[str]:
    lay, tm, sm = plan.layout, plan.trainer, plan.sampler
    tp, sp = plan.chip_peaks
    verdict = lambda peak: "fits" if peak <= plan.budget else "DOES NOT FIT"  # noqa: E731
    label = lambda text: f"    {text:<30}"  # noqa: E731
    dash = f"{'-':>9}"
    return [
        f"  memory per chip, GiB{'':14}trainer   sampler",
        label("params") + _gib(tm.params) + _gib(sm.params),
        label("optimizer (AdamW mu, nu)") + _gib(tm.optimizer) + dash,
        label("gradients (fp32 acc + grads)") + _gib(tm.gradients) + dash,
        label(f"activations (remat {'on' if lay.remat else 'off'})")
        + _gib(tm.activations)
        + dash
        + f"   remat off {tm.activations_no_remat / GIB:.2f}, on "
        f"{tm.activations_remat / GIB:.2f}",
        label("weight-sync copy") + _gib(tm.weight_sync) + _gib(sm.incoming),
        label("KV cache") + dash + _gib(sm.kv_cache),
        label("working set") + dash + _gib(sm.work),
        label("peak" + (" (colocated: the sum)" if lay.colocated else ""))
        + _gib(tp)
        + _gib(sp)
        + f"   trainer {verdict(tp)}, sampler {verdict(sp)}",
    ]


def _compute_lines(plan: Plan) -> list[str]:
    lay, st, a = plan.layout, plan.time, plan.assumptions
    p_len, c_len = a.lengths(plan.config)
    return [
        f"  compute per step, assuming mean prompt {p_len} + completion {c_len} tokens and "
        f"{a.mfu:.0%} MFU",
        f"    trainer   {_flop(st.trainer_flops)} (6N + attention) -> {_secs(st.trainer_s)} "
        f"on {_n(lay.trainer_chips, 'chip')}",
        f"    sampler   {_flop(st.sampler_flops)} (2N + attention) -> prefill "
        f"{_secs(st.prefill_s)} + {st.decode_steps:,.0f} decode steps x "
        f"{_secs(st.decode_step_s)} = {_secs(st.sampler_s)}; decode is {st.decode_bound}-"
        f"bound ({st.decode_bytes / GIB:.1f} GiB read per chip per step)",
        f"    step      ~{_secs(st.step_s)}, "
        + ("trainer and sampler overlap (PipelineRL), " if st.overlap else "trainer + sampler, ")
        + ("sampler" if st.sampler_s >= st.trainer_s else "trainer")
        + "-bound",
    ]


def format_plan(plan: Plan) -> str:
    lines = _layout_lines(plan) + _memory_lines(plan) + _compute_lines(plan)
    if plan.changes:
        lines.append(
            "  planned   "
            + ", ".join(f"{k}={new}" for k, _, new in plan.changes)
            + " (set any of them as KEY=VALUE to pin it)"
        )
    lines += [f"  PROBLEM   {text}" for text in plan.problems]
    return "\n".join(lines)
