"""The JetStream Engine API, implemented in-house for our Flax decoder.

A decode state holds `max_concurrent_decodes` slots (KV cache rows, length, next input token,
PRNG key, forced-token queue), sharded over the sampler mesh (slots over `data`, KV heads over
`tensor`). Slot invariant: the cache holds the slot's first `lengths` tokens; `next_token` is
the token after them, not yet in the cache. `params` is an argument of `generate`, so a weight
update is a reference swap. Programs per shape and the differences from JetStream:
docs/sampler.md.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import ModelConfig, SamplerConfig
from scalerl_jax.models.transformer import (
    KEY_AXES,
    KEY_SEQ_AXIS,
    VALUE_AXES,
    VALUE_SEQ_AXIS,
    KVCache,
    Transformer,
    cache_shapes,
    init_cache,
)
from scalerl_jax.sampler import sampling
from scalerl_jax.sampler.weight_sync import sampler_dtypes, with_dtypes


class Prefix(NamedTuple):
    """N prefilled prompts (N = 1 from `prefill`), each ready to be inserted into any number
    of slots."""

    cache: KVCache  # keys [L, N, KV, hd, T], values [L, N, KV, T, hd]; T = the bucket
    length: jax.Array  # [N] int32: prompt tokens in the cache (true_length - 1)
    last_token: jax.Array  # [N] int32: the prompt's last token, fed by the first generate step


class DecodeState(NamedTuple):
    cache: KVCache  # keys [L, B, KV, hd, S], values [L, B, KV, S, hd]
    lengths: jax.Array  # [B] int32: tokens in the cache = position of the next fed token
    next_token: jax.Array  # [B] int32
    active: jax.Array  # [B] bool: slot holds a live sequence with room in its cache
    rng: jax.Array  # [B, 2] uint32: one PRNG key per slot (its token at position p draws
    # from fold_in(key, p): a rewound slot redraws exactly what it drew there before)
    queue: jax.Array  # [B, Q] int32: forced tokens, head first
    queue_len: jax.Array  # [B] int32


class ResultTokens(NamedTuple):
    """One `generate` call's output, [K, B] for K = decode steps per call. Host-copy it once
    with `jax.device_get`."""

    tokens: jax.Array  # int32
    logprobs: jax.Array  # fp32, see sampling.py for which distribution
    forced: jax.Array  # bool: taken from the forced-token queue, not sampled
    valid: jax.Array  # bool: the slot was active at that step


# SamplerConfig fields compiled into the engine's programs and state shapes: every driver on an
# engine samples and sizes with the engine's values, so a driver's own cfg must agree on them.
COMPILED_FIELDS = (
    "max_concurrent_decodes",
    "max_prefill_length",
    "max_target_length",
    "decode_steps_per_call",
    "temperature",
    "top_p",
    "top_k",
)


class EngineError(ValueError):
    """Bad input to the engine. The message names the argument and the numbers."""


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compilations():
    """Counts XLA backend compilations (any function) while the block runs: yields a list whose
    length is the count, so it can be read during and after the block."""
    events: list = []

    def listener(event, duration, **kw):
        if event == BACKEND_COMPILE_EVENT:
            events.append(kw.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def _state_shardings(
    model_cfg: ModelConfig, mesh: Mesh, cfg: SamplerConfig, max_forced_tokens: int
) -> DecodeState:
    """The DecodeState's shardings: the KV cache and the per-slot fields."""
    b, s, q = cfg.max_concurrent_decodes, cfg.max_target_length, max_forced_tokens
    kshape, vshape = cache_shapes(model_cfg, b, s)
    slot = mesh_lib.named(mesh, "cache_batch", shape=(b,))
    slot2 = mesh_lib.named(mesh, "cache_batch", None, shape=(b, 2))
    # DecodeState and Prefix double as pytrees of shardings (where annotations say arrays).
    cache: Any = (
        mesh_lib.named(mesh, *KEY_AXES, shape=kshape),
        mesh_lib.named(mesh, *VALUE_AXES, shape=vshape),
    )
    fields: dict[str, Any] = dict(
        cache=KVCache(*cache),
        lengths=slot,
        next_token=slot,
        active=slot,
        rng=slot2,
        queue=mesh_lib.named(mesh, "cache_batch", None, shape=(b, q)),
        queue_len=slot,
    )
    return DecodeState(**fields)


class Engine:
    """Decode slots over one host-local sampler mesh for a `Transformer` of `model_cfg`."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        mesh: Mesh,
        cfg: SamplerConfig = SamplerConfig(),
        *,
        max_forced_tokens: int = 64,
        seed: int = 0,
        cache_dtype=None,
    ):
        if max_forced_tokens <= 0:
            raise EngineError(f"max_forced_tokens={max_forced_tokens} must be > 0")
        self.model_cfg, self.cfg, self._mesh = model_cfg, cfg, mesh
        self.max_forced_tokens = max_forced_tokens
        self.seed = seed
        self.cache_dtype = jnp.dtype(cache_dtype or model_cfg.compute_dtype)
        abstract = nnx.eval_shape(lambda: Transformer(model_cfg, nnx.Rngs(params=0)))
        self.graphdef, trainer_params = nnx.split(abstract)
        # Weights in the dtype the forward uses them in (SamplerConfig.weight_dtype): the
        # trainer's fp32 masters arrive as bf16, which halves the sampler's HBM for them.
        self.param_dtypes = sampler_dtypes(model_cfg, trainer_params, cfg.weight_dtype)
        self.abstract_params = with_dtypes(trainer_params, self.param_dtypes)
        self.param_shardings = mesh_lib.state_shardings(self.abstract_params, mesh)
        self._param_struct = jax.tree.structure(self.abstract_params)
        self.traces: dict[str, int] = {}  # trace (= compile) count per jitted function

        self.state_shardings = _state_shardings(model_cfg, mesh, cfg, max_forced_tokens)
        self._replicated = NamedSharding(mesh, PartitionSpec())
        self._jit_programs()

    def _jit_programs(self) -> None:
        """The jitted programs (traced and compiled on first call), with their shardings."""
        st, rep = self.state_shardings, self._replicated
        self._init = jax.jit(self._traced("init_decode_state", self._init_impl), out_shardings=st)
        self._flat_params: tuple[Any, list] = (None, [])  # (params object, its leaves): _leaves
        self._generate = jax.jit(
            self._traced("generate", self._generate_flat),
            in_shardings=(jax.tree.leaves(self.param_shardings), st),
            out_shardings=(st, rep),
            donate_argnums=(1,),
            static_argnums=(2,),
        )
        self._prefill = jax.jit(
            self._traced("prefill", self._prefill_impl),
            in_shardings=(self.param_shardings, rep, rep),
            out_shardings=self.get_prefix_destination_sharding(),
        )
        self._insert = jax.jit(
            self._traced("bulk_insert", self._insert_impl), out_shardings=st, donate_argnums=(1,)
        )
        self._set_slot = jax.jit(
            self._traced("slot_update", self._set_slot_impl), out_shardings=st, donate_argnums=(0,)
        )

    # -- JetStream properties -------------------------------------------------------------------
    @property
    def max_concurrent_decodes(self) -> int:
        return self.cfg.max_concurrent_decodes

    @property
    def max_prefill_length(self) -> int:
        return self.cfg.max_prefill_length

    @property
    def max_target_length(self) -> int:
        return self.cfg.max_target_length

    @property
    def samples_per_slot(self) -> int:
        return 1

    @property
    def decode_steps_per_call(self) -> int:
        return self.cfg.decode_steps_per_call

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    # -- JetStream methods ----------------------------------------------------------------------
    def load_params(self, params):
        """Validate params against the model's structure, shapes and dtypes and place them with
        exactly the engine's shardings and dtypes (a no-op for arrays already there), so
        `generate` never recompiles for them. Params in the model's `param_dtype` (the
        trainer's) are cast to the engine's `param_dtypes` one array at a time."""
        if jax.tree.structure(params) != self._param_struct:
            raise EngineError(
                "params tree does not match the engine's model "
                f"({self.model_cfg.name}): got {jax.tree.structure(params)}"
            )
        trainer_dtype = jnp.dtype(self.model_cfg.param_dtype)
        out = []
        for (path, want), got, sh in zip(
            jax.tree.leaves_with_path(self.abstract_params),
            jax.tree.leaves(params),
            jax.tree.leaves(self.param_shardings),
        ):
            if tuple(got.shape) != tuple(want.shape) or got.dtype not in (
                want.dtype,
                trainer_dtype,
            ):
                raise EngineError(
                    f"param {jax.tree_util.keystr(path)} is {got.dtype}"
                    f"{list(got.shape)}, the engine expects {want.dtype}"
                    f"{list(want.shape)} (or {trainer_dtype}, cast on load)"
                )
            x = jax.device_put(got, sh)
            out.append(x if x.dtype == want.dtype else jax.device_put(x.astype(want.dtype), sh))
        return jax.tree.unflatten(jax.tree.structure(params), out)

    def init_decode_state(self) -> DecodeState:
        return self._init()

    def get_prefix_destination_sharding(self) -> Prefix:
        kshape, vshape = cache_shapes(self.model_cfg, 1, 1)
        # The prefix's rows (its batch axis) are not split over the slots' axis.
        k = mesh_lib.named(self._mesh, KEY_AXES[0], None, *KEY_AXES[2:], shape=kshape)
        v = mesh_lib.named(self._mesh, VALUE_AXES[0], None, *VALUE_AXES[2:], shape=vshape)
        return Prefix(KVCache(k, v), self._replicated, self._replicated)  # type: ignore[arg-type]

    def prefill(self, params, padded_tokens, true_length: int) -> Prefix:
        """padded_tokens: [T] int (T <= max_prefill_length, one compile per T: pad to buckets);
        true_length: the number of real tokens, in [1, T]."""
        if np.ndim(padded_tokens) != 1:
            raise EngineError(
                f"prefill: padded_tokens must be 1-D, got shape {np.shape(padded_tokens)}"
            )
        return self.prefill_batch(params, np.asarray(padded_tokens)[None], [true_length])

    def prefill_batch(
        self, params, padded_tokens, true_lengths: Sequence[int] | np.ndarray
    ) -> Prefix:
        """N prompts padded to one length in one forward pass -> a Prefix whose row n is
        prompt n. padded_tokens: [N, T] int (one compile per (N, T): pad N and T to buckets);
        true_lengths: [N] numbers of real tokens, each in [1, T]."""
        if np.ndim(padded_tokens) != 2:
            raise EngineError(
                f"prefill_batch: padded_tokens must be [N, T], got shape {np.shape(padded_tokens)}"
            )
        n, t = (int(x) for x in np.shape(padded_tokens))
        if t > self.max_prefill_length:
            raise EngineError(
                f"prefill: padded length {t} > max_prefill_length={self.max_prefill_length}"
            )
        lengths = np.asarray(true_lengths, np.int64).reshape(-1)
        if len(lengths) != n:
            raise EngineError(f"prefill_batch: {len(lengths)} true_lengths for {n} rows")
        bad = [int(x) for x in lengths if not 1 <= x <= t]
        if bad:
            raise EngineError(f"prefill: true_length={bad[0]} must be in [1, {t}]")
        return self._prefill(
            params, jnp.asarray(padded_tokens, jnp.int32), jnp.asarray(lengths, jnp.int32)
        )

    def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
        return self.bulk_insert(prefix, decode_state, [slot])

    def bulk_insert(
        self,
        prefix: Prefix,
        decode_state: DecodeState,
        slots: Sequence[int],
        keys=None,
        rows: Optional[Sequence[int]] = None,
    ) -> DecodeState:
        """Copy prefixes into slots (the G samples of a group share one prefill): slots[i] gets
        prefix row rows[i] (default: row 0 for every slot). The slots are written one after
        another in place; one compile per prefix shape.

        keys: optional [len(slots), 2] uint32 PRNG keys, one per slot. A sample seeded by its
        own key draws the same tokens whichever slot it lands in and whatever ran before it
        there, which makes sampling reproducible under continuous batching. Without keys the
        slots keep the key stream they had."""
        b = self.max_concurrent_decodes
        slots = [int(s) for s in slots]
        if not slots or len(set(slots)) != len(slots) or not all(0 <= s < b for s in slots):
            raise EngineError(
                f"bulk_insert: slots={slots} must be distinct, non-empty and in [0, {b})"
            )
        n = int(prefix.length.shape[0])
        rows = [0] * len(slots) if rows is None else [int(r) for r in rows]
        if len(rows) != len(slots) or not all(0 <= r < n for r in rows):
            raise EngineError(
                f"bulk_insert: rows={rows} must give one row in [0, {n}) per slot "
                f"({len(slots)} slots)"
            )
        padded = np.zeros((2, b), np.int32)  # fixed size: one compile per prefix shape
        padded[:, : len(slots)] = slots, rows
        new_keys = np.zeros((b, 2), np.uint32)
        if keys is not None:
            keys = np.asarray(keys, np.uint32)
            if keys.shape != (len(slots), 2):
                raise EngineError(
                    f"bulk_insert: keys have shape {keys.shape}, expected ({len(slots)}, 2)"
                )
            new_keys[: len(slots)] = keys
        return self._insert(
            prefix,
            decode_state,
            jnp.asarray(padded),
            jnp.int32(len(slots)),
            jnp.asarray(new_keys),
            jnp.asarray(keys is not None),
        )

    @property
    def cache_windows(self) -> list[int]:
        """The attention windows `generate` compiles for: quarters of max_target_length."""
        s = self.max_target_length
        return sorted({max(1, -(-s * i // 4)) for i in range(1, 5)})

    def generate(self, params, decode_state: DecodeState, max_length: Optional[int] = None):
        """`decode_steps_per_call` decode steps for all slots -> (decode_state, ResultTokens).

        max_length: optional promise that every ACTIVE slot's length (cached tokens) is at most
        this. The steps then attend over only the smallest of `cache_windows`
        holding max_length + decode_steps_per_call entries instead of the whole cache: the same
        result, since entries past a slot's length are masked anyway, at a cost that follows the
        filled length (one compile per window). Inactive slots may write garbage into their
        rows; those are rewritten by the next insert before anything reads them."""
        window = self.max_target_length
        if max_length is not None:
            need = int(max_length) + self.decode_steps_per_call
            window = next((w for w in self.cache_windows if w >= need), window)
        return self._generate(self._leaves(params), decode_state, window)

    def precompile(
        self, params, prefill_lengths: Sequence[int], batched: Sequence[tuple[int, int]] = ()
    ) -> list[str]:
        """Compile every program a driver calls, by running each once on a scratch decode
        state: `generate` for every cache window, `prefill` and `bulk_insert` for every padded
        prompt length in `prefill_lengths` (the driver's buckets), `prefill_batch` and
        `bulk_insert` for every (rows, length) in `batched`, the slot update and the state
        init. Otherwise each first use compiles in the middle of a run (seconds per program on
        a CPU, minutes for a large model on an accelerator), stalling every slot. `params` must
        come from `load_params` (the shardings the programs are compiled for). Returns the names
        of the functions traced here, one entry per new program (empty when all were
        compiled)."""
        before = dict(self.traces)
        state = self.init_decode_state()
        shapes = {(1, int(t)) for t in prefill_lengths} | {(int(n), int(t)) for n, t in batched}
        for n, t in sorted(shapes):
            prefix = self.prefill_batch(params, np.zeros((n, t), np.int32), [1] * n)
            state = self.bulk_insert(prefix, state, [0], keys=np.zeros((1, 2), np.uint32))
        state = self.free_resource(state, 0)
        for w in self.cache_windows:
            state, res = self._generate(self._leaves(params), state, w)
        jax.block_until_ready(res)
        return [name for name, n in self.traces.items() for _ in range(n - before.get(name, 0))]

    def _leaves(self, params) -> list:
        """The leaves of `params`, flattened once per params object: flattening the nnx state's
        Variables in Python on every call took ~5% of a small model's decode step on CPU.
        Params are not changed in place (a new version is a new object: `load_params`, weight
        sync), so the object stands for its contents; holding it keeps its id from being
        reused."""
        if self._flat_params[0] is not params:
            self._flat_params = (params, jax.tree.leaves(params))
        return self._flat_params[1]

    def free_resource(self, decode_state: DecodeState, slot: int) -> DecodeState:
        """Deactivate a slot; its cache rows are simply overwritten by the next insert."""
        return self._slot_update(decode_state, slot, active=False)

    # -- slot operations for the driver ---------------------------------------------------------
    def force_tokens(self, decode_state: DecodeState, slot: int, tokens) -> DecodeState:
        """Replace the slot's forced-token queue: the next len(tokens) steps emit these tokens
        (flagged forced) and feed them back, so the KV cache is exactly that of the sequence."""
        tokens = np.asarray(tokens, np.int32).reshape(-1)
        if not 0 < len(tokens) <= self.max_forced_tokens:
            raise EngineError(
                f"force_tokens: {len(tokens)} tokens; must be in "
                f"[1, max_forced_tokens={self.max_forced_tokens}]"
            )
        queue = np.zeros((self.max_forced_tokens,), np.int32)
        queue[: len(tokens)] = tokens
        return self._slot_update(decode_state, slot, queue=queue, queue_len=len(tokens))

    def rewind(
        self, decode_state: DecodeState, slot: int, length: int, next_token: int
    ) -> DecodeState:
        """Put a live slot back at `length` cached tokens with `next_token` as the next input."""
        if not 0 <= length < self.max_target_length:
            raise EngineError(
                f"rewind: length={length} must be in [0, max_target_length="
                f"{self.max_target_length})"
            )
        return self._slot_update(
            decode_state, slot, active=True, length=length, next_token=next_token
        )

    def _slot_update(
        self, state, slot, *, active=None, length=None, next_token=None, queue=None, queue_len=None
    ):
        if not 0 <= int(slot) < self.max_concurrent_decodes:
            raise EngineError(f"slot={slot} not in [0, {self.max_concurrent_decodes})")
        # One compiled program for every kind of slot update: absent fields keep their value.
        q = self.max_forced_tokens
        args = dict(
            set_active=active is not None,
            active=bool(active),
            set_length=length is not None,
            length=int(length or 0),
            next_token=int(next_token or 0),
            set_queue=queue is not None,
            queue=np.zeros((q,), np.int32) if queue is None else queue,
            queue_len=int(queue_len or 0),
        )
        return self._set_slot(state, jnp.int32(slot), {k: jnp.asarray(v) for k, v in args.items()})

    # -- jitted implementations -----------------------------------------------------------------
    def _traced(self, name, fn):
        @functools.wraps(fn)
        def wrapper(*args):
            self.traces[name] = self.traces.get(name, 0) + 1  # runs only when jax traces
            return fn(*args)

        return wrapper

    def _init_impl(self):
        b, q = self.max_concurrent_decodes, self.max_forced_tokens
        zeros = jnp.zeros((b,), jnp.int32)
        return DecodeState(
            cache=init_cache(self.model_cfg, b, self.max_target_length, self.cache_dtype),
            lengths=zeros,
            next_token=zeros,
            active=jnp.zeros((b,), bool),
            rng=jax.random.split(jax.random.PRNGKey(self.seed), b),
            queue=jnp.zeros((b, q), jnp.int32),
            queue_len=zeros,
        )

    def _prefill_impl(self, params, tokens, true_lengths):
        model = nnx.merge(self.graphdef, params)
        n, t = tokens.shape
        cache = init_cache(self.model_cfg, n, t, self.cache_dtype)
        # Padding past true_length - 1 writes garbage KV there; a slot never reads a cache entry
        # beyond its length before overwriting it, so no masking is needed.
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (n, t))
        _, cache = model.decode(tokens, positions, cache)
        last = true_lengths - 1
        return Prefix(cache, last, jnp.take_along_axis(tokens, last[:, None], axis=1)[:, 0])

    def _insert_impl(self, prefix, state, slots_rows, count, keys, set_keys):
        # One slot at a time, in place: a scatter of the prefix broadcast to all slots would
        # materialise [slots, T, KV, hd] per layer (gigabytes at 256 slots x 2k tokens).
        def put(i, st):
            slot, row = slots_rows[0, i], slots_rows[1, i]

            def rows(dst, src):  # [L, slots or rows, ...]: axis 1 picks the row
                src = jax.lax.dynamic_index_in_dim(src, row, 1, keepdims=False)
                return jax.lax.dynamic_update_index_in_dim(dst, src.astype(dst.dtype), slot, 1)

            return st._replace(
                cache=KVCache(rows(st.cache.k, prefix.cache.k), rows(st.cache.v, prefix.cache.v)),
                lengths=st.lengths.at[slot].set(prefix.length[row]),
                next_token=st.next_token.at[slot].set(prefix.last_token[row]),
                active=st.active.at[slot].set(True),
                queue_len=st.queue_len.at[slot].set(0),
                # Without keys, a slot's next sample gets a fresh key from the slot's last
                # (keys are per position, so keeping it would repeat its draws).
                rng=st.rng.at[slot].set(
                    jnp.where(set_keys, keys[i], jax.random.split(st.rng[slot])[0])
                ),
            )

        return jax.lax.fori_loop(0, count, put, state)

    def _set_slot_impl(self, state, slot, a):
        def upd(arr, flag, value):
            return arr.at[slot].set(jnp.where(flag, value, arr[slot]))

        return state._replace(
            active=upd(state.active, a["set_active"], a["active"]),
            lengths=upd(state.lengths, a["set_length"], a["length"]),
            next_token=upd(state.next_token, a["set_length"], a["next_token"]),
            queue=upd(state.queue, a["set_queue"], a["queue"]),
            queue_len=upd(state.queue_len, a["set_queue"], a["queue_len"]),
        )

    def _generate_flat(self, leaves, state, window):
        return self._generate_impl(jax.tree.unflatten(self._param_struct, leaves), state, window)

    def _generate_impl(self, params, state, window):
        # Two ways to attend over a window only. XLA materialises a window slice of the cache
        # for the decode dots (a window is strided in both cache layouts), so reading it in place
        # copies the window once per step and layer, while cutting it out once per call and
        # writing it back costs two copies per call: cutting wins above two steps per call.
        if window < self.max_target_length and self.decode_steps_per_call > 2:
            return self._generate_windowed(params, state, window)
        model = nnx.merge(self.graphdef, params)
        cfg, s = self.cfg, self.max_target_length

        def step(st: DecodeState, _):
            hidden, cache = model.decode(
                st.next_token[:, None], st.lengths[:, None], st.cache, window=window
            )
            logits = model.logits(hidden[:, 0])
            keys = jax.vmap(jax.random.fold_in)(st.rng, st.lengths)  # per slot and position
            valid = st.active
            forced = valid & (st.queue_len > 0)
            out, lp = sampling.sample_or_force(
                logits,
                keys,
                st.queue[:, 0],
                forced,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
            )
            lengths = st.lengths + valid.astype(jnp.int32)
            shifted = jnp.concatenate([st.queue[:, 1:], jnp.zeros_like(st.queue[:, :1])], axis=1)
            new = DecodeState(
                cache=cache,
                lengths=lengths,
                next_token=jnp.where(valid, out, st.next_token),
                active=valid & (lengths < s),
                rng=st.rng,
                queue=jnp.where(forced[:, None], shifted, st.queue),
                queue_len=st.queue_len - forced.astype(jnp.int32),
            )
            return new, ResultTokens(out, lp, forced, valid)

        return jax.lax.scan(step, state, None, length=cfg.decode_steps_per_call)

    def _generate_windowed(self, params, state, window):
        """_generate_impl on the cache's first `window` positions, cut out and written back."""
        full = state.cache

        def cut(axis):
            return lambda c: jax.lax.slice_in_dim(c, 0, window, axis=axis)

        state, res = self._generate_impl(
            params,
            state._replace(cache=KVCache(cut(KEY_SEQ_AXIS)(full.k), cut(VALUE_SEQ_AXIS)(full.v))),
            self.max_target_length,
        )

        def back(axis):
            return lambda dst, src: jax.lax.dynamic_update_slice_in_dim(dst, src, 0, axis)

        return state._replace(
            cache=KVCache(
                back(KEY_SEQ_AXIS)(full.k, state.cache.k),
                back(VALUE_SEQ_AXIS)(full.v, state.cache.v),
            )
        ), res
