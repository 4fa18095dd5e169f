"""The semantic cache's labelled set, written by hand: intents, each with paraphrases (any
two of one intent should share an answer) and one-slot edits of its first text that must
not (negation, antonym, another entity, another number).

Two splits with no intent in common: ``INTENTS`` (40) tune the threshold and were looked
at while the guard (``guard.py``) was written; ``HELD_OUT_INTENTS`` (20) were written
after both were fixed and only measure them. ``pairs(split)`` expands a split into
labelled pairs: every two paraphrases of an intent are positives; every edit against
every paraphrase of its intent, and the first text of each intent against the next
intent's, are negatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Split = Literal["tuning", "held_out"]


@dataclass(frozen=True, slots=True)
class Pair:
    """Two prompts and whether one's answer may serve the other (``kind`` says why not)."""

    a: str
    b: str
    same: bool
    kind: str  # "paraphrase", "negation", "antonym", "entity", "number", "unrelated"


# (paraphrases, {edit kind: [edits of the first paraphrase]})
INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
    (
        [
            "How do I reverse a list in Python?",
            "What is the way to reverse a Python list?",
            "How can I reverse the order of a list in Python?",
            "Reverse a list in Python: how?",
            "How to reverse a list using Python?",
        ],
        {
            "antonym": ["How do I sort a list in Python?"],
            "entity": ["How do I reverse a list in Haskell?"],
            "negation": ["How do I not reverse a list in Python?"],
        },
    ),
    (
        [
            "What is the capital of France?",
            "Which city is the capital of France?",
            "Tell me the capital city of France.",
            "What city is France's capital?",
            "Name the capital of France.",
        ],
        {
            "entity": ["What is the capital of Germany?", "What is the capital of Spain?"],
            "antonym": ["What is the largest city of France?"],
        },
    ),
    (
        [
            "How many days are there in a leap year?",
            "How many days does a leap year have?",
            "What is the number of days in a leap year?",
            "A leap year has how many days?",
            "Count of days in a leap year?",
        ],
        {
            "negation": ["How many days are there in a year that is not a leap year?"],
            "number": ["How many days are there in 2 leap years?"],
        },
    ),
    (
        [
            "How do I convert a string to an integer in Python?",
            "How can I turn a string into an int in Python?",
            "What is the way to convert a str to an int in Python?",
            "Convert string to integer in Python: how?",
            "How to parse a string as an integer in Python?",
        ],
        {
            "antonym": ["How do I convert an integer to a string in Python?"],
            "entity": ["How do I convert a string to an integer in Java?"],
        },
    ),
    (
        [
            "What is the boiling point of water at sea level?",
            "At sea level, at what temperature does water boil?",
            "What temperature does water boil at sea level?",
            "Boiling point of water at sea level?",
            "At what temperature does water start boiling at sea level?",
        ],
        {
            "antonym": ["What is the freezing point of water at sea level?"],
            "entity": ["What is the boiling point of ethanol at sea level?"],
        },
    ),
    (
        [
            "How do I remove duplicates from a list in Python?",
            "How can I delete duplicate items from a Python list?",
            "What is the best way to deduplicate a list in Python?",
            "Remove duplicate elements from a list in Python: how?",
            "How to get rid of duplicates in a Python list?",
        ],
        {
            "negation": ["How do I find duplicates in a list in Python without removing them?"],
            "entity": ["How do I remove duplicates from a list in JavaScript?"],
        },
    ),
    (
        [
            "Who wrote the novel Pride and Prejudice?",
            "Who is the author of Pride and Prejudice?",
            "Which writer wrote Pride and Prejudice?",
            "Pride and Prejudice was written by whom?",
            "Name the author of the book Pride and Prejudice.",
        ],
        {"entity": ["Who wrote the novel Moby Dick?", "Who wrote the novel War and Peace?"]},
    ),
    (
        [
            "What is the time complexity of binary search?",
            "How fast is binary search in big-O notation?",
            "What is binary search's time complexity?",
            "Big O of binary search?",
            "What is the running time of binary search?",
        ],
        {
            "antonym": ["What is the space complexity of binary search?"],
            "entity": ["What is the time complexity of quicksort?"],
        },
    ),
    (
        [
            "How do I create a virtual environment in Python?",
            "How can I make a Python virtual environment?",
            "What is the command to create a venv in Python?",
            "Create a virtual environment for Python: how?",
            "How to set up a virtualenv in Python?",
        ],
        {
            "antonym": ["How do I delete a virtual environment in Python?"],
            "entity": ["How do I create a virtual environment in Conda?"],
        },
    ),
    (
        [
            "What is 15 percent of 200?",
            "How much is 15% of 200?",
            "Calculate 15 percent of 200.",
            "What do you get when you take 15% of 200?",
            "15 percent of 200 equals what?",
        ],
        {"number": ["What is 25 percent of 200?", "What is 15 percent of 300?"]},
    ),
    (
        [
            "How do I merge two dictionaries in Python?",
            "How can I combine two dicts in Python?",
            "What is the way to merge two Python dictionaries?",
            "Merge two dictionaries in Python: how?",
            "How to join two dictionaries into one in Python?",
        ],
        {
            "number": ["How do I merge three dictionaries in Python?"],
            "entity": ["How do I merge two dictionaries in Ruby?"],
        },
    ),
    (
        [
            "Is it safe to eat raw eggs?",
            "Can I safely eat raw eggs?",
            "Are raw eggs safe to eat?",
            "Is eating raw eggs safe?",
            "Is consuming uncooked eggs safe?",
        ],
        {
            "antonym": ["Is it dangerous to eat raw eggs?"],
            "entity": ["Is it safe to eat raw chicken?"],
        },
    ),
    (
        [
            "How do I read a file line by line in Python?",
            "How can I iterate over the lines of a file in Python?",
            "What is the way to read a text file line by line with Python?",
            "Read a file one line at a time in Python: how?",
            "How to loop through each line of a file in Python?",
        ],
        {
            "antonym": ["How do I write a file line by line in Python?"],
            "entity": ["How do I read a file line by line in Rust?"],
        },
    ),
    (
        [
            "What is the speed of light in a vacuum?",
            "How fast does light travel in a vacuum?",
            "What is light's speed in vacuum?",
            "Speed of light in a vacuum?",
            "At what speed does light move through a vacuum?",
        ],
        {
            "entity": ["What is the speed of sound in a vacuum?"],
            "antonym": ["What is the speed of light in water?"],
        },
    ),
    (
        [
            "How do I sort a dictionary by value in Python?",
            "How can I order a Python dict by its values?",
            "What is the way to sort a dictionary by its values in Python?",
            "Sort a dict by value in Python: how?",
            "How to sort dictionary items by value using Python?",
        ],
        {
            "antonym": ["How do I sort a dictionary by key in Python?"],
            "negation": ["How do I iterate a dictionary in Python without sorting it by value?"],
        },
    ),
    (
        [
            "When did World War II end?",
            "In what year did World War II end?",
            "What year did the Second World War end?",
            "When was the end of World War II?",
            "When did WWII come to an end?",
        ],
        {
            "antonym": ["When did World War II start?"],
            "number": ["When did World War I end?"],
        },
    ),
    (
        [
            "How do I check if a key exists in a Python dictionary?",
            "How can I test whether a dict has a key in Python?",
            "What is the way to see if a key is in a dictionary in Python?",
            "Check if a key is present in a Python dict: how?",
            "How to find out whether a dictionary contains a key in Python?",
        ],
        {
            "negation": ["How do I check that a key does not exist in a Python dictionary?"],
            "antonym": ["How do I check if a value exists in a Python dictionary?"],
        },
    ),
    (
        [
            "What are the symptoms of the flu?",
            "What symptoms does the flu cause?",
            "How do I know if I have the flu?",
            "What are common flu symptoms?",
            "Which symptoms are typical of influenza?",
        ],
        {
            "entity": ["What are the symptoms of measles?", "What are the symptoms of COVID?"],
            "antonym": ["What are the treatments for the flu?"],
        },
    ),
    (
        [
            "How do I undo the last commit in git?",
            "How can I revert my most recent git commit?",
            "What is the way to undo the latest commit in git?",
            "Undo the last git commit: how?",
            "How to roll back the last commit with git?",
        ],
        {
            "antonym": ["How do I undo the first commit in git?"],
            "number": ["How do I undo the last 3 commits in git?"],
        },
    ),
    (
        [
            "How long should I boil an egg for a soft yolk?",
            "How many minutes do I boil an egg to get a soft yolk?",
            "What is the boiling time for a soft-boiled egg?",
            "Boiling time for an egg with a runny yolk?",
            "How long do you boil eggs for soft yolks?",
        ],
        {
            "antonym": ["How long should I boil an egg for a hard yolk?"],
            "number": ["How long should I boil 12 eggs for a soft yolk?"],
        },
    ),
    (
        [
            "How do I center a div horizontally with CSS?",
            "How can I horizontally center a div in CSS?",
            "What is the CSS to center a div horizontally?",
            "Center a div horizontally using CSS: how?",
            "How to align a div to the horizontal center with CSS?",
        ],
        {"antonym": ["How do I center a div vertically with CSS?"]},
    ),
    (
        [
            "What is the population of Japan?",
            "How many people live in Japan?",
            "How large is the population of Japan?",
            "Japan's population is how big?",
            "What is Japan's total population?",
        ],
        {
            "entity": ["What is the population of China?", "What is the population of Tokyo?"],
            "number": ["What was the population of Japan in 1950?"],
        },
    ),
    (
        [
            "How do I convert Celsius to Fahrenheit?",
            "What is the formula to convert Celsius into Fahrenheit?",
            "How can I change a temperature from Celsius to Fahrenheit?",
            "Celsius to Fahrenheit conversion: how?",
            "How to turn degrees Celsius into degrees Fahrenheit?",
        ],
        {"antonym": ["How do I convert Fahrenheit to Celsius?"]},
    ),
    (
        [
            "How do I install numpy with pip?",
            "How can I pip install numpy?",
            "What is the pip command to install numpy?",
            "Install numpy using pip: how?",
            "How to get numpy installed through pip?",
        ],
        {
            "antonym": ["How do I uninstall numpy with pip?"],
            "entity": ["How do I install pandas with pip?"],
        },
    ),
    (
        [
            "What is the tallest mountain in the world?",
            "Which mountain is the highest on Earth?",
            "What is the world's highest mountain?",
            "Name the tallest mountain on the planet.",
            "Which is the highest mountain in the world?",
        ],
        {
            "number": ["What is the second tallest mountain in the world?"],
            "entity": ["What is the tallest mountain in Africa?"],
        },
    ),
    (
        [
            "How do I get the current date in JavaScript?",
            "How can I obtain today's date in JavaScript?",
            "What is the way to get the current date with JavaScript?",
            "Get today's date in JavaScript: how?",
            "How to fetch the current date using JavaScript?",
        ],
        {
            "entity": ["How do I get the current date in Python?"],
            "negation": ["How do I get a date in JavaScript that is not the current date?"],
        },
    ),
    (
        [
            "Should I take ibuprofen on an empty stomach?",
            "Is it okay to take ibuprofen on an empty stomach?",
            "Can ibuprofen be taken on an empty stomach?",
            "Is taking ibuprofen without food okay?",
            "Is it fine to take ibuprofen before eating?",
        ],
        {
            "entity": ["Should I take aspirin on an empty stomach?"],
            "antonym": ["Should I take ibuprofen on a full stomach?"],
        },
    ),
    (
        [
            "How do I find the length of a string in Java?",
            "How can I get a string's length in Java?",
            "What method returns the length of a Java string?",
            "Length of a string in Java: how?",
            "How to count the characters of a string in Java?",
        ],
        {
            "entity": ["How do I find the length of a string in C?"],
            "antonym": ["How do I find the length of an array in Java?"],
        },
    ),
    (
        [
            "What is the square root of 144?",
            "What number squared gives 144?",
            "Calculate the square root of 144.",
            "Square root of 144?",
            "What is sqrt of 144?",
        ],
        {"number": ["What is the square root of 169?", "What is the cube root of 144?"]},
    ),
    (
        [
            "How do I make a cup of green tea?",
            "How should I brew green tea?",
            "What is the right way to prepare green tea?",
            "Brewing a cup of green tea: how?",
            "How to brew a good cup of green tea?",
        ],
        {
            "entity": ["How do I make a cup of black coffee?"],
            "antonym": ["How do I make a pot of green tea cold?"],
        },
    ),
    (
        [
            "How do I list all running processes on Linux?",
            "How can I see every running process in Linux?",
            "What command shows all running processes on Linux?",
            "List running processes on Linux: how?",
            "How to display all processes that are running on Linux?",
        ],
        {
            "entity": ["How do I list all running processes on Windows?"],
            "antonym": ["How do I kill all running processes on Linux?"],
        },
    ),
    (
        [
            "What does HTTP status code 404 mean?",
            "What is the meaning of a 404 HTTP status?",
            "What does a 404 error mean in HTTP?",
            "HTTP 404: what does it mean?",
            "Explain the HTTP 404 status code.",
        ],
        {
            "number": [
                "What does HTTP status code 500 mean?",
                "What does HTTP status code 403 mean?",
            ]
        },
    ),
    (
        [
            "How do I split a string by commas in Python?",
            "How can I break a string on commas in Python?",
            "What is the way to split a comma-separated string in Python?",
            "Split a string at each comma in Python: how?",
            "How to separate a string by commas using Python?",
        ],
        {
            "antonym": ["How do I join a list with commas in Python?"],
            "entity": ["How do I split a string by commas in Go?"],
        },
    ),
    (
        [
            "Who painted the Mona Lisa?",
            "Which artist painted the Mona Lisa?",
            "Who is the painter of the Mona Lisa?",
            "The Mona Lisa was painted by whom?",
            "Name the artist who painted the Mona Lisa.",
        ],
        {"entity": ["Who painted the Sistine Chapel ceiling?", "Who painted The Starry Night?"]},
    ),
    (
        [
            "How do I declare a constant in JavaScript?",
            "How can I define a constant in JavaScript?",
            "What keyword declares a constant in JavaScript?",
            "Declare a constant variable in JavaScript: how?",
            "How to create a constant in JavaScript?",
        ],
        {
            "negation": ["How do I declare a variable that is not constant in JavaScript?"],
            "entity": ["How do I declare a constant in Kotlin?"],
        },
    ),
    (
        [
            "What is the distance from the Earth to the Moon?",
            "How far is the Moon from the Earth?",
            "How far away is the Moon?",
            "What is the Earth-Moon distance?",
            "How many kilometers is it from Earth to the Moon?",
        ],
        {"entity": ["What is the distance from the Earth to the Sun?", "How far is Mars?"]},
    ),
    (
        [
            "How do I delete a branch in git?",
            "How can I remove a git branch?",
            "What is the command to delete a git branch?",
            "Delete a branch with git: how?",
            "How to get rid of a branch in git?",
        ],
        {
            "antonym": ["How do I create a branch in git?", "How do I rename a branch in git?"],
            "negation": ["How do I delete a branch in git without losing its commits?"],
        },
    ),
    (
        [
            "How many calories are in a banana?",
            "How many calories does a banana have?",
            "What is the calorie count of a banana?",
            "Calories in one banana?",
            "How much energy in calories is in a banana?",
        ],
        {
            "entity": ["How many calories are in an apple?"],
            "number": ["How many calories are in 3 bananas?"],
        },
    ),
    (
        [
            "How do I handle exceptions in Python?",
            "How can I catch exceptions in Python?",
            "What is the way to deal with exceptions in Python?",
            "Exception handling in Python: how?",
            "How to use try and except for errors in Python?",
        ],
        {
            "antonym": ["How do I raise exceptions in Python?"],
            "entity": ["How do I handle exceptions in C++?"],
        },
    ),
    (
        [
            "What is the chemical symbol for gold?",
            "Which chemical symbol stands for gold?",
            "What is gold's symbol on the periodic table?",
            "Chemical symbol of gold?",
            "What letters represent gold in chemistry?",
        ],
        {
            "entity": [
                "What is the chemical symbol for silver?",
                "What is the chemical symbol for iron?",
            ]
        },
    ),
]


HELD_OUT_INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
    (
        [
            "How do I copy a file in Python?",
            "How can I duplicate a file using Python?",
            "What is the way to copy a file with Python?",
            "Copy a file in Python: how?",
            "How to make a copy of a file in Python?",
        ],
        {
            "antonym": ["How do I delete a file in Python?"],
            "entity": ["How do I copy a file in Bash?"],
            "number": ["How do I copy 100 files in Python?"],
        },
    ),
    (
        [
            "What is the largest planet in the solar system?",
            "Which planet is the biggest in our solar system?",
            "What is the biggest planet of the solar system?",
            "Name the largest planet in the solar system.",
            "Which is the largest planet orbiting the Sun?",
        ],
        {
            "antonym": ["What is the smallest planet in the solar system?"],
            "number": ["What is the third largest planet in the solar system?"],
        },
    ),
    (
        [
            "How do I check the Python version I have installed?",
            "How can I see which Python version is installed?",
            "What command shows my installed Python version?",
            "Check the installed Python version: how?",
            "How to find out the version of Python installed?",
        ],
        {
            "entity": ["How do I check the Node version I have installed?"],
            "negation": ["How do I check which Python versions are not installed?"],
        },
    ),
    (
        [
            "Who discovered penicillin?",
            "Who was the discoverer of penicillin?",
            "Which scientist discovered penicillin?",
            "Penicillin was discovered by whom?",
            "Name the person who discovered penicillin.",
        ],
        {"entity": ["Who discovered insulin?", "Who discovered radium?"]},
    ),
    (
        [
            "How do I convert a list to a set in Python?",
            "How can I turn a Python list into a set?",
            "What is the way to make a set from a list in Python?",
            "Convert a list into a set in Python: how?",
            "How to change a list to a set using Python?",
        ],
        {
            "antonym": ["How do I convert a set to a list in Python?"],
            "entity": ["How do I convert a list to a set in Java?"],
        },
    ),
    (
        [
            "How many bones are in the adult human body?",
            "How many bones does an adult human have?",
            "What is the number of bones in an adult human body?",
            "An adult human body has how many bones?",
            "Count of bones in the adult human skeleton?",
        ],
        {
            "antonym": ["How many bones are in a newborn human body?"],
            "entity": ["How many bones are in the adult cat body?"],
        },
    ),
    (
        [
            "How do I make a GET request in JavaScript?",
            "How can I send a GET request with JavaScript?",
            "What is the way to do an HTTP GET in JavaScript?",
            "Make a GET request using JavaScript: how?",
            "How to perform a GET request in JavaScript?",
        ],
        {
            "entity": ["How do I make a POST request in JavaScript?"],
            "antonym": ["How do I cancel a GET request in JavaScript?"],
        },
    ),
    (
        [
            "What is the melting point of iron?",
            "At what temperature does iron melt?",
            "What temperature does iron melt at?",
            "Melting point of iron?",
            "How hot must iron get to melt?",
        ],
        {
            "entity": ["What is the melting point of copper?", "What is the melting point of ice?"],
            "antonym": ["What is the boiling point of iron?"],
        },
    ),
    (
        [
            "How do I rename a file in Linux?",
            "How can I change a file's name on Linux?",
            "What command renames a file in Linux?",
            "Rename a file on Linux: how?",
            "How to give a file a new name in Linux?",
        ],
        {
            "antonym": ["How do I delete a file in Linux?"],
            "entity": ["How do I rename a file in Windows?"],
        },
    ),
    (
        [
            "What is the currency of Japan?",
            "Which currency is used in Japan?",
            "What money do they use in Japan?",
            "Japan's currency is what?",
            "Name the official currency of Japan.",
        ],
        {"entity": ["What is the currency of Brazil?", "What is the currency of Switzerland?"]},
    ),
    (
        [
            "How do I find the maximum value in a list in Python?",
            "How can I get the largest element of a Python list?",
            "What is the way to find the max of a list in Python?",
            "Find the maximum of a list in Python: how?",
            "How to get the biggest number in a Python list?",
        ],
        {
            "antonym": ["How do I find the minimum value in a list in Python?"],
            "number": ["How do I find the 3 largest values in a list in Python?"],
        },
    ),
    (
        [
            "How long does it take to cook rice?",
            "How many minutes does rice take to cook?",
            "What is the cooking time for rice?",
            "Cooking time for rice?",
            "How long should rice be cooked?",
        ],
        {
            "entity": [
                "How long does it take to cook pasta?",
                "How long does it take to cook quinoa?",
            ],
            "number": ["How long does it take to cook 5 kilograms of rice?"],
        },
    ),
    (
        [
            "How do I add a column to a table in SQL?",
            "How can I add a new column to an SQL table?",
            "What is the SQL to add a column to a table?",
            "Add a column to a table in SQL: how?",
            "How to insert a new column into a table with SQL?",
        ],
        {
            "antonym": ["How do I drop a column from a table in SQL?"],
            "number": ["How do I add two columns to a table in SQL?"],
        },
    ),
    (
        [
            "Why is the sky blue?",
            "What makes the sky blue?",
            "Why does the sky look blue?",
            "What is the reason the sky is blue?",
            "Why does the sky appear blue during the day?",
        ],
        {
            "antonym": ["Why is the sunset red?"],
            "negation": ["Why is the sky not blue at night?"],
        },
    ),
    (
        [
            "How do I get the length of a list in Python?",
            "How can I find how many items a Python list has?",
            "What function gives the length of a list in Python?",
            "Length of a list in Python: how?",
            "How to count the elements in a Python list?",
        ],
        {
            "entity": ["How do I get the length of a list in Perl?"],
            "antonym": ["How do I get the sum of a list in Python?"],
        },
    ),
    (
        [
            "Who was the first person to walk on the Moon?",
            "Who first walked on the Moon?",
            "Which astronaut was the first to walk on the Moon?",
            "Name the first person who walked on the Moon.",
            "Who was the first human to set foot on the Moon?",
        ],
        {
            "number": ["Who was the second person to walk on the Moon?"],
            "entity": ["Who was the first person to walk in space?"],
        },
    ),
    (
        [
            "How do I generate a random number in Python?",
            "How can I get a random number in Python?",
            "What is the way to produce a random number with Python?",
            "Generate a random number in Python: how?",
            "How to create a random number using Python?",
        ],
        {
            "entity": ["How do I generate a random number in Excel?"],
            "number": ["How do I generate a random number between 1 and 10 in Python?"],
        },
    ),
    (
        [
            "What is the freezing point of water in Fahrenheit?",
            "At what Fahrenheit temperature does water freeze?",
            "What temperature in Fahrenheit does water freeze at?",
            "Freezing point of water in Fahrenheit?",
            "In Fahrenheit, when does water freeze?",
        ],
        {
            "entity": ["What is the freezing point of water in Kelvin?"],
            "antonym": ["What is the boiling point of water in Fahrenheit?"],
        },
    ),
    (
        [
            "How do I stop a running Docker container?",
            "How can I stop a Docker container that is running?",
            "What command stops a running Docker container?",
            "Stop a running Docker container: how?",
            "How to halt a running container in Docker?",
        ],
        {
            "antonym": ["How do I start a stopped Docker container?"],
            "number": ["How do I stop all running Docker containers?"],
        },
    ),
    (
        [
            "What is the difference between a list and a tuple in Python?",
            "How does a Python list differ from a tuple?",
            "What distinguishes lists from tuples in Python?",
            "List versus tuple in Python: what is the difference?",
            "How are lists and tuples different in Python?",
        ],
        {
            "entity": ["What is the difference between a list and a set in Python?"],
            "negation": ["What do a list and a tuple in Python not have in common?"],
        },
    ),
]


def pairs(split: Split) -> list[Pair]:
    """The labelled pairs of one split."""
    chosen = list(enumerate(INTENTS if split == "tuning" else HELD_OUT_INTENTS))
    out: list[Pair] = []
    for pos, (_, (paras, edits)) in enumerate(chosen):
        for x in range(len(paras)):
            for y in range(x + 1, len(paras)):
                out.append(Pair(paras[x], paras[y], True, "paraphrase"))
        for kind, texts in edits.items():
            for edit in texts:
                out += [Pair(p, edit, False, kind) for p in paras]
        nxt = chosen[(pos + 1) % len(chosen)][1][0]
        out.append(Pair(paras[0], nxt[0], False, "unrelated"))
    return out
