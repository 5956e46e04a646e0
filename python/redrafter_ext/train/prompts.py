"""Instruction prompts for distilling a drafter from a chat target.

``train_prompts()``: a deterministic pool of several hundred diverse instructions, built from task
templates crossed with subjects (explain, list, compare, write, code, maths, advice, ...).
``broad_prompts()``: a larger pool of everyday assistant requests (how things work, why questions,
recipes, messages, stories and poems, advice, lists, code, arithmetic word problems, rewriting,
pros and cons, people, places, money), each kind in several wordings and with politeness or
context around some: a drafter trained on the template pool alone agreed with the target on 59% of
positions of unseen prompts of that pool but 37% of the hand-written held-out ones (wording shift).
Neither pool holds a held-out prompt (``redrafter_ext.prompts.heldout_prompts``: hand-written, for
the demo, the benches and the drafter's evaluation).
"""

from __future__ import annotations

import random

from ..prompts import heldout_prompts

__all__ = ["broad_prompts", "train_prompts"]

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


# ---------------------------------------------------------------------------------------------
# the broad pool: kinds of request x wordings x fillers (none of them a held-out prompt)

_HOW_WORKS = [
    "a thermostat", "a microwave oven", "the gears on a bicycle", "a solar panel", "a touchscreen", "a lock and key",
    "a card payment in a shop", "a search engine", "GPS navigation", "a flush toilet", "an elevator", "a digital camera",
    "a rechargeable battery", "a hearing aid", "a washing machine", "Wi-Fi", "a traffic light", "a 3D printer",
    "a hydroelectric dam", "noise-cancelling headphones", "an electric motor", "a vending machine",
    "a barcode scanner", "a smoke detector", "a parachute", "a hot air balloon", "a pressure cooker",
    "an escalator", "a light bulb", "a submarine", "a thermometer", "a smartwatch", "a dishwasher", "a bicycle pump",
    "an electric kettle", "the stock exchange", "a spam filter", "an induction hob",
]
_HOW_WORKS_FORMS = [
    "How does {x} work?", "Can you explain how {x} works?", "I've always wondered how {x} works. Can you explain?",
    "Explain the science behind {x}.", "Explain how {x} works in simple terms.", "What happens inside {x}?",
]
_WHY = [  # (direct question, indirect form)
    ("do leaves change color in the fall", "leaves change color in the fall"), ("does bread rise", "bread rises"),
    ("do we dream", "we dream"), ("is the ocean salty", "the ocean is salty"),
    ("do onions make people cry", "onions make people cry"), ("does ice float on water", "ice floats on water"),
    ("do we yawn", "we yawn"), ("do stars twinkle", "stars twinkle"), ("do birds migrate", "birds migrate"),
    ("does the Moon change shape", "the Moon changes shape"), ("do we get goosebumps", "we get goosebumps"),
    ("is grass green", "grass is green"), ("do dogs wag their tails", "dogs wag their tails"),
    ("does metal feel colder than wood", "metal feels colder than wood"),
    ("do we have fingerprints", "we have fingerprints"), ("do people snore", "people snore"),
    ("do planes leave white trails", "planes leave white trails"), ("do we need sleep", "we need sleep"),
    ("does popcorn pop", "popcorn pops"), ("do our ears pop on a plane", "our ears pop on a plane"),
    ("do cats like boxes", "cats like boxes"), ("is the sunset red", "the sunset is red"),
    ("do we get hiccups", "we get hiccups"), ("does the wind blow", "the wind blows"),
    ("do zebras have stripes", "zebras have stripes"), ("do some trees lose their leaves in winter",
                                                        "some trees lose their leaves in winter"),
]
_WHY_FORMS = [
    "Why {d}?", "Can you tell me why {i}?", "My son asked me why {i}. How should I answer?",
    "Explain why {i}, in two or three sentences.", "Quick question: why {d}?",
]
_DISHES = [
    "pancakes", "a vegetable curry", "banana bread", "guacamole", "fried rice", "lentil soup", "chocolate chip cookies",
    "a fruit smoothie", "homemade pizza", "scrambled eggs", "a Greek salad", "spaghetti carbonara", "hummus",
    "a chicken stir-fry", "apple pie", "mashed potatoes", "French toast", "a veggie burger", "overnight oats",
    "a mushroom risotto", "lemonade", "a tuna sandwich",
]
_DISH_FORMS = [
    "Give me an easy recipe for {x}.", "How do I make {x}?", "What ingredients do I need for {x}?",
    "I have 30 minutes. Can I make {x}? Give me the steps.", "Suggest a healthier version of {x}.",
    "Write a shopping list for {x} for four people.",
]
_MESSAGES = [
    "asking my manager for a day off", "thanking a client for their business", "reminding my team about a deadline",
    "apologizing for a late reply", "inviting the neighbors to a garden party", "asking for a refund for a broken kettle",
    "introducing myself to my new team", "declining a job offer politely", "asking a professor for a reference letter",
    "following up after a job interview", "congratulating a colleague on a promotion", "cancelling a gym membership",
    "welcoming a new employee", "asking for feedback on my report", "telling my landlord that the heating is broken",
    "wishing my grandmother a happy birthday", "asking a friend to return a book", "announcing that our office moves",
]
_MESSAGE_FORMS = [
    "Write a short email {x}.", "Draft a polite message {x}.", "Help me write a note {x}.",
    "Write a text message {x}. Keep it friendly.",
]
_CHARACTERS = [
    "a lonely lighthouse keeper", "a talking dog", "a young wizard", "an astronaut stranded on Mars",
    "a detective in a small town", "a shy dragon", "a time traveler", "a girl who can talk to trees",
    "an old fisherman", "a clumsy superhero", "a cat who wants to fly", "two rival bakers",
]
_SITUATIONS = [
    "who finds a mysterious map", "on the first day of school", "who loses something important",
    "who makes an unexpected friend", "during a thunderstorm", "who has to solve a riddle",
]
_STORY_FORMS = [
    "Write a short story about {x}.", "Tell me a bedtime story about {x}.",
    "Write the opening paragraph of a novel about {x}.",
]
_POEM_SUBJECTS = [
    "the city at night", "a rainy morning", "friendship", "the first snow", "an old oak tree", "the mountains",
    "a cup of coffee", "the stars", "a lost glove", "springtime", "the sea at dawn", "a train journey", "my dog",
    "the end of summer", "a quiet library",
]
_POEM_FORMS = [
    "Write a short poem about {x}.", "Write a haiku about {x}.", "Write a limerick about {x}.",
    "Write a four-line rhyming poem about {x}.", "Write the chorus of a song about {x}.",
]
_GOALS = [
    "learning to swim as an adult", "making friends in a new city", "saving money for a holiday", "keeping a journal",
    "studying for exams", "sleeping better", "eating more vegetables", "starting a vegetable garden",
    "running my first 5k", "learning to draw", "keeping my desk tidy", "speaking in public", "negotiating a salary",
    "training a puppy", "spending less time on my phone", "staying motivated at the gym", "cooking for one person",
    "moving to a new apartment", "working from home", "getting better at chess", "reading more books",
    "learning to cook", "keeping in touch with old friends", "writing clearly",
]
_GOAL_FORMS = [
    "What are three tips for {x}?", "Give me advice on {x}.", "What are good strategies for {x}?",
    "I'm struggling with {x}. What should I do?", "What mistakes do beginners make when {x}?",
    "Make a step-by-step plan for {x}.",
]
_WAYS = [
    "save water at home", "be kind to strangers", "use leftover bread", "stay cool in summer",
    "make a long car trip fun", "learn new words", "help the environment", "relax after work",
    "celebrate a small win", "decorate a small room", "stay warm in winter without heating", "make a meeting shorter",
    "keep kids busy on a trip", "get more exercise during the day", "cheer up a friend",
]
_WAY_FORMS = [
    "List some ways to {x}.", "Give me five ideas to {x}.", "Brainstorm ten ways to {x}.",
    "What are some creative ways to {x}?",
]
_CODE_TASKS = [
    "returns the sum of the even numbers in a list", "counts how often each word appears in a text",
    "checks whether a year is a leap year", "converts a list of strings to uppercase",
    "finds the shortest word in a sentence", "returns the average of the values of a dictionary",
    "reverses the order of the words in a sentence", "removes all spaces from a string",
    "checks whether a list is sorted", "raises a number to a power without using **",
    "returns the longest common prefix of a list of words", "splits a list into chunks of size n",
    "counts the digits of an integer", "converts minutes into hours and minutes", "finds the index of the minimum",
    "generates a random password", "checks that an email address contains one @ and a dot",
    "transposes a matrix given as a list of lists", "finds all duplicates in a list", "computes a running total",
    "checks whether two lists have an element in common", "returns the n-th triangular number",
]
_CODE_FORMS = [
    "Write a Python function that {x}.", "Can you show me Python code that {x}?",
    "Write a JavaScript function that {x}.", "Implement a function that {x}, and explain how it works.",
    "Write a short Python program that {x}, with a test.",
]
_CODE_CONCEPTS = [
    "a dictionary in Python", "a list comprehension", "exception handling", "variables", "an if statement",
    "a class", "a hash table", "binary search", "a linked list", "big O notation", "a git commit", "an HTTP request",
    "a database index", "JSON", "a lambda function", "unit testing", "an API key", "a stack and a queue",
]
_CODE_CONCEPT_FORMS = ["Explain {x} with an example.", "What is {x}, and when would I use it?", "Teach me {x} in five minutes."]
_CODE_PAIRS = [
    "a set and a list", "== and is", "a class and an object", "break and continue", "a module and a package",
    "append and extend", "local and global variables", "a while loop and a for loop", "a compiler and an interpreter",
    "GET and POST requests", "SQL and NoSQL databases", "a bug and an error",
]
_EXPLAIN_FORMS = [
    "Tell me about {s}.", "I don't understand {s}. Can you help?", "In a few sentences, what should everyone know about {s}?",
    "What is the story behind {s}?", "What's something surprising about {s}?", "Teach me the basics of {s}.",
]
_PLACES = [
    "Paris", "the Sahara desert", "New York City", "a busy market", "the Grand Canyon", "Iceland", "Rome",
    "a rainforest at night", "a medieval castle", "London", "a Japanese garden", "the Alps", "Cairo",
    "a farm in the morning", "Barcelona", "the Norwegian fjords", "a small fishing village", "Istanbul",
]
_PLACE_FORMS = [
    "Describe {x} in a few sentences.", "What is {x} like?", "What should I see if I visit {x}?",
    "Plan a two-day trip to {x}.",
]
_MONEY = [
    "a credit score", "compound interest", "a pension", "a household budget", "an index fund", "insurance",
    "a rental lease", "income tax", "a personal loan", "an emergency fund", "a savings account", "a student loan",
]
_MONEY_FORMS = ["What is {x} and how does it work?", "Explain {x} like I'm five.", "Why does {x} matter for ordinary people?"]
_ROLES = [
    ("the heart", "the human body"), ("the roots", "a plant"), ("red blood cells", "the blood"),
    ("the liver", "digestion"), ("the nucleus", "a cell"), ("the lungs", "breathing"),
    ("chlorophyll", "photosynthesis"), ("the kidneys", "the body"), ("bees", "an ecosystem"),
    ("the CPU", "a computer"), ("the ozone layer", "the atmosphere"), ("enzymes", "digestion"),
    ("a referee", "a football match"), ("the central bank", "an economy"), ("the skin", "the immune system"),
]
_SENTENCES = [
    "i cant come tomorrow because my car is broke", "The meeting have been moved to friday afternoon",
    "We was very happy with the service", "Send me the report asap", "This product is not good",
    "Their going to the park later, want to come", "I seen that movie already", "Hey, what's up with the invoice?",
    "The results of the survey shows that people likes the new design", "Can u call me back",
    "The weather today is really really hot and I don't like it at all",
    "Our team finished the project two weeks before the deadline",
]
_SENTENCE_FORMS = [
    "Correct the grammar: '{x}'", "Rewrite this sentence to sound more polite: '{x}'",
    "Make this sentence more formal: '{x}'", "Translate into French: '{x}'", "Rewrite this to be shorter: '{x}'",
]
_DEBATES = [
    "working from home", "electric scooters in cities", "living in a big city", "online classes", "owning a car",
    "social media for teenagers", "renting instead of buying a home", "a four-day work week", "e-books",
    "homework for young children", "nuclear energy", "self-driving cars", "learning two languages at once",
]
_DEBATE_FORMS = ["What are the pros and cons of {x}?", "Give three arguments for and against {x}.",
                 "Is {x} a good idea? Give a balanced answer."]
_PEOPLE = [
    "Marie Curie", "Leonardo da Vinci", "Nelson Mandela", "Ada Lovelace", "Albert Einstein", "Cleopatra",
    "Isaac Newton", "Frida Kahlo", "Charles Darwin", "Mahatma Gandhi", "Galileo Galilei", "Amelia Earhart",
    "Wolfgang Amadeus Mozart", "Florence Nightingale",
]
_PEOPLE_FORMS = ["Who was {x}?", "Why is {x} famous?", "Write a short biography of {x}.", "What can we learn from {x}?"]
_PREFIXES = ["Hi! ", "Quick question: ", "I'm a beginner. ", "For a school project: ", "Can you help me? ",
             "Hello, ", "I need this for work. "]


def _math_problems(rng: random.Random, n: int) -> list[str]:
    """Arithmetic word problems with random numbers, in several wordings."""
    makers = [
        lambda: f"If {rng.randint(2, 9)} friends share {rng.randint(12, 60)} cookies equally, how many does each get?",
        lambda: f"A book costs ${rng.randint(5, 30)}. How much do {rng.randint(2, 9)} books cost?",
        lambda: f"What is {rng.choice([5, 10, 15, 20, 25, 30, 40])}% of {rng.randint(20, 400)}?",
        lambda: f"A bus leaves at {rng.randint(6, 11)}:{rng.choice(['00', '15', '30', '45'])} and the trip takes "
                f"{rng.randint(2, 5)} hours. When does it arrive?",
        lambda: f"Solve for x: {rng.randint(2, 9)}x + {rng.randint(1, 20)} = {rng.randint(21, 90)}.",
        lambda: f"What is the area of a triangle with a base of {rng.randint(3, 20)} cm and a height of "
                f"{rng.randint(3, 20)} cm?",
        lambda: f"A recipe needs {rng.randint(2, 4)} eggs for {rng.randint(2, 4)} people. How many eggs do I need for "
                f"{rng.randint(5, 12)} people?",
        lambda: f"What is {rng.randint(100, 999)} divided by {rng.randint(2, 9)}?",
        lambda: f"How many seconds are there in {rng.randint(2, 12)} minutes?",
        lambda: f"A garden is {rng.randint(4, 15)} m long and {rng.randint(3, 10)} m wide. How much fence goes "
                "around it?",
        lambda: f"I walk {rng.randint(3, 6)} km per hour. How long does it take me to walk {rng.randint(5, 20)} km?",
        lambda: f"What is {rng.randint(12, 99)} times {rng.randint(3, 19)}?",
    ]
    forms = ["Solve this and explain each step: {x}", "Please help me with this math problem: {x}", "{x}",
             "{x} Show your work."]
    return [rng.choice(forms).format(x=rng.choice(makers)()) for _ in range(n)]


def broad_prompts(n: int | None = None, seed: int = 0) -> list[str]:
    """The broad pool (deterministic, about 2,700 prompts), shuffled with ``seed``; the first ``n``
    when given. Each kind of request crosses its fillers with its wordings; a seeded quarter of the
    prompts get a politeness or context prefix."""
    rng = random.Random(1)
    pool: list[str] = []

    def cross(fillers, forms):
        pool.extend(f.format(x=x) for x in fillers for f in forms)

    cross(_HOW_WORKS, _HOW_WORKS_FORMS)
    pool.extend(f.format(d=d, i=i) for d, i in _WHY for f in _WHY_FORMS)
    cross(_DISHES, _DISH_FORMS)
    cross(_MESSAGES, _MESSAGE_FORMS)
    cross([f"{c} {s}" for c in _CHARACTERS for s in _SITUATIONS], _STORY_FORMS)
    cross(_POEM_SUBJECTS, _POEM_FORMS)
    cross(_GOALS, _GOAL_FORMS)
    cross(_WAYS, _WAY_FORMS)
    cross(_CODE_TASKS, _CODE_FORMS)
    cross(_CODE_CONCEPTS, _CODE_CONCEPT_FORMS)
    cross(_CODE_PAIRS, ["What is the difference between {x} in programming?", "When should I use {x}? Compare them."])
    cross(_PLACES, _PLACE_FORMS)
    cross(_MONEY, _MONEY_FORMS)
    cross([f"{a} in {b}" for a, b in _ROLES], ["What is the role of {x}?", "Explain the job of {x}."])
    cross(_SENTENCES, _SENTENCE_FORMS)
    cross(_DEBATES, _DEBATE_FORMS)
    cross(_PEOPLE, _PEOPLE_FORMS)
    pool.extend(f.format(s=s) for s in _SUBJECTS for f in _EXPLAIN_FORMS)
    pool.extend(_math_problems(rng, 300))
    out = []
    for p in pool:
        if rng.random() < 0.25:
            pre = rng.choice(_PREFIXES)
            p = pre + (p[0].lower() + p[1:] if pre.endswith(", ") else p)  # "Hello, how does ..."
        out.append(p)
    held = set(heldout_prompts())
    out = [p for p in dict.fromkeys(out) if p not in held]
    random.Random(seed).shuffle(out)
    return out if n is None else out[:n]


def train_prompts(n: int | None = None, seed: int = 0) -> list[str]:
    """The training pool (deterministic), shuffled with ``seed``; the first ``n`` when given.

    Every subject x template pair (about 2,700 prompts with the standalone ones): answers to a
    drafter's training prompts must outnumber what it can memorise (a drafter fitted to 88k tokens
    of 494 prompts agreed with the target on 94% of training positions but 36% of held-out ones).
    """
    pool = [t.format(s=s) for s in _SUBJECTS for t in _TEMPLATES]
    for template, items in _STANDALONE_TEMPLATES:
        pool += [template.format(t=t) for t in items]
    held = set(heldout_prompts())
    pool = [p for p in dict.fromkeys(pool) if p not in held]
    random.Random(seed).shuffle(pool)
    return pool if n is None else pool[:n]
