"""nanoverl-judge: the `judge` reward, an LLM judge behind any OpenAI-compatible URL.

    settings.py  JudgeSettings ([reward.judge]) and check_config (the dry-run checks)
    prompts.py   the rubric template, the exact request, and reading a score out of a reply
    client.py    the HTTP calls: concurrency, timeout, retries, a failure kind for each way a call fails
    store.py     the request cache (sqlite, keyed by the request's sha256) and the request/reply log
    reward.py    `judge`, the batched reward: groups, cache, calls, scores, fallback
    server.py    a local Hugging Face model behind /v1/chat/completions on 127.0.0.1 (`serve`)
"""

__version__ = "0.4.0"
