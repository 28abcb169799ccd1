"""scalerl_jax: JAX-native ScaleRL.

Kept import-light on purpose: `from scalerl_jax import losses` must not pull in the sampler,
the trainer or optional dependencies.
"""

from scalerl_jax.errors import UserError

__all__ = ["UserError"]
__version__ = "0.1.0"
