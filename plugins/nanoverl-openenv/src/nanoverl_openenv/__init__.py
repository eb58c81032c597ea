"""nanoverl-openenv: environments written with OpenEnv's `Environment` API as nanoverl's multi-turn
environment `openenv` (`environment.name = "openenv"`), run in-process or through OpenEnv's own server."""
