"""Hook implementations only: lazy strings, so listing plugins imports neither openenv nor torch."""

from nanoverl_core import hookimpl


@hookimpl
def register_environments(register):
    register("openenv", "nanoverl_openenv.episode:openenv_episode", settings="nanoverl_openenv.settings:OpenEnvSettings",
             description="an OpenEnv environment per episode: its class in-process, or a session on its server "
                         "([environment.openenv] env, url or app)")
