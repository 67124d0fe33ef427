"""Prompts for training routers (`tokenrouterd train-router --prompts`).

chat    64 written prompts (TRAIN_CHAT_PROMPTS below; nothing downloaded), through the
        small model's chat template.
code    96 small coding tasks written here (CODE_PROMPTS below: Python mostly, some
        JavaScript, SQL, shell, Go, Rust and C; writing, fixing and explaining code), the
        default for the demo pair of code models. None is a HumanEval problem or one of
        its topics (`tokenrouterd eval humaneval` judges the heads on those).
magpie  questions the large model writes itself (`trd/routers/magpie.py`), as many as
        asked for, rendered by the small model's chat template.
corpus  the fixture pair (trained on plain text): prompts cut from held-out fixture
        documents, the first half of the documents for training (the second half judges,
        trd/evals/routing/judging.py, with the bench's chat prompts, which share no
        message with these).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer

from trd.frontend.tokens import PromptEncoder
from trd.routers import magpie
from trd.testing.tinymodels.corpus import corpus

Split = Literal["train", "eval"]
MAGPIE_SEED = 2
# Asked for beyond `count`: some questions run past 64 tokens or repeat.
MAGPIE_SPARE = 1.25

TRAIN_CHAT_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a Python function that returns the largest number in a list.",
    "What is 48 divided by 6? Explain briefly.",
    "Give me four ideas for a rainy afternoon at home.",
    "Write a short poem about a lighthouse.",
    "What is the difference between a virus and a bacterium?",
    "Summarise the story of Cinderella in three sentences.",
    "How do I cook rice on the stove?",
    "Explain what an API is to a beginner.",
    "List five animals that live in the ocean.",
    "Write a thank-you note to a teacher.",
    "Why does ice float on water?",
    "What are the benefits of regular exercise?",
    "Translate 'Where is the train station?' into German.",
    "Write a haiku about snow.",
    "How does a rainbow form?",
    "Explain what a for loop does, with a short example in Python.",
    "What should I bring to a picnic?",
    "Describe how bees make honey.",
    "Write a SQL query that counts the rows in a table named users.",
    "What is gravity?",
    "Give me a simple plan to learn to play the guitar.",
    "Tell me a short story about a dragon who is afraid of the dark.",
    "How do plants get water from the soil?",
    "Compare cats and dogs as pets in a few bullet points.",
    "What is a prime number? Give three examples.",
    "Write a limerick about a forgetful wizard.",
    "Explain the difference between speed and velocity.",
    "How can I stay focused while studying?",
    "Write a shell command that lists the five largest files in a folder.",
    "What was the Industrial Revolution, in a few sentences?",
    "Suggest three names for a coffee shop.",
    "Explain how the heart pumps blood.",
    "Write a JavaScript function that reverses a string.",
    "What is the square root of 144, and why?",
    "Give me tips for writing a good resume.",
    "Write a four-line poem about the moon.",
    "What is the difference between RAM and storage?",
    "Summarise the plot of The Three Little Pigs.",
    "How do I make pancakes?",
    "Explain what a binary search is.",
    "Name four planets of the solar system and one fact about each.",
    "Write a short message inviting friends to a birthday party.",
    "Why do leaves change colour in autumn?",
    "What are renewable energy sources?",
    "Translate 'Thank you very much' into Italian and Portuguese.",
    "Write a haiku about a city at night.",
    "How does an airplane stay in the air?",
    "Explain what a variable is in programming.",
    "What should I do if I feel stressed before an exam?",
    "Describe how a volcano erupts.",
    "Write a regular expression that matches an email address, and explain it.",
    "What is electricity?",
    "Give me a three-day meal plan for a vegetarian.",
    "Tell me a short story about a cat who becomes a detective.",
    "How does the internet send a message from one computer to another?",
    "List the pros and cons of working from home.",
    "What is the area of a circle with radius 3?",
    "Write a limerick about a dog who loves the beach.",
    "Explain the difference between a simile and a metaphor.",
    "How can I save money each month?",
    "Write a Python one-liner that sums the squares of the numbers from 1 to 10.",
    "What is democracy, briefly?",
    "Suggest a name and a motto for a school robotics club.",
)

CODE_PROMPTS = (
    "Write a Python function that splits a list into chunks of size n.",
    "Write a Python function that flattens a nested list of any depth.",
    "Write a Python function that merges two dictionaries, adding the values of shared keys.",
    "Write a Python function that converts a snake_case string to camelCase.",
    "Write a Python function that checks whether a string is a valid IPv4 address.",
    "Write a Python function that counts how often each word appears in a text file.",
    "Write a Python function that returns the n most common words in a string.",
    "Write a Python class for a stack with push, pop and peek.",
    "Write a Python class for a queue built from two stacks.",
    "Write a Python function that reads a JSON file and returns its top-level keys.",
    "Write a Python function that writes a list of dicts to a CSV file.",
    "Write a Python function that groups a list of dicts by the value of a given key.",
    "Write a Python function that removes None values from a dictionary, recursively.",
    "Write a Python function that returns the difference in days between two ISO dates.",
    "Write a Python function that rotates a matrix 90 degrees clockwise.",
    "Write a Python function that transposes a list of lists.",
    "Write a Python function that finds the first non-repeating character in a string.",
    "Write a Python function that computes a running average of a list of numbers.",
    "Write a Python function that retries another function up to three times on exception.",
    "Write a Python decorator that prints how long a function took.",
    "Write a Python context manager that changes the working directory and restores it.",
    "Write a Python generator that yields the lines of a file without the newline.",
    "Write a Python function that validates a password: 8+ characters, a digit, a capital.",
    "Write a Python function that masks all but the last four digits of a card number.",
    "Write a Python function that converts a temperature between Celsius and Fahrenheit.",
    "Write a Python function that returns the file extension of a path, lowercased.",
    "Write a Python function that lists every .py file under a folder, recursively.",
    "Write a Python function that deduplicates lines of a file, keeping their order.",
    "Write a Python function that parses 'key=value' pairs separated by semicolons.",
    "Write a Python function that formats a number of bytes as KB, MB or GB.",
    "Write a Python function that slugifies a title for a URL.",
    "Write a Python function that returns the depth of a binary tree.",
    "Write a Python function for breadth-first search on a graph given as a dict.",
    "Write a Python function that detects a cycle in a directed graph.",
    "Write a Python function that does a topological sort of tasks with dependencies.",
    "Write a Python function that merges overlapping intervals.",
    "Write a Python function that checks whether any two meetings in a list of "
    "(start, end) overlap.",
    "Write a Python function that computes the Levenshtein distance of two strings.",
    "Write a Python function that implements binary search on a sorted list.",
    "Write a Python function that implements merge sort.",
    "Write a Python class for an LRU cache with get and put.",
    "Write a Python dataclass for a bank account with deposit and withdraw methods.",
    "Write a Python function that sends a GET request with requests and returns the JSON.",
    "Write a Python function that downloads a file in chunks and shows progress.",
    "Write a small Flask app with one endpoint that returns the current time as JSON.",
    "Write a FastAPI endpoint that accepts a JSON body with a name and returns a greeting.",
    "Write a Python script that takes a folder name from the command line with argparse.",
    "Write a Python function that runs a shell command and returns its output.",
    "Write a Python function that loads a CSV with pandas and prints the mean of each column.",
    "Write a pandas snippet that keeps the rows of a DataFrame where age is over 30.",
    "Write a numpy function that normalises each row of a matrix to unit length.",
    "Write a Python unittest for a function that turns '3h20m' into 200 minutes.",
    "Write a pytest test that checks a function raises ValueError on empty input.",
    "Write a Python function that uses asyncio to fetch three URLs concurrently.",
    "Write a Python function that uses a thread pool to square a list of numbers.",
    "Write a Python regular expression that extracts every hashtag from a tweet.",
    "Write a Python function that parses a log line like '2024-01-02 ERROR disk full'.",
    "Write a Python function that merges k sorted lists with heapq.",
    "Write a Python function that capitalises the first letter of every sentence in a text.",
    "Write a Python function that returns a dict of each character's positions in a string.",
    "Fix this Python code: `for i in range(len(items)): if items[i] == target: return i`.",
    "Why does `def log(msg, seen=[]): seen.append(msg); return seen` keep old messages?",
    "Explain what `zip(*matrix)` does in Python, with an example.",
    "Explain the difference between a list and a tuple in Python.",
    "Explain Python's `with` statement and give an example.",
    "Explain list comprehensions in Python with two examples.",
    "What does `if __name__ == '__main__':` do in a Python script?",
    "Explain the difference between `is` and `==` in Python.",
    "Convert this loop to a list comprehension: `out = []; for x in xs: out.append(x * 2)`.",
    "Rewrite this Python function with type hints: `def area(w, h): return w * h`.",
    "Write a JavaScript function that debounces another function.",
    "Write a JavaScript function that deep-clones an object.",
    "Write a JavaScript function that groups an array of objects by a key.",
    "Write a JavaScript fetch call that posts JSON and handles errors.",
    "Write a JavaScript function that capitalises every word of a string.",
    "Write a TypeScript interface for a user with an id, a name and an optional email.",
    "Write a React component that shows a counter with increment and reset buttons.",
    "Write a Node.js script that reads a file and prints how many lines it has.",
    "Write a SQL query that returns the three customers with the highest total orders.",
    "Write a SQL query that finds duplicate email addresses in a users table.",
    "Write a SQL query that joins orders and customers and counts orders per city.",
    "Write a SQL statement that creates a table for blog posts with a foreign key to users.",
    "Write a SQL query that returns each department's average salary, highest first.",
    "Write a bash script that backs up a folder into a dated tar.gz file.",
    "Write a bash one-liner that finds files modified in the last day.",
    "Write a bash script that renames every .jpeg file in a folder to .jpg.",
    "Write a bash loop that pings three hosts and prints which are down.",
    "Write a Go function that reverses the words of a sentence.",
    "Write a Go HTTP handler that returns 'ok' with status 200.",
    "Write a Rust function that returns the longest word in a sentence.",
    "Write a Rust struct for a point with a method that returns its distance to the origin.",
    "Write a C function that copies a string into a buffer safely.",
    "Write a C function that swaps two integers through pointers.",
    "Write a Dockerfile for a small Python web app that uses requirements.txt.",
    "Write a .gitignore for a Python project.",
    "Write a Python function that pads every line of a text to the same width.",
)

WRITTEN = {"chat": TRAIN_CHAT_PROMPTS, "code": CODE_PROMPTS}


def prompts(
    source: str, small_dir: Path, count: int, large_dir: Path | None = None
) -> list[list[int]]:
    """Up to `count` training prompts as token ids, of this source (magpie's questions are
    written by the model in large_dir)."""
    if source == "corpus":
        return corpus_prompts(small_dir, "train", count)
    if source in WRITTEN:
        return chat_prompts(small_dir, WRITTEN[source], count)
    if source != "magpie":
        raise ValueError(f"{source} prompts judge heads; train on chat, code, magpie or corpus")
    if large_dir is None:
        raise ValueError("magpie prompts need the large model that writes them")
    asked = math.ceil(count * MAGPIE_SPARE)
    texts = magpie.questions(large_dir, asked, seed=MAGPIE_SEED)
    return chat_prompts(small_dir, texts, count)


def chat_prompts(small_dir: Path, texts: Sequence[str], count: int) -> list[list[int]]:
    """The first `count` user messages, each alone in a chat, as the small model's prompt."""
    encoder = PromptEncoder(small_dir)
    return [encoder.chat([{"role": "user", "content": t}]) for t in texts[:count]]


def corpus_prompts(small_dir: Path, split: Split, count: int) -> list[list[int]]:
    """Up to `count` 24-token prompts cut from held-out fixture documents: the first half of
    them for training, the second for judging."""
    tok = Tokenizer.from_file(str(small_dir / "tokenizer.json"))
    docs = corpus("heldout")
    half = docs[: len(docs) // 2] if split == "train" else docs[len(docs) // 2 :]
    out: list[list[int]] = []
    for offset in range(0, 400, 48):  # several prompts per document, 24 tokens each
        for doc in half:
            ids = tok.encode(doc).ids[offset : offset + 24]
            if len(ids) == 24:
                out.append(ids)
            if len(out) == count:
                return out
    return out
