"""nanoverl-reasoning-gym: Reasoning Gym's procedural tasks as a data source (`data.source =
"reasoning_gym"`) and their verifiers as a reward (`reward.name = "reasoning_gym"`)."""
