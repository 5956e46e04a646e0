"""Prompts outside training, shared by the demo, the benches and ``train/``: hand-written held-out
chat prompts and a user turn's token ids in a chat template.

The training pools (``train/prompts.py``) leave these prompts out, so the demo and the drafter's
evaluation measure unseen wording; they live here so that the demo needs no training code.
"""

from __future__ import annotations

__all__ = ["chat_prompt_ids", "heldout_prompts"]

_HELDOUT = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about autumn leaves.",
    "What are three tips for learning to play the guitar?",
    "Write a Python function that returns the second largest number in a list.",
    "Why do cats purr?",
    "Describe the life cycle of a butterfly.",
    "Give me a simple recipe for tomato soup.",
    "What is the difference between a planet and a star?",
    "Write a short email inviting my colleagues to a team lunch.",
    "How does a compass work?",
    "Summarize the causes of the First World War in a few sentences.",
    "Explain what an API is to someone who is not a programmer.",
    "Solve this and explain each step: A car uses 6 liters of fuel per 100 km. How much fuel does it need for 250 km?",
    "What are the benefits of drinking water?",
    "Write a story about a robot who learns to paint.",
    "How can I make my home more energy efficient?",
    "What causes the seasons on Earth?",
    "Give me five ideas for a rainy day with children.",
    "Explain the difference between a function and a method in Python.",
    "Why is the sky blue?",
    "Write a short motivational speech for a sports team before a final.",
    "What are the main parts of a plant and what do they do?",
    "How do airplanes stay in the air?",
    "List some ways to reduce plastic waste.",
    "What is a mortgage and how does it work?",
    "Write a haiku about the ocean.",
    "Explain how vaccines train the immune system.",
    "What are good strategies for managing time at work?",
    "Describe the city of Tokyo in a few sentences.",
    "Write a function in Python that checks whether two strings are anagrams.",
    "What is the role of the mitochondria in a cell?",
    "Give me advice for writing a good short story.",
]


def heldout_prompts(n: int | None = None) -> list[str]:
    """Hand-written prompts never used for training (the first ``n`` when given)."""
    return list(_HELDOUT) if n is None else list(_HELDOUT[:n])


def chat_prompt_ids(tok, text: str) -> list[int]:
    """Token ids of one user turn wrapped in the tokenizer's chat template, ready for the answer."""
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]
