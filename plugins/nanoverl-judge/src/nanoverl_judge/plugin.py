"""Hook implementations of nanoverl-judge: lazy "module:attr" strings only."""

from nanoverl_core import hookimpl


@hookimpl
def register_rewards(register):
    register("judge", "nanoverl_judge.reward:judge", settings="nanoverl_judge.settings:JudgeSettings",
             description="an LLM judge behind any OpenAI-compatible URL (or a local model it serves): a rubric "
                         "template, pointwise or one call per group, cached, logged, failures counted by kind "
                         "([reward.judge] base_url, model, template, mode, fallback)")
