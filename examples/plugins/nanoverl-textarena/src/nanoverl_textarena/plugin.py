"""Hook implementations of nanoverl-textarena: lazy "module:attr" strings, so listing plugins imports no textarena."""

from nanoverl_core import hookimpl


@hookimpl
def register_environments(register):
    register("textarena", "nanoverl_textarena.game:textarena_episode",
             settings="nanoverl_textarena.settings:TextArenaSettings",
             description="a textarena single-player game per episode (the row's extra_info env_id and seed)")
