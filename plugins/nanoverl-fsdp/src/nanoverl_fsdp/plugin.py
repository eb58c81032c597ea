"""Hook implementations of nanoverl-fsdp: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_workers(register):
    register("fsdp", "nanoverl_fsdp.workers:make_workers", settings="nanoverl_fsdp.settings:FSDPSettings",
             description="FSDP2-sharded transformers policy / reference / value model, one rank per torchrun process")
