"""The data source `verifiers`: the rows of the [agent.verifiers] environment's own datasets.

Training rows are its `dataset` (`env.get_dataset(n)`), validation rows its `eval_dataset`
(`env.get_eval_dataset(n)`), each formatted by verifiers as it formats them for `vf-eval`: a `prompt` of chat
messages (the environment's system prompt and few-shot messages put in), `answer`, `info`, `task`,
`example_id` and any other column, as plain dicts. The agent `verifiers` hands each row back to the
environment as its rollout input, unchanged (nanoverl_verifiers.agent). The rows are the same on every call
(the loader reshuffles them each epoch under data.shuffle).
"""

from __future__ import annotations

from typing import Any

from nanoverl_core.errors import ConfigError

from .agent import check_config as check_agent
from .loading import environment


class VerifiersSource:
    def __init__(self, agent_settings, settings) -> None:
        self.env = environment(agent_settings.env_id, agent_settings.env_args)
        self.settings = settings

    def rows(self, split: str, epoch: int) -> list[dict[str, Any]]:
        if split == "val":
            n = self.settings.val_examples
            if n == 0 or self.env.eval_dataset_source is None and self.env.eval_dataset is None:
                return []
            return self.env.get_eval_dataset(n).to_list()
        return self.env.get_dataset(self.settings.train_examples).to_list()


def make_source(config) -> VerifiersSource:
    check_config(config)
    return VerifiersSource(config.agent.settings, config.data.settings)


def check_config(config) -> None:
    """agent.name = "verifiers" names the environment; it builds, and has training rows."""
    from .settings import VerifiersSettings

    if config.agent.name != "verifiers" or not isinstance(config.agent.settings, VerifiersSettings):
        raise ConfigError("data.source = \"verifiers\" reads the rows of the [agent.verifiers] environment; set "
                          "agent.name = \"verifiers\" and agent.verifiers.env_id, or pick another data.source")
    check_agent(config)
    env = environment(config.agent.settings.env_id, config.agent.settings.env_args)
    if env.dataset_source is None and env.dataset is None:
        raise ConfigError(f"data.source = \"verifiers\": the environment {config.agent.settings.env_id!r} has no "
                          "training dataset (only an eval_dataset); give it one, or train from data.train_files")


make_source.check_config = check_config
