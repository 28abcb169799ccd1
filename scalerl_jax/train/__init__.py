"""Trainer core: state (state.py), optimizer (optim.py), batch assembly (batch.py), chunked
log-probs (logprobs.py) and the jitted train step (step.py). Import the submodules directly."""
