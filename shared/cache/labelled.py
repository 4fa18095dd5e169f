"""The semantic cache's labelled set, written by hand: intents, each with paraphrases (any
two of one intent should share an answer) and one-slot edits of its first text that must
not (negation, antonym, another entity, another number).

Two splits with no intent in common. The tuning split is every intent that was looked at
while the guard (``guard.py``) and its threshold were written: ``INTENTS`` (40), then
``SEEN_HELD_OUT_INTENTS`` (20) and ``SEEN_LATER_INTENTS`` (40), each once a held-out set
whose false hits were read and taught the guard something (quantifiers such as "all",
superlatives, words of one kind, "when" against "where", a count against the thing
counted), so no longer held out. ``HELD_OUT_INTENTS`` (40) were written after the guard
and the threshold were fixed, and only measure them. ``pairs(split)`` expands a split into
labelled pairs: every two paraphrases of an intent are positives; every edit against every
paraphrase of its intent, and the first text of each intent against the next intent's, are
negatives.
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


SEEN_HELD_OUT_INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
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


SEEN_LATER_INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
    (
        [
            "How do I check the installed version of Node.js?",
            "How can I see which Node.js version is installed?",
            "What command shows the Node.js version?",
            "Check the Node.js version: how?",
            "How to find out what version of Node.js I have?",
        ],
        {
            "entity": ["How do I check the installed version of Python?"],
            "negation": ["How do I check the Node.js version without running node?"],
        },
    ),
    (
        [
            "What is the chemical formula of table salt?",
            "Which chemical formula does table salt have?",
            "What is the formula for table salt?",
            "Table salt's chemical formula?",
            "Give the chemical formula of common salt.",
        ],
        {
            "entity": ["What is the chemical formula of baking soda?"],
            "antonym": ["What is the chemical name of table salt?"],
        },
    ),
    (
        [
            "How do I rename a column in a pandas DataFrame?",
            "How can I change a column name in pandas?",
            "What is the way to rename a DataFrame column in pandas?",
            "Rename a pandas column: how?",
            "How to give a pandas DataFrame column a new name?",
        ],
        {
            "antonym": ["How do I drop a column in a pandas DataFrame?"],
            "number": ["How do I rename every column in a pandas DataFrame?"],
        },
    ),
    (
        [
            "How long does it take for light from the Sun to reach Earth?",
            "How many minutes does sunlight need to get to Earth?",
            "What is the travel time of light from the Sun to the Earth?",
            "Sunlight takes how long to reach the Earth?",
            "How long is light from the Sun in transit before it hits Earth?",
        ],
        {
            "entity": ["How long does it take for light from the Sun to reach Mars?"],
            "antonym": ["How long does it take for light from the Earth to reach the Sun?"],
        },
    ),
    (
        [
            "How do I center a div horizontally with CSS?",
            "How can I horizontally center a div in CSS?",
            "What CSS centers a div horizontally?",
            "Center a div horizontally using CSS: how?",
            "How to align a div to the horizontal center with CSS?",
        ],
        {
            "antonym": ["How do I center a div vertically with CSS?"],
            "negation": ["How do I keep a div from being centered with CSS?"],
        },
    ),
    (
        [
            "What is the square root of 81?",
            "What number squared gives 81?",
            "Calculate the square root of 81.",
            "Square root of 81?",
            "What is sqrt(81)?",
        ],
        {
            "number": ["What is the square root of 64?"],
            "antonym": ["What is the square of 81?"],
        },
    ),
    (
        [
            "How do I install a package with npm?",
            "How can I add a package using npm?",
            "What is the npm command to install a package?",
            "Install a package via npm: how?",
            "How to get a package installed with npm?",
        ],
        {
            "antonym": ["How do I uninstall a package with npm?"],
            "entity": ["How do I install a package with yarn?"],
        },
    ),
    (
        [
            "Who discovered penicillin?",
            "Which scientist discovered penicillin?",
            "Penicillin was discovered by whom?",
            "Who was the discoverer of penicillin?",
            "Name the person who discovered penicillin.",
        ],
        {
            "entity": ["Who discovered insulin?"],
            "antonym": ["Who first mass-produced penicillin?"],
        },
    ),
    (
        [
            "How do I make a GET request in Python?",
            "How can I send a GET request with Python?",
            "What is the way to do an HTTP GET in Python?",
            "Make a GET request using Python: how?",
            "How to perform a GET request from Python?",
        ],
        {
            "entity": ["How do I make a POST request in Python?"],
            "number": ["How do I make 100 GET requests in parallel in Python?"],
        },
    ),
    (
        [
            "How many bones are in the adult human body?",
            "How many bones does an adult human have?",
            "What is the number of bones in an adult's body?",
            "An adult human body has how many bones?",
            "Count of bones in the adult human skeleton?",
        ],
        {
            "entity": ["How many bones are in a baby's body?"],
            "antonym": ["How many muscles are in the adult human body?"],
        },
    ),
    (
        [
            "How do I find the length of a list in Python?",
            "How can I get the number of items in a Python list?",
            "What is the way to count the elements of a list in Python?",
            "Length of a list in Python: how?",
            "How to get a Python list's size?",
        ],
        {
            "entity": ["How do I find the length of a string in Python?"],
            "antonym": ["How do I find the sum of a list in Python?"],
        },
    ),
    (
        [
            "What is the currency of Japan?",
            "Which currency does Japan use?",
            "What money is used in Japan?",
            "Japan's currency is what?",
            "Name the official currency of Japan.",
        ],
        {
            "entity": ["What is the currency of Switzerland?"],
            "antonym": ["What is the language of Japan?"],
        },
    ),
    (
        [
            "How do I create a new branch in git?",
            "How can I make a new git branch?",
            "What is the git command to create a branch?",
            "Create a new branch with git: how?",
            "How to start a new branch in git?",
        ],
        {
            "antonym": ["How do I merge a branch in git?"],
            "negation": ["How do I create a new branch in git without switching to it?"],
        },
    ),
    (
        [
            "How many ounces are in a pound?",
            "How many ounces make up one pound?",
            "What is the number of ounces in a pound?",
            "A pound equals how many ounces?",
            "Ounces per pound?",
        ],
        {
            "number": ["How many ounces are in 3 pounds?"],
            "entity": ["How many grams are in a pound?"],
        },
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
            "What is the tallest building in the world?",
            "Which building is the tallest on Earth?",
            "What is the world's tallest building?",
            "Name the tallest building in the world.",
            "Which is the highest skyscraper in the world?",
        ],
        {
            "number": ["What is the second tallest building in the world?"],
            "entity": ["What is the tallest building in Europe?"],
        },
    ),
    (
        [
            "How do I take a screenshot on Windows?",
            "How can I capture my screen on Windows?",
            "What is the shortcut for a screenshot on Windows?",
            "Take a screenshot in Windows: how?",
            "How to screenshot the screen on a Windows PC?",
        ],
        {
            "entity": ["How do I take a screenshot on a Mac?"],
            "number": ["How do I take a screenshot of only one window on Windows?"],
        },
    ),
    (
        [
            "What causes the seasons on Earth?",
            "Why does Earth have seasons?",
            "What is the reason for the seasons on Earth?",
            "Earth's seasons are caused by what?",
            "Why do seasons happen on Earth?",
        ],
        {
            "entity": ["What causes the seasons on Mars?"],
            "antonym": ["What causes the tides on Earth?"],
        },
    ),
    (
        [
            "How do I exit Vim?",
            "How can I quit Vim?",
            "What is the command to leave Vim?",
            "Exit the Vim editor: how?",
            "How to close Vim?",
        ],
        {
            "negation": ["How do I exit Vim without saving?"],
            "entity": ["How do I exit Emacs?"],
        },
    ),
    (
        [
            "How many players are on a soccer team on the field?",
            "How many players does a soccer team have on the pitch?",
            "What is the number of players per soccer team on the field?",
            "A soccer team fields how many players?",
            "Number of players on the field for one soccer team?",
        ],
        {
            "entity": ["How many players are on a basketball team on the court?"],
            "number": ["How many players are on the field in a soccer match with both teams?"],
        },
    ),
    (
        [
            "How do I get the current time in Python?",
            "How can I find the current time with Python?",
            "What is the way to get the time now in Python?",
            "Current time in Python: how?",
            "How to obtain the present time using Python?",
        ],
        {
            "entity": ["How do I get the current time in Go?"],
            "antonym": ["How do I get the current date in Python?"],
        },
    ),
    (
        [
            "What is the largest ocean on Earth?",
            "Which ocean is the biggest on Earth?",
            "What is the world's largest ocean?",
            "Name the largest ocean in the world.",
            "Which is the biggest ocean on the planet?",
        ],
        {
            "antonym": ["What is the smallest ocean on Earth?"],
            "entity": ["What is the largest desert on Earth?"],
        },
    ),
    (
        [
            "How do I delete a file in Linux?",
            "How can I remove a file on Linux?",
            "What command deletes a file in Linux?",
            "Delete a file from the Linux command line: how?",
            "How to erase a file on a Linux system?",
        ],
        {
            "entity": ["How do I delete a directory in Linux?"],
            "number": ["How do I delete all files in a folder in Linux?"],
        },
    ),
    (
        [
            "How much water should an adult drink per day?",
            "How much water does an adult need to drink daily?",
            "What is the recommended daily water intake for adults?",
            "Daily water intake for an adult: how much?",
            "How many liters of water should a grown-up drink each day?",
        ],
        {
            "entity": ["How much water should a dog drink per day?"],
            "antonym": ["How much coffee should an adult drink per day?"],
        },
    ),
    (
        [
            "How do I join a list of strings in Python?",
            "How can I concatenate a list of strings in Python?",
            "What is the way to combine a list of strings into one string in Python?",
            "Join strings from a list in Python: how?",
            "How to merge a list of strings into a single string with Python?",
        ],
        {
            "antonym": ["How do I split a string into a list in Python?"],
            "entity": ["How do I join a list of strings in Rust?"],
        },
    ),
    (
        [
            "When was the Eiffel Tower built?",
            "In what year was the Eiffel Tower constructed?",
            "What year was the Eiffel Tower completed?",
            "The Eiffel Tower was built when?",
            "When did construction of the Eiffel Tower finish?",
        ],
        {
            "entity": ["When was the Statue of Liberty built?"],
            "antonym": ["Where was the Eiffel Tower built?"],
        },
    ),
    (
        [
            "How do I check if a string contains a substring in JavaScript?",
            "How can I tell whether a JavaScript string includes a substring?",
            "What is the way to test for a substring in a JavaScript string?",
            "Check for a substring in JavaScript: how?",
            "How to find out if a string has a substring in JavaScript?",
        ],
        {
            "entity": ["How do I check if a string contains a substring in Bash?"],
            "negation": [
                "How do I check that a string does not contain a substring in JavaScript?"
            ],
        },
    ),
    (
        [
            "What is the melting point of iron?",
            "At what temperature does iron melt?",
            "What temperature is needed to melt iron?",
            "Melting point of iron?",
            "Iron melts at what temperature?",
        ],
        {
            "entity": ["What is the melting point of copper?"],
            "antonym": ["What is the boiling point of iron?"],
        },
    ),
    (
        [
            "How do I restart the nginx service?",
            "How can I restart nginx?",
            "What command restarts the nginx service?",
            "Restart nginx: how?",
            "How to reboot the nginx service?",
        ],
        {
            "antonym": ["How do I stop the nginx service?"],
            "entity": ["How do I restart the Apache service?"],
        },
    ),
    (
        [
            "How many continents are there?",
            "How many continents does the world have?",
            "What is the number of continents on Earth?",
            "The Earth has how many continents?",
            "Count of continents in the world?",
        ],
        {
            "antonym": ["How many oceans are there?"],
            "entity": ["How many countries are there?"],
        },
    ),
    (
        [
            "How do I sort an array of numbers in JavaScript?",
            "How can I sort a numeric array in JavaScript?",
            "What is the way to sort numbers in a JavaScript array?",
            "Sort an array of numbers with JavaScript: how?",
            "How to order a JavaScript array of numbers?",
        ],
        {
            "antonym": ["How do I sort an array of numbers in descending order in JavaScript?"],
            "entity": ["How do I sort an array of strings in JavaScript?"],
        },
    ),
    (
        [
            "What is the distance from London to Paris?",
            "How far is Paris from London?",
            "How many kilometers separate London and Paris?",
            "London to Paris distance?",
            "How far apart are London and Paris?",
        ],
        {
            "entity": ["What is the distance from London to Berlin?"],
            "antonym": ["What is the flight time from London to Paris?"],
        },
    ),
    (
        [
            "How do I add a user in Linux?",
            "How can I create a new user on Linux?",
            "What command adds a user account in Linux?",
            "Add a new user on a Linux system: how?",
            "How to make a user account on Linux?",
        ],
        {
            "antonym": ["How do I delete a user in Linux?"],
            "number": ["How do I add several users at once in Linux?"],
        },
    ),
    (
        [
            "Is coffee bad for your heart?",
            "Does coffee harm the heart?",
            "Is drinking coffee harmful to the heart?",
            "Can coffee damage your heart?",
            "Is coffee unhealthy for the heart?",
        ],
        {
            "antonym": ["Is coffee good for your heart?"],
            "entity": ["Is coffee bad for your liver?"],
        },
    ),
    (
        [
            "How do I find the maximum value in a Python list?",
            "How can I get the largest number in a list in Python?",
            "What is the way to find the biggest element of a Python list?",
            "Max of a list in Python: how?",
            "How to get the highest value from a list with Python?",
        ],
        {
            "antonym": ["How do I find the minimum value in a Python list?"],
            "number": ["How do I find the two largest values in a Python list?"],
        },
    ),
    (
        [
            "What language is spoken in Brazil?",
            "Which language do people speak in Brazil?",
            "What is the official language of Brazil?",
            "Brazil's language is what?",
            "What language do Brazilians speak?",
        ],
        {
            "entity": ["What language is spoken in Argentina?"],
            "number": ["How many languages are spoken in Brazil?"],
        },
    ),
    (
        [
            "How do I undo git add before a commit?",
            "How can I unstage a file I added with git add?",
            "What is the way to reverse git add before committing?",
            "Undo a git add: how?",
            "How to remove a file from the staging area in git?",
        ],
        {
            "number": ["How do I undo git add for all files before a commit?"],
            "antonym": ["How do I undo git commit before a push?"],
        },
    ),
    (
        [
            "How long should I cook rice?",
            "How many minutes does rice take to cook?",
            "What is the cooking time for rice?",
            "Rice needs to cook for how long?",
            "How long does it take to cook rice?",
        ],
        {
            "entity": ["How long should I cook pasta?"],
            "antonym": ["How long should I soak rice?"],
        },
    ),
    (
        [
            "How do I print without a newline in Python?",
            "How can I print in Python without a line break?",
            "What is the way to print on the same line in Python?",
            "Print without a newline in Python: how?",
            "How to stop print from adding a newline in Python?",
        ],
        {
            "negation": ["How do I print a newline in Python?"],
            "entity": ["How do I print without a newline in C?"],
        },
    ),
    (
        [
            "What is the population of Canada?",
            "How many people live in Canada?",
            "How large is Canada's population?",
            "Canada's population is how big?",
            "What is the total population of Canada?",
        ],
        {
            "entity": ["What is the population of Mexico?"],
            "antonym": ["What is the area of Canada?"],
        },
    ),
]

HELD_OUT_INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
    (
        [
            "How do I list the files in a directory in Python?",
            "How can I get all file names in a folder with Python?",
            "What is the way to list a directory's contents in Python?",
            "List files in a directory using Python: how?",
            "How to enumerate the files inside a folder in Python?",
        ],
        {
            "entity": ["How do I list the files in a directory in PowerShell?"],
            "antonym": ["How do I delete the files in a directory in Python?"],
        },
    ),
    (
        [
            "What is the boiling point of water in Fahrenheit?",
            "At what Fahrenheit temperature does water boil?",
            "Water boils at how many degrees Fahrenheit?",
            "Boiling point of water in degrees Fahrenheit?",
            "In Fahrenheit, at what temperature does water boil?",
        ],
        {
            "entity": ["What is the boiling point of water in Kelvin?"],
            "antonym": ["What is the freezing point of water in Fahrenheit?"],
        },
    ),
    (
        [
            "Who invented the telephone?",
            "Which inventor created the telephone?",
            "The telephone was invented by whom?",
            "Who is credited with inventing the telephone?",
            "Name the inventor of the telephone.",
        ],
        {
            "entity": ["Who invented the light bulb?"],
            "antonym": ["When was the telephone invented?"],
        },
    ),
    (
        [
            "How do I convert a PDF to a Word document?",
            "How can I turn a PDF into a Word file?",
            "What is the way to change a PDF into Word format?",
            "Convert PDF to Word: how?",
            "How to make a Word document from a PDF?",
        ],
        {
            "antonym": ["How do I convert a Word document to a PDF?"],
            "entity": ["How do I convert a PDF to an Excel spreadsheet?"],
        },
    ),
    (
        [
            "How many hours of sleep does a teenager need?",
            "How much sleep should a teenager get each night?",
            "What is the recommended amount of sleep for teenagers?",
            "Teenagers need how many hours of sleep?",
            "How long should a teenager sleep per night?",
        ],
        {
            "entity": ["How many hours of sleep does a toddler need?"],
            "number": ["How many hours of sleep does a teenager need on weekends?"],
        },
    ),
    (
        [
            "How do I remove the last character of a string in Python?",
            "How can I drop the final character from a Python string?",
            "What is the way to strip the last character off a string in Python?",
            "Remove the last character from a string in Python: how?",
            "How to delete a string's last character using Python?",
        ],
        {
            "antonym": ["How do I remove the first character of a string in Python?"],
            "number": ["How do I remove the last three characters of a string in Python?"],
        },
    ),
    (
        [
            "What is the capital of Australia?",
            "Which city is Australia's capital?",
            "Name the capital city of Australia.",
            "What city serves as the capital of Australia?",
            "Australia's capital is which city?",
        ],
        {
            "entity": ["What is the capital of Austria?"],
            "antonym": ["What is the largest city in Australia?"],
        },
    ),
    (
        [
            "How do I see the git commit history?",
            "How can I view past commits in git?",
            "What command shows the commit log in git?",
            "Show the git commit history: how?",
            "How to look at the history of commits with git?",
        ],
        {
            "number": ["How do I see the last 5 commits in git?"],
            "entity": ["How do I see the git commit history of a single file?"],
        },
    ),
    (
        [
            "Why is the sky blue?",
            "What makes the sky look blue?",
            "Why does the sky appear blue?",
            "What is the reason the sky is blue?",
            "How come the sky is blue?",
        ],
        {
            "antonym": ["Why is the sky red at sunset?"],
            "entity": ["Why is the ocean blue?"],
        },
    ),
    (
        [
            "How do I make an HTTP request in Go?",
            "How can I send an HTTP request with Go?",
            "What is the way to do an HTTP call in Go?",
            "Make an HTTP request using Go: how?",
            "How to perform an HTTP request from a Go program?",
        ],
        {
            "entity": ["How do I make an HTTP request in Rust?"],
            "negation": ["How do I make an HTTP request in Go without the standard library?"],
        },
    ),
    (
        [
            "How many teaspoons are in a tablespoon?",
            "How many teaspoons make one tablespoon?",
            "A tablespoon equals how many teaspoons?",
            "What is the number of teaspoons in a tablespoon?",
            "Teaspoons per tablespoon?",
        ],
        {
            "entity": ["How many tablespoons are in a cup?"],
            "number": ["How many teaspoons are in 4 tablespoons?"],
        },
    ),
    (
        [
            "How do I check disk space on Linux?",
            "How can I see how much disk space is free on Linux?",
            "What command shows disk usage on Linux?",
            "Check free disk space in Linux: how?",
            "How to find available disk space on a Linux machine?",
        ],
        {
            "entity": ["How do I check memory usage on Linux?"],
            "antonym": ["How do I free up disk space on Linux?"],
        },
    ),
    (
        [
            "What is the freezing point of salt water?",
            "At what temperature does salt water freeze?",
            "When does seawater freeze, temperature-wise?",
            "Freezing point of salty water?",
            "Salt water freezes at what temperature?",
        ],
        {
            "antonym": ["What is the boiling point of salt water?"],
            "entity": ["What is the freezing point of sugar water?"],
        },
    ),
    (
        [
            "How do I reverse a string in JavaScript?",
            "How can I reverse a JavaScript string?",
            "What is the way to reverse the characters of a string in JavaScript?",
            "Reverse a string with JavaScript: how?",
            "How to flip a string backwards in JavaScript?",
        ],
        {
            "entity": ["How do I reverse an array in JavaScript?"],
            "antonym": ["How do I capitalize a string in JavaScript?"],
        },
    ),
    (
        [
            "Who was the first president of the United States?",
            "Who served as the first US president?",
            "Which person was the first president of the USA?",
            "The first president of the United States was who?",
            "Name the first president of the United States.",
        ],
        {
            "number": ["Who was the third president of the United States?"],
            "entity": ["Who was the first president of France?"],
        },
    ),
    (
        [
            "How do I set an environment variable in Bash?",
            "How can I define an environment variable in Bash?",
            "What is the way to export an environment variable in Bash?",
            "Set an environment variable in the Bash shell: how?",
            "How to create an environment variable using Bash?",
        ],
        {
            "antonym": ["How do I unset an environment variable in Bash?"],
            "entity": ["How do I set an environment variable in PowerShell?"],
        },
    ),
    (
        [
            "How long does it take to walk a mile?",
            "How many minutes does walking one mile take?",
            "What is the average time to walk a mile?",
            "Walking a mile takes how long?",
            "How much time do I need to walk a mile?",
        ],
        {
            "antonym": ["How long does it take to run a mile?"],
            "number": ["How long does it take to walk 10 miles?"],
        },
    ),
    (
        [
            "How do I read a CSV file in pandas?",
            "How can I load a CSV file with pandas?",
            "What is the way to import a CSV into pandas?",
            "Read a CSV using pandas: how?",
            "How to open a CSV file as a pandas DataFrame?",
        ],
        {
            "antonym": ["How do I write a CSV file in pandas?"],
            "entity": ["How do I read an Excel file in pandas?"],
        },
    ),
    (
        [
            "What is the average lifespan of a cat?",
            "How long do cats usually live?",
            "What is a cat's typical life expectancy?",
            "Cats live for how many years on average?",
            "How many years does a cat live on average?",
        ],
        {
            "entity": ["What is the average lifespan of a parrot?"],
            "antonym": ["What is the average weight of a cat?"],
        },
    ),
    (
        [
            "How do I kill a process by its port on Linux?",
            "How can I stop the process using a port in Linux?",
            "What is the way to kill whatever is listening on a port on Linux?",
            "Kill the process on a given port in Linux: how?",
            "How to terminate a process bound to a port on Linux?",
        ],
        {
            "antonym": ["How do I find the process using a port on Linux?"],
            "entity": ["How do I kill a process by its port on Windows?"],
        },
    ),
    (
        [
            "What is the speed of sound in air?",
            "How fast does sound travel through air?",
            "At what speed does sound move in air?",
            "Speed of sound in air?",
            "How quickly does sound propagate in air?",
        ],
        {
            "entity": ["What is the speed of sound in water?"],
            "antonym": ["What is the wavelength of sound in air?"],
        },
    ),
    (
        [
            "How do I create a dictionary from two lists in Python?",
            "How can I build a dict out of two lists in Python?",
            "What is the way to combine two lists into a dictionary in Python?",
            "Make a dictionary from two lists in Python: how?",
            "How to turn two Python lists into a dict?",
        ],
        {
            "number": ["How do I create a dictionary from three lists in Python?"],
            "antonym": ["How do I create two lists from a dictionary in Python?"],
        },
    ),
    (
        [
            "When did the Berlin Wall fall?",
            "In what year did the Berlin Wall come down?",
            "What year was the Berlin Wall torn down?",
            "The Berlin Wall fell when?",
            "When was the fall of the Berlin Wall?",
        ],
        {
            "antonym": ["When was the Berlin Wall built?"],
            "entity": ["When did the Soviet Union fall?"],
        },
    ),
    (
        [
            "How do I clear the cache in Chrome?",
            "How can I delete the browser cache in Chrome?",
            "What is the way to empty Chrome's cache?",
            "Clear the Chrome cache: how?",
            "How to wipe cached data in Google Chrome?",
        ],
        {
            "entity": ["How do I clear the cache in Firefox?"],
            "antonym": ["How do I clear the cookies in Chrome?"],
        },
    ),
    (
        [
            "How many grams of protein should I eat per day?",
            "How much protein do I need daily in grams?",
            "What is the recommended daily protein intake in grams?",
            "Daily protein requirement in grams?",
            "How many grams of protein does a person need each day?",
        ],
        {
            "entity": ["How many grams of fiber should I eat per day?"],
            "antonym": ["How many grams of protein should I eat per meal?"],
        },
    ),
    (
        [
            "How do I format a date in JavaScript?",
            "How can I format a Date object in JavaScript?",
            "What is the way to display a date in a certain format with JavaScript?",
            "Format a date using JavaScript: how?",
            "How to turn a JavaScript date into a formatted string?",
        ],
        {
            "antonym": ["How do I parse a date in JavaScript?"],
            "entity": ["How do I format a date in PHP?"],
        },
    ),
    (
        [
            "What is the deepest point in the ocean?",
            "Where is the deepest spot in the ocean?",
            "Which place is the deepest in the world's oceans?",
            "Name the deepest point of the ocean.",
            "What is the ocean's deepest location?",
        ],
        {
            "antonym": ["What is the highest point on land?"],
            "entity": ["What is the deepest point in the Atlantic Ocean?"],
        },
    ),
    (
        [
            "How do I resize an image in Python?",
            "How can I change the size of an image with Python?",
            "What is the way to scale an image in Python?",
            "Resize a picture using Python: how?",
            "How to make an image smaller or larger in Python?",
        ],
        {
            "antonym": ["How do I rotate an image in Python?"],
            "number": ["How do I resize many images at once in Python?"],
        },
    ),
    (
        [
            "How many sides does a hexagon have?",
            "A hexagon has how many sides?",
            "What is the number of sides of a hexagon?",
            "Count the sides of a hexagon.",
            "How many edges does a hexagon have?",
        ],
        {
            "entity": ["How many sides does an octagon have?"],
            "antonym": ["How many diagonals does a hexagon have?"],
        },
    ),
    (
        [
            "How do I make a table in Markdown?",
            "How can I create a table using Markdown?",
            "What is the Markdown syntax for a table?",
            "Write a table in Markdown: how?",
            "How to add a table to a Markdown file?",
        ],
        {
            "entity": ["How do I make a table in LaTeX?"],
            "antonym": ["How do I make a list in Markdown?"],
        },
    ),
    (
        [
            "Is it safe to drink tap water in Mexico?",
            "Can I safely drink the tap water in Mexico?",
            "Is Mexican tap water safe to drink?",
            "Is drinking tap water in Mexico safe?",
            "Should I drink tap water when in Mexico?",
        ],
        {
            "entity": ["Is it safe to drink tap water in Iceland?"],
            "antonym": ["Is it safe to swim in the water in Mexico?"],
        },
    ),
    (
        [
            "How do I compare two strings in Java?",
            "How can I check if two Java strings are equal?",
            "What is the way to compare strings in Java?",
            "Compare two strings using Java: how?",
            "How to test two strings for equality in Java?",
        ],
        {
            "entity": ["How do I compare two strings in C?"],
            "negation": ["How do I compare two strings in Java while ignoring case?"],
        },
    ),
    (
        [
            "What is the population of Germany?",
            "How many people live in Germany?",
            "How large is Germany's population?",
            "What is Germany's total population?",
            "Germany has how many inhabitants?",
        ],
        {
            "entity": ["What is the population of Berlin?"],
            "antonym": ["What is the land area of Germany?"],
        },
    ),
    (
        [
            "How do I hide a column in Excel?",
            "How can I hide an Excel column?",
            "What is the way to make a column hidden in Excel?",
            "Hide a column in Excel: how?",
            "How to conceal a column in an Excel sheet?",
        ],
        {
            "antonym": ["How do I unhide a column in Excel?"],
            "entity": ["How do I hide a row in Excel?"],
        },
    ),
    (
        [
            "How do I wait for a promise to finish in JavaScript?",
            "How can I wait until a JavaScript promise resolves?",
            "What is the way to await a promise in JavaScript?",
            "Wait for a promise in JavaScript: how?",
            "How to block until a promise completes in JavaScript?",
        ],
        {
            "number": ["How do I wait for several promises to finish in JavaScript?"],
            "negation": ["How do I run a promise in JavaScript without waiting for it?"],
        },
    ),
    (
        [
            "What is the normal body temperature of a human?",
            "What is a healthy human body temperature?",
            "What temperature is a normal human body?",
            "Normal human body temperature?",
            "How warm is a healthy human body normally?",
        ],
        {
            "entity": ["What is the normal body temperature of a dog?"],
            "antonym": ["What is the normal heart rate of a human?"],
        },
    ),
    (
        [
            "How do I change my password on a Mac?",
            "How can I update my Mac login password?",
            "What is the way to reset the user password on macOS?",
            "Change the password on a Mac: how?",
            "How to set a new account password on my Mac?",
        ],
        {
            "entity": ["How do I change my password on an iPhone?"],
            "antonym": ["How do I change my username on a Mac?"],
        },
    ),
    (
        [
            "How far is the Sun from the Earth?",
            "What is the distance between the Earth and the Sun?",
            "How many kilometers is the Sun from Earth?",
            "Earth to Sun distance?",
            "How far away is the Sun from our planet?",
        ],
        {
            "entity": ["How far is Mars from the Earth?"],
            "antonym": ["How big is the Sun compared to the Earth?"],
        },
    ),
    (
        [
            "How do I count the words in a string in Python?",
            "How can I find the number of words in a Python string?",
            "What is the way to count words in a string with Python?",
            "Count words in a string in Python: how?",
            "How to get the word count of a string using Python?",
        ],
        {
            "antonym": ["How do I count the characters in a string in Python?"],
            "number": ["How do I count the unique words in a string in Python?"],
        },
    ),
    (
        [
            "What is the tallest animal in the world?",
            "Which animal is the tallest on Earth?",
            "What is the world's tallest animal?",
            "Name the tallest animal on the planet.",
            "Which living animal stands the highest?",
        ],
        {
            "antonym": ["What is the fastest animal in the world?"],
            "entity": ["What is the tallest bird in the world?"],
        },
    ),
]


def pairs(split: Split) -> list[Pair]:
    """The labelled pairs of one split."""
    chosen = list(
        enumerate(
            INTENTS + SEEN_HELD_OUT_INTENTS + SEEN_LATER_INTENTS
            if split == "tuning"
            else HELD_OUT_INTENTS
        )
    )
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
