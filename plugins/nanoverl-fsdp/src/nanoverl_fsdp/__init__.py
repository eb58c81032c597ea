"""nanoverl-fsdp: FSDP2 (`fully_shard`) policy, reference and value workers for runs under torchrun.

Registered name: worker `fsdp`. The PPO mechanics are the core's `TorchActor` / `TorchCritic`; this
package adds what data parallelism changes: sharded modules, row sharding, cross-rank sums,
sharded, pickle-free checkpoints (per-rank safetensors) and an export to a plain transformers folder
(`python -m nanoverl_fsdp.export`). Modules import torch only when the worker is selected.
"""

__version__ = "0.4.0"
