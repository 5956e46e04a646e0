"""Instruction prompts for distilling a drafter from a chat target, and held-out prompts for the demo.

``train_prompts()``: a deterministic pool of several hundred diverse instructions, built from task
templates crossed with subjects (explain, list, compare, write, code, maths, advice, ...).
``heldout_prompts()``: hand-written prompts never in the pool (different wording and subjects);
the demo, the benches and the drafter's evaluation use them.
"""

from __future__ import annotations

import random

__all__ = ["heldout_prompts", "train_prompts"]

_SUBJECTS = [
    "photosynthesis", "black holes", "the French Revolution", "machine learning", "climate change",
    "the water cycle", "volcanoes", "the human heart", "electric cars", "the Roman Empire",
    "vaccines", "the stock market", "renewable energy", "the internet", "coffee", "bees",
    "the Moon landing", "plate tectonics", "inflation", "DNA", "recycling", "the Great Wall of China",
    "chess", "sleep", "meditation", "the printing press", "rainbows", "earthquakes", "antibiotics",
    "the solar system", "jazz music", "the Amazon rainforest", "gravity", "cryptocurrency",
    "the immune system", "ancient Egypt", "hurricanes", "nuclear power", "social media", "honey",
    "the ocean tides", "dinosaurs", "the Olympic Games", "democracy", "bread baking", "glaciers",
    "artificial intelligence", "the Silk Road", "penguins", "the Renaissance", "solar panels",
    "the Industrial Revolution", "tea", "quantum computers", "the periodic table", "volunteering",
    "public libraries", "bicycles", "the Internet of Things", "composting", "the piano",
    "the human brain", "deserts", "coral reefs", "space telescopes", "trains", "origami",
    "the Pythagorean theorem", "time zones", "soap", "the metric system", "wind turbines",
    "fermentation", "the Cold War", "Shakespeare", "whales", "3D printing", "batteries",
    "the Eiffel Tower", "photosynthesis in algae", "the Nile River", "elephants", "microplastics",
    "the Mars rovers", "the theory of evolution", "opera", "the human skeleton", "lightning",
    "electric guitars", "the Byzantine Empire", "credit cards", "smartphones", "wolves", "mushrooms",
    "the Arctic", "mountain climbing", "the Great Barrier Reef", "blood types", "magnets",
    "the Aztecs", "video games", "yoga", "cheese making", "the Mona Lisa", "owls", "rice farming",
    "submarines", "the Milky Way", "the ozone layer", "email", "the Vikings", "photography",
    "friendship", "minimalism", "the United Nations", "skyscrapers", "octopuses", "the violin",
    "spreadsheets", "rain forests in Asia", "the Apollo program", "chocolate", "password security",
    "the French language", "tornadoes", "ants", "public transport", "the Olympic marathon",
]

_TEMPLATES = [
    "Explain {s} in simple terms.",
    "What is {s}?",
    "Give me three interesting facts about {s}.",
    "Write a short paragraph about {s} for a ten-year-old.",
    "Why is {s} important?",
    "Summarize the history of {s} in a few sentences.",
    "What are the main advantages and disadvantages of {s}?",
    "Write a haiku about {s}.",
    "Write a short poem about {s}.",
    "Describe {s} to someone who has never heard of it.",
    "List five questions a student might ask about {s}.",
    "What are common misconceptions about {s}?",
    "How does {s} affect everyday life?",
    "Write a tweet about {s}.",
    "Give a one-sentence definition of {s}.",
    "Write a short story that involves {s}.",
    "What would a beginner need to know about {s}?",
    "Create a quiz question about {s} with four answer options.",
    "Explain {s} using an analogy.",
    "What are the key terms related to {s}? Define each briefly.",
    "Write an introduction for an essay about {s}.",
    "How would you teach {s} to a class of high school students?",
]

_STANDALONE_TEMPLATES = [
    ("Write a Python function that {t}.", [
        "reverses a string", "checks whether a number is prime", "returns the factorial of n",
        "counts the vowels in a sentence", "finds the largest element of a list", "removes duplicates from a list",
        "computes the Fibonacci sequence up to n", "checks whether a word is a palindrome",
        "sorts a list of dictionaries by a key", "converts Celsius to Fahrenheit", "merges two sorted lists",
        "reads a text file and counts its lines", "returns the greatest common divisor of two numbers",
        "flattens a nested list", "capitalizes the first letter of every word", "computes the mean of a list",
    ]),
    ("How do I {t}?", [
        "make a cup of tea", "start learning to code", "improve my handwriting", "prepare for a job interview",
        "save money on groceries", "write a good email", "care for a houseplant", "fall asleep faster",
        "learn a new language", "stay focused while studying", "change a flat bicycle tire", "make pancakes",
        "organize my closet", "give a good presentation", "start running", "take better photos with my phone",
        "write a resume", "plan a birthday party", "reduce stress", "be more productive in the morning",
    ]),
    ("What is the difference between {t}?", [
        "weather and climate", "a virus and a bacterium", "a list and a tuple in Python", "speed and velocity",
        "a democracy and a republic", "an alligator and a crocodile", "RAM and storage", "a simile and a metaphor",
        "mass and weight", "a comet and an asteroid", "stocks and bonds", "HTTP and HTTPS", "baking soda and baking powder",
        "an atom and a molecule", "a lake and a pond", "affect and effect",
    ]),
    ("Solve this and explain each step: {t}", [
        "What is 15% of 80?", "If a train travels 120 km in 2 hours, what is its average speed?",
        "What is 7 times 8 plus 12?", "A rectangle is 5 cm wide and 9 cm long. What is its area?",
        "Solve for x: 3x + 5 = 20.", "What is the sum of the numbers from 1 to 10?",
        "A shirt costs $25 and is 20% off. What is the new price?", "What is the square root of 144?",
        "If I have 3 apples and buy 2 dozen more, how many apples do I have?", "Convert 2.5 hours to minutes.",
        "What is 1/4 plus 1/3?", "A circle has a radius of 3. What is its circumference?",
    ]),
    ("{t}", [
        "Write a thank-you note to a teacher.", "Suggest a name for a new coffee shop.",
        "Write a short product description for a reusable water bottle.", "Give me a recipe for a simple salad.",
        "Write a limerick about a cat.", "Plan a three-day trip to Paris.", "Suggest five healthy breakfast ideas.",
        "Write a motivational message for someone starting a new job.", "Tell me a joke about computers.",
        "Write a formal email asking for a meeting.", "Give me tips for a first day at university.",
        "Write a dialogue between a customer and a waiter.", "Describe a sunset at the beach.",
        "Suggest some board games for a family evening.", "Write a short speech for a friend's wedding.",
        "List ten animals that live in the Arctic.", "Translate 'Good morning, how are you?' into French and Spanish.",
        "Correct the grammar: 'She don't like apples and he have two dog.'",
        "Rewrite this sentence to be more formal: 'Hey, can you send me that file real quick?'",
        "Give me a weekly workout plan for a beginner.", "Write a short mystery story opening.",
        "What are the planets of the solar system in order?", "Write an apology message for missing a meeting.",
        "Describe your ideal city.", "Give me a list of good habits for programmers.",
        "Explain what a for loop is with an example.", "Write a SQL query that selects all users older than 30.",
        "What is the capital of Australia, and why is it not Sydney?", "Write a short review of a fictional restaurant.",
        "Brainstorm ideas for a school science fair project.", "Write a cover letter opening for a library job.",
        "Explain the rules of tic-tac-toe.", "Give me a packing list for a camping trip.",
        "Write a bedtime story about a dragon who is afraid of the dark.", "Summarize the plot of Romeo and Juliet.",
        "What should I consider when buying a laptop?", "Explain recursion to a beginner programmer.",
        "Write a JavaScript function that adds two numbers.", "How many days are there in a leap year, and why?",
        "Give three arguments for and against school uniforms.",
    ]),
]

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


def train_prompts(n: int | None = None, seed: int = 0) -> list[str]:
    """The training pool (deterministic), shuffled with ``seed``; the first ``n`` when given.

    Every subject x template pair (about 2,700 prompts with the standalone ones): answers to a
    drafter's training prompts must outnumber what it can memorise (a drafter fitted to 88k tokens
    of 494 prompts agreed with the target on 94% of training positions but 36% of held-out ones).
    """
    pool = [t.format(s=s) for s in _SUBJECTS for t in _TEMPLATES]
    for template, items in _STANDALONE_TEMPLATES:
        pool += [template.format(t=t) for t in items]
    held = set(_HELDOUT)
    pool = [p for p in dict.fromkeys(pool) if p not in held]
    random.Random(seed).shuffle(pool)
    return pool if n is None else pool[:n]


def heldout_prompts(n: int | None = None) -> list[str]:
    """Hand-written prompts never used for training (the first ``n`` when given)."""
    return list(_HELDOUT) if n is None else list(_HELDOUT[:n])
