"""Varied prompts for a self-distilled drafter corpus: code in several languages, chat and explanation
prompts, math word problems, and raw code-completion prompts (stdlib function signatures).

Every prompt is built here from templates x topics, seeded, so a corpus can be rebuilt anywhere. None
comes from an evaluation set: the math problems are template sentences with random numbers (not GSM8K
items), the code tasks are written here (not HumanEval's), and raw completion prompts come from the
CPython standard library on the machine (corpus.signature_prompts).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from . import corpus as C

MIXES = ("code", "mixed")      # code: stdlib signatures only (drafter v3's corpus) | mixed: every kind below


@dataclass(frozen=True)
class PromptSpec:
    kind: str          # code-raw | code-chat | explain | math
    text: str          # the user message (chat) or the text to continue (raw)
    chat: bool         # encode with the tokenizer's chat template


LANGUAGES = ("Python", "JavaScript", "TypeScript", "Java", "C", "C++", "Go", "Rust", "Ruby", "C#", "Kotlin",
             "Bash", "PHP", "Swift")

CODE_TASKS = (
    "reverses the words in a sentence", "checks whether a string is a palindrome, ignoring case and spaces",
    "counts how many times each character appears in a string", "returns the n-th Fibonacci number iteratively",
    "merges two sorted arrays into one sorted array", "removes duplicate values from a list while keeping order",
    "computes the greatest common divisor of two integers", "checks whether a number is prime",
    "flattens a nested list of integers", "finds the longest common prefix of a list of strings",
    "converts a Roman numeral to an integer", "converts an integer to its binary representation as a string",
    "implements binary search over a sorted array", "rotates a matrix by 90 degrees clockwise",
    "parses a CSV line into fields, handling quoted commas", "validates an email address with simple rules",
    "returns the k most frequent words in a text", "computes the running average of a stream of numbers",
    "implements a stack with push, pop and peek", "implements a queue using two stacks",
    "checks whether parentheses in a string are balanced", "computes the factorial of n with memoization",
    "finds the maximum subarray sum (Kadane's algorithm)", "groups a list of words into anagram groups",
    "counts the vowels in a string", "capitalizes the first letter of every word",
    "computes the dot product of two vectors", "transposes a matrix",
    "returns the indices of two numbers that add up to a target", "sorts a list of records by two keys",
    "reads a text file and counts its lines, words and characters", "implements an LRU cache of fixed size",
    "converts a temperature between Celsius and Fahrenheit", "computes the median of a list of numbers",
    "generates all permutations of a short string", "computes the edit distance between two strings",
    "checks whether two strings are anagrams", "returns the second largest element of an array",
    "implements insertion sort", "implements quicksort", "finds all primes below n with a sieve",
    "computes compound interest for a number of years", "splits a list into chunks of size n",
    "formats a number of seconds as HH:MM:SS", "returns the day of the week for a date",
    "checks whether a year is a leap year", "computes the area of a polygon from its vertices",
    "encodes a string with run-length encoding", "decodes a run-length encoded string",
    "finds the first non-repeating character in a string", "computes the power set of a small set",
    "implements a simple linked list with insert and delete", "reverses a singly linked list",
    "computes the depth of a binary tree", "performs a breadth-first search on a graph",
    "detects a cycle in a directed graph", "computes the shortest path lengths with Dijkstra's algorithm",
    "converts a snake_case identifier to camelCase", "sums the digits of an integer",
    "returns the transpose of a CSV table given as a list of rows", "retries a function up to n times",
)

CODE_FORMS = (
    "Write a {lang} function that {task}.",
    "In {lang}, implement a function that {task}. Keep it short.",
    "Show me {lang} code that {task}, with a brief explanation.",
    "How would you write a {lang} program that {task}?",
)

CONCEPTS = (
    "recursion", "a hash table", "big-O notation", "garbage collection", "a race condition", "a mutex",
    "dynamic programming", "the difference between a process and a thread", "REST APIs", "SQL joins",
    "database indexes", "version control with git", "unit testing", "dependency injection", "closures",
    "immutability", "type inference", "virtual memory", "the TCP handshake", "DNS", "HTTPS and TLS",
    "public-key cryptography", "a binary search tree", "caching", "load balancing", "containers",
    "continuous integration", "regular expressions", "floating-point rounding errors", "Unicode and UTF-8",
    "photosynthesis", "the water cycle", "how vaccines work", "inflation", "supply and demand",
    "the causes of the seasons", "black holes", "plate tectonics", "how a rainbow forms", "compound interest",
    "the scientific method", "natural selection", "the French Revolution", "the printing press",
    "how airplanes fly", "the immune system", "climate and weather", "electric circuits", "gravity",
    "the stock market", "renewable energy", "how the heart works", "sleep and memory", "the Roman Empire",
)

EXPLAIN_FORMS = (
    "Explain {topic} in simple terms.",
    "What is {topic}? Give a short example.",
    "Write a short paragraph about {topic} for a beginner.",
    "Give three key facts about {topic}.",
    "Why does {topic} matter? Answer briefly.",
)

CHAT_REQUESTS = (
    "Write a polite email asking a colleague to review my report by Friday.",
    "Give me five tips for staying focused while studying.",
    "Suggest a simple weekly workout plan for a beginner.",
    "Write a short story about a robot who learns to paint.",
    "What should I pack for a three-day hiking trip?",
    "Summarize the plot of a typical detective novel in a few sentences.",
    "How do I prepare for a job interview as a software engineer?",
    "Write a haiku about autumn leaves.",
    "Give me a recipe for a quick vegetable soup.",
    "What are good habits for writing readable code?",
    "Describe a sunset over the ocean in vivid language.",
    "How can I improve my public speaking skills?",
    "Write a friendly message inviting neighbours to a garden party.",
    "List the pros and cons of working from home.",
    "Explain how to make a budget for a month.",
    "What is a good way to learn a new programming language?",
    "Write a product description for a reusable water bottle.",
    "Give advice to someone starting their first job.",
    "Write a limerick about a cat who loves coffee.",
    "How do I politely decline an invitation?",
)

NAMES = ("Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam",
         "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara")
ITEMS = ("apples", "books", "pencils", "cookies", "stickers", "marbles", "cupcakes", "stamps", "shells", "cards")

# Template math word problems: each is a format string over random integers a, b, c, a name and an item.
MATH_FORMS = (
    "{name} has {a} {item}. She buys {b} more and then gives away {c}. How many {item} does she have now?",
    "A shop sells {item} at {b} dollars each. {name} buys {a} of them and pays with a {big}-dollar bill. "
    "How much change does {name} get?",
    "{name} reads {b} pages every day. The book has {big} pages. How many days does it take to finish the book?",
    "A train travels {a} kilometres per hour for {b} hours, then {c} kilometres per hour for {b} more hours. "
    "How far does it travel in total?",
    "{name} saves {b} dollars a week. How many weeks does {name} need to save {big} dollars?",
    "A class has {a} students. {b} of them bring {c} {item} each. How many {item} are there in total?",
    "A rectangle is {a} metres long and {b} metres wide. What are its area and its perimeter?",
    "{name} earns {b} dollars an hour and works {a} hours a week. How much does {name} earn in {c} weeks?",
    "A farmer has {a} chickens and {b} cows. How many legs do the animals have altogether?",
    "A recipe needs {b} eggs for {c} people. How many eggs are needed for {a} people?",
    "{name} had {big} dollars, spent a quarter of it on {item} and {b} dollars on lunch. How much is left?",
    "There are {a} {item} shared equally among {c} children, and the rest are kept. How many does each child "
    "get, and how many are left over?",
    "A tank holds {big} litres and fills at {b} litres per minute. How long does it take to fill it from empty?",
    "{name} is {a} years old. Her mother is {c} times as old. How old will her mother be in {b} years?",
    "A bus makes {b} trips a day and carries {a} passengers each trip. How many passengers in {c} days?",
)


def math_prompts(n: int, rng: random.Random) -> list[str]:
    out = []
    for i in range(n):
        form = MATH_FORMS[i % len(MATH_FORMS)]
        a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
        out.append(form.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b, c=c,
                               big=rng.choice((100, 120, 200, 240, 300, 500, 600, 1000))))
    return out


def prompt_mix(n: int, mix: str = "mixed", seed: int = 0) -> list[PromptSpec]:
    """n prompts, seeded. `code`: stdlib signature prompts only. `mixed`: a quarter raw code completion
    (stdlib signatures), a third code in chat form over LANGUAGES x CODE_TASKS, and the rest shared by
    explanations, everyday chat requests and math word problems; then shuffled together."""
    if mix not in MIXES:
        raise ValueError(f"unknown prompt mix {mix!r}; choose one of {', '.join(MIXES)}")
    rng = random.Random(seed)
    if mix == "code":
        return [PromptSpec("code-raw", t, False) for t in C.signature_prompts(C.stdlib_docs(), n, seed=seed)]
    n_raw, n_code = n // 4, n // 3
    n_math = (n - n_raw - n_code) * 2 // 5
    n_chat = min((n - n_raw - n_code - n_math) // 4, len(CHAT_REQUESTS))    # each request once at most
    n_explain = n - n_raw - n_code - n_math - n_chat
    raw = C.signature_prompts(C.stdlib_docs(), n_raw, seed=seed)
    code = [rng.choice(CODE_FORMS).format(lang=lang, task=task)
            for lang, task in rng.sample([(lg, t) for lg in LANGUAGES for t in CODE_TASKS], n_code)]
    explain = [form.format(topic=t) for form, t in rng.sample([(f, t) for f in EXPLAIN_FORMS for t in CONCEPTS],
                                                             n_explain)]
    chat = rng.sample(CHAT_REQUESTS, n_chat)
    specs = ([PromptSpec("code-raw", t, False) for t in raw] + [PromptSpec("code-chat", t, True) for t in code]
             + [PromptSpec("explain", t, True) for t in explain + chat]
             + [PromptSpec("math", t, True) for t in math_prompts(n_math, rng)])
    rng.shuffle(specs)
    return specs
