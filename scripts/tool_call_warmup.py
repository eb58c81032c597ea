"""Teach a chat model the endpoint's tool-call format on tools that are not the calculator: a short supervised
warm-up, so that a calculator offered as a JSON schema alone reaches a model that calls *some* tool.

    .venv-vllm/bin/python scripts/tool_call_warmup.py models/SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2-toolcall

SmolLM2-135M-Instruct writes no `<tool_call>` from a schema (docs/results.md, "An agent and the calculator
offered as a schema alone"), so GRPO through an agent has nothing to reinforce. This script fine-tunes it on
synthetic conversations with six kinds of tool, none of them arithmetic: reverse a word, count a letter in it,
a country's capital, a city's weather, an English word in French, a text in capitals. Each conversation offers
the right tool and up to two others (names, parameter names and wording varied), then: the question, the call,
the tool's result, the answer (the result itself). It is rendered exactly as the agent endpoint renders an
episode for a template without a tool format: the first prompt by `render_chat` (the `<tool_call>` system
block), the model's turns as the ids it would sample (each ended by the stop token), the tool's message by
`render_answer` as it follows a turn. The loss is on the model's turns only. No prompt holds a worked example,
a calculator or a number question.

The model is loaded and saved the way `nanoverl-train export` saves one (nanoverl_hf.models: a GGUF is
de-quantized into a plain float model), so the folder is a `model.path` for the hf worker and for vLLM.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from nanoverl_core.agents import render_chat
from nanoverl_core.agents.transcript import hermes_messages
from nanoverl_core.env.render import render_answer

WORDS = ["garden", "planet", "window", "silver", "forest", "rocket", "candle", "pepper", "dragon", "marble",
         "tunnel", "bridge", "summer", "orange", "castle", "violin", "meadow", "harbor", "jungle", "pencil",
         "strawberry", "banana", "elephant", "mountain", "library", "blanket", "thunder", "lantern", "compass"]
CAPITALS = {"France": "Paris", "Peru": "Lima", "Japan": "Tokyo", "Kenya": "Nairobi", "Norway": "Oslo",
            "Egypt": "Cairo", "Canada": "Ottawa", "Chile": "Santiago", "Spain": "Madrid", "Italy": "Rome",
            "Greece": "Athens", "Poland": "Warsaw", "Ireland": "Dublin", "Cuba": "Havana", "Nepal": "Kathmandu",
            "Austria": "Vienna", "Portugal": "Lisbon", "Sweden": "Stockholm", "Ghana": "Accra", "Fiji": "Suva"}
CITIES = ["Oslo", "Lima", "Tokyo", "Cairo", "Madrid", "Dublin", "Quito", "Hanoi", "Perth", "Bergen"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy"]
FRENCH = {"cat": "chat", "dog": "chien", "house": "maison", "water": "eau", "bread": "pain", "apple": "pomme",
          "book": "livre", "tree": "arbre", "sun": "soleil", "moon": "lune", "car": "voiture", "friend": "ami"}


def schema(name: str, description: str, params: dict[str, str]) -> dict:
    """An OpenAI tool schema with string parameters, all required."""
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "required": list(params),
        "properties": {p: {"type": "string", "description": d} for p, d in params.items()}}}}


def tasks(rng: random.Random) -> list[tuple[dict, str, tuple[str, ...], str]]:
    """One task of each kind: (the tool's schema, a question, the call's argument values, the tool's result)."""
    word, other = rng.sample(WORDS, 2)
    country, city, english = rng.choice(list(CAPITALS)), rng.choice(CITIES), rng.choice(list(FRENCH))
    letter = rng.choice(sorted(set(word)))
    weather = f"{rng.choice(SKIES)}, {rng.randint(-5, 30)} degrees"
    pick = rng.choice
    return [
        (schema(pick(["reverse_text", "reverse", "spell_backwards"]), "Reverse the letters of a text.",
                {pick(["text", "word", "s"]): "the text to reverse"}),
         pick([f"Reverse the word '{word}'.", f"What is '{word}' spelled backwards?", f"Write {word} backwards."]),
         (word,), word[::-1]),
        (schema(pick(["count_letter", "letter_count"]), "Count how often a letter occurs in a word.",
                {"word": "the word", "letter": "the letter to count"}),
         pick([f"How many times does the letter '{letter}' appear in '{word}'?", f"Count the letter {letter} in {word}."]),
         (word, letter), str(word.count(letter))),
        (schema(pick(["capital_of", "get_capital", "lookup_capital"]), "The capital city of a country.",
                {pick(["country", "name"]): "the country"}),
         pick([f"What is the capital of {country}?", f"Which city is the capital of {country}?"]),
         (country,), CAPITALS[country]),
        (schema(pick(["get_weather", "weather"]), "Today's weather in a city.", {pick(["city", "location"]): "the city"}),
         pick([f"What is the weather in {city} today?", f"How is the weather in {city}?"]),
         (city,), weather),
        (schema(pick(["translate_to_french", "french"]), "Translate an English word into French.",
                {"word": "the English word"}),
         pick([f"What is '{english}' in French?", f"Translate {english} into French."]), (english,), FRENCH[english]),
        (schema(pick(["uppercase", "to_upper"]), "Write a text in capital letters.", {"text": "the text"}),
         pick([f"Write '{word} {other}' in capital letters.", f"Uppercase this: {word} {other}"]),
         (f"{word} {other}",), f"{word} {other}".upper()),
    ]


def conversation(rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(the tools offered, the messages): a question, the call, the tool's result, the answer."""
    options = tasks(rng)
    tool, question, values, result = rng.choice(options)
    tools = [tool, *rng.sample([t for t, *_ in options if t is not tool], rng.randint(0, 2))]
    rng.shuffle(tools)
    arguments = dict(zip(tool["function"]["parameters"]["properties"], values))
    call = {"id": "call_0", "type": "function",
            "function": {"name": tool["function"]["name"], "arguments": json.dumps(arguments)}}
    return tools, [{"role": "user", "content": question},
                   {"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_0", "content": result},
                   {"role": "assistant", "content": result}]


def encode(tokenizer, tools: list[dict], messages: list[dict], stop_id: int) -> tuple[list[int], list[int]]:
    """The conversation's ids as the endpoint builds an episode of it, and the labels: the model's turns' ids,
    -100 elsewhere."""
    ids = tokenizer.encode(render_chat(tokenizer, messages[:1], tools, "hermes"), add_special_tokens=False)
    call = tokenizer.encode(hermes_messages(messages[1:2])[0]["content"], add_special_tokens=False) + [stop_id]
    result, _ = render_answer(tokenizer, hermes_messages(messages[2:3]), [stop_id])
    answer = tokenizer.encode(messages[3]["content"], add_special_tokens=False) + [stop_id]
    return ids + call + result + answer, [-100] * len(ids) + call + [-100] * len(result) + answer


def train(model, data: list[tuple[list[int], list[int]]], pad_id: int, args, rng: random.Random) -> None:
    """AdamW over `data` in batches, the loss transformers' causal-LM loss on the labelled tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    start = time.time()
    for epoch in range(args.epochs):
        rng.shuffle(data)
        for first in range(0, len(data), args.batch_size):
            batch = data[first:first + args.batch_size]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([i + [pad_id] * (width - len(i)) for i, _ in batch])
            labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
            mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(json.dumps({"epoch": epoch, "batch": first // args.batch_size, "loss": round(loss.item(), 4),
                              "seconds": round(time.time() - start)}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model.path: a GGUF file or a model folder")
    parser.add_argument("out", type=Path, help="the folder to write the warmed-up model to")
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from nanoverl_core.config.schema import Config, ModelConfig
    from nanoverl_core.errors import ConfigError
    from nanoverl_core.rollout import stop_token_ids
    from nanoverl_hf.models import load_policy, load_tokenizer, neutral_generation_config, resolve_source

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    config = Config(model=ModelConfig(path=args.model, dtype="float32"))
    try:
        source = resolve_source(config.model)
    except ConfigError as exc:          # a missing file, or a GGUF without the gguf package
        print(f"error: {str(exc).replace('model.path = ', 'the model ')}", file=sys.stderr)
        sys.exit(2)
    tokenizer, model = load_tokenizer(config.model, source), load_policy(config, source)
    stops = stop_token_ids(tokenizer, model)
    rng = random.Random(args.seed)
    data = [encode(tokenizer, *conversation(rng), stops[0]) for _ in range(args.examples)]
    print(json.dumps({"conversations": len(data), "tokens": sum(len(ids) for ids, _ in data)}), flush=True)
    train(model, data, stops[0], args, rng)     # padding is masked: its id is never read
    model.generation_config = neutral_generation_config(model, tokenizer, stops)
    model.config.use_cache = True
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)


if __name__ == "__main__":
    main()
