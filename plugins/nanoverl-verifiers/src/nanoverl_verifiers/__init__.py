"""nanoverl-verifiers: environments written with the `verifiers` library (pinned 0.3.1) as the agent
`verifiers` (`agent.name = "verifiers"`): each episode is the environment's own rollout against the endpoint,
scored by its own rubric; and their datasets as the data source `verifiers` (`data.source = "verifiers"`)."""
