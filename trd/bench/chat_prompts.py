"""User messages of the real pair's chat workload: written here, nothing downloaded.

Varied on purpose (explanation, code, arithmetic, writing, advice, lists, facts), so
the small model is unsure at different places and the large model is asked for a
share of tokens that depends on the prompt.
"""

from __future__ import annotations

CHAT_PROMPTS = (
    "Explain why the sky is blue to a ten-year-old.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What is 17 multiplied by 23? Show your steps.",
    "Give me three tips for sleeping better.",
    "Write a short poem about autumn leaves.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet in four sentences.",
    "How do I make a simple tomato soup?",
    "Explain what a hash table is and when to use one.",
    "List five countries in South America and their capitals.",
    "Write an email asking my manager for a day off next Friday.",
    "Why do we have seasons on Earth?",
    "What are the main causes of inflation?",
    "Translate 'Good morning, how are you?' into French and Spanish.",
    "Write a haiku about the sea.",
    "How does a bicycle stay upright when it moves?",
    "Explain recursion with a small example in JavaScript.",
    "What should I pack for a three-day hiking trip?",
    "Describe the water cycle step by step.",
    "Write a SQL query that returns the ten most recent orders from a table named orders.",
    "What is photosynthesis?",
    "Give me a weekly workout plan for a beginner.",
    "Tell me a short story about a robot who learns to paint.",
    "How do vaccines train the immune system?",
    "Compare electric cars and petrol cars in a few bullet points.",
    "What is the Pythagorean theorem, and how is it used?",
    "Write a limerick about a cat who loves coffee.",
    "Explain the difference between weather and climate.",
    "How can I improve my public speaking?",
    "Write a bash command that counts the lines of every .py file in a folder.",
    "What happened during the French Revolution, briefly?",
    "Suggest a name and a slogan for a small bakery.",
)
