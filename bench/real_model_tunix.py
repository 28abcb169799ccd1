"""tunix's side of bench/real_model.py: a worker run with tunix's own virtualenv.

    /tmp/tunix-venv/bin/python bench/real_model_tunix.py --checkpoint DIR --variant float32
    (requests on stdin, as bench/real_model.py's workers; that script starts it)

Only tunix's public API is used: `tunix.models.llama3` (ModelConfig, the safetensors loader),
`tunix.generate.sampler.Sampler`, and the GRPO policy update `RLCluster.update_actor` set up by a
`GRPOLearner` (beta 0: no KL term and no reference model, as our CISPO step; the optimizer is
the same global-norm clipping + AdamW as the other sides). The workload (prompts, rows) comes
from bench/real_model.py, which imports nothing outside the standard library and numpy at the
top, so both virtualenvs build identical inputs.

`--variant bfloat16` loads the weights as bf16 (tunix's Llama-3 computes in the weights' dtype:
it has no separate compute dtype, so its AdamW state is bf16 too).
"""

from __future__ import annotations

import argparse

import numpy as np

from real_model import read_shape, serve, timed, workload_prompts, workload_rows  # beside this


class IdTokenizer:
    """Text = space-separated ids; no BOS; pad 0; EOS = vocab (never sampled)."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def encode(self, text, **_):
        return [int(t) for t in str(text).split()]

    def decode(self, ids, **_):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self):
        return self.vocab

    def pad_id(self):
        return 0


class TunixWorker:
    def __init__(self, args):
        import jax
        import jax.numpy as jnp
        from tunix.models.llama3 import model as llama3
        from tunix.models.llama3 import params as llama3_params

        self.jax, self.args = jax, args
        s = self.shape = read_shape(args.checkpoint)
        self.cfg = llama3.ModelConfig(
            num_layers=s["layers"],
            vocab_size=s["vocab"],
            embed_dim=s["hidden"],
            hidden_dim=s["mlp"],
            num_heads=s["heads"],
            head_dim=s["head_dim"],
            num_kv_heads=s["kv_heads"],
            rope_theta=int(s["rope_theta"]),
            norm_eps=s["norm_eps"],
            weight_tying=s["tied"],
        )
        self.dtype = jnp.bfloat16 if args.variant == "bfloat16" else jnp.float32
        self.model = llama3_params.create_model_from_safe_tensors(
            args.checkpoint, self.cfg, mesh=None, dtype=self.dtype
        )
        self.tok = IdTokenizer(s["vocab"])
        self.samplers: dict = {}
        self.cluster = None

    def info(self, req) -> dict:
        from importlib import metadata
        from flax import nnx

        params = nnx.state(self.model, nnx.Param)
        return dict(
            side="tunix",
            variant=self.args.variant,
            params=int(sum(x.size for x in self.jax.tree.leaves(params))),
            param_dtypes=sorted({str(x.dtype) for x in self.jax.tree.leaves(params)}),
            tunix=metadata.version("google-tunix"),
            jax=self.jax.__version__,
        )

    def peak(self, req) -> dict:
        return {}

    def decode(self, req) -> dict:
        from tunix.generate import sampler as sampler_lib

        a, slots = self.args, req["slots"]
        if slots not in self.samplers:
            self.samplers[slots] = sampler_lib.Sampler(
                transformer=self.model,
                tokenizer=self.tok,
                cache_config=sampler_lib.CacheConfig(
                    cache_size=a.prompt + a.new,
                    num_layers=self.cfg.num_layers,
                    num_kv_heads=self.cfg.num_kv_heads,
                    head_dim=self.cfg.head_dim,
                ),
            )
        ids = workload_prompts(req["seed"], slots, a.prompt, self.shape["vocab"])
        texts = [" ".join(map(str, row)) for row in ids]

        def run():
            # top_p 1.0 is tunix's sampling mode (None would be greedy): no cut at 1.0.
            return self.samplers[slots](
                input_strings=texts,
                max_generation_steps=a.new,
                max_prompt_length=a.prompt,
                echo=False,
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                eos_tokens=[self.tok.eos_id()],
                seed=req["seed"],
            )

        out, wall, cpu = timed(run)
        return dict(tokens=int(sum(len(t) for t in out.tokens)), wall_s=wall, cpu_s=cpu)

    def _build_cluster(self):
        import optax
        from tunix.rl import rl_cluster as rl_cluster_lib
        from tunix.rl.grpo import grpo_learner
        from tunix.rl.rollout import base_rollout

        a = self.args
        devs = self.jax.devices()[:1]
        mesh = self.jax.sharding.Mesh(np.array(devs).reshape(1, 1), ("fsdp", "tp"))
        optimizer = optax.chain(
            optax.clip_by_global_norm(1.0),
            optax.adamw(1e-6, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01),
        )
        self.cluster = rl_cluster_lib.RLCluster(
            actor=self.model,
            reference=None,
            tokenizer=self.tok,
            cluster_config=rl_cluster_lib.ClusterConfig(
                role_to_mesh={
                    rl_cluster_lib.Role.ACTOR: mesh,
                    rl_cluster_lib.Role.REFERENCE: mesh,
                    rl_cluster_lib.Role.ROLLOUT: mesh,
                },
                rollout_engine="vanilla",
                offload_to_cpu=False,
                training_config=rl_cluster_lib.RLTrainingConfig(
                    actor_optimizer=optimizer, eval_every_n_steps=10**9, max_steps=10**6
                ),
                rollout_config=base_rollout.RolloutConfig(
                    max_tokens_to_generate=a.new,
                    max_prompt_length=a.prompt,
                    kv_cache_size=a.prompt + a.new,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=None,
                    eos_tokens=[self.tok.eos_id()],
                ),
            ),
        )
        self.learner = grpo_learner.GRPOLearner(
            rl_cluster=self.cluster,
            reward_fns=lambda prompts, completions, **_: [0.0] * len(completions),
            algo_config=grpo_learner.GRPOConfig(
                num_generations=2, num_iterations=1, beta=0.0, epsilon=0.2, loss_algo="grpo"
            ),
        )

    def train(self, req) -> dict:
        import jax.numpy as jnp
        from flax import nnx
        from tunix.rl.grpo import grpo_learner

        a = self.args
        if self.cluster is None:
            self._build_cluster()
        w = workload_rows(req["seed"], a.rows, a.prompt, a.new, self.shape["vocab"])
        prompt_ids = jnp.asarray(w["tokens"][:, : a.prompt])
        completion_ids = jnp.asarray(w["tokens"][:, a.prompt :])
        example = grpo_learner.TrainExample(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_ids != self.tok.pad_id(),
            completion_ids=completion_ids,
            completion_mask=completion_ids != self.tok.pad_id(),
            ref_per_token_logps=None,
            advantages=jnp.asarray(w["advantages"]),
            old_per_token_logps=None,
        )
        trainer = self.cluster.actor_trainer

        def run():
            self.cluster.update_actor([example], None)
            self.jax.block_until_ready(nnx.state(trainer.model, nnx.Param))

        _, wall, cpu = timed(run)
        return dict(tokens=int(w["tokens"].size), wall_s=wall, cpu_s=cpu)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--variant", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--peak-n", type=int, default=2048)
    args = p.parse_args()
    w = TunixWorker(args)
    serve({"info": w.info, "peak": w.peak, "decode": w.decode, "train": w.train})


if __name__ == "__main__":
    main()
