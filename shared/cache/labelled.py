"""The semantic cache's labelled set, written by hand: intents, each with paraphrases (any
two of one intent should share an answer) and small edits of its first text that must not
(negation, antonym, another entity, another number; in the held-out split also a
restriction added, roles swapped, another kind of question).

Two splits with no intent in common. The tuning split is every intent that was looked at
while the guard (``guard.py``) and its threshold were written: ``INTENTS`` (40), then
``SEEN_HELD_OUT_INTENTS`` (20), ``SEEN_LATER_INTENTS`` (40) and ``SEEN_VERIFIER_INTENTS``
(40), each once a held-out set whose false hits were read and taught the guard something
(quantifiers such as "all", superlatives, words of one kind, "when" against "where", a
count against the thing counted, "unset" against "set", "from" read backwards), so no
longer held out. Those were all written by the hand that wrote the guard.
``HELD_OUT_INTENTS`` (79) were written by others, who had seen neither the guard nor the
verifier, after both were fixed: they only measure them. ``pairs(split)`` expands a split into
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

SEEN_VERIFIER_INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
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


# Written for this split by hands that had not seen the guard, the verifier or their
# figures: programming and computing (40), then general questions and everyday how-to (39;
# one more was dropped before any figure was read: its first text is a tuning edit).
HELD_OUT_INTENTS: list[tuple[list[str], dict[str, list[str]]]] = [
    (
        [
            "How do I check whether a file exists in Python?",
            "What's the way to test if a file exists using Python?",
            "Python: how can I tell if a file is present on disk?",
            "Check if a file exists in Python: how?",
            "Show me how to find out whether a given file exists with Python.",
        ],
        {
            "entity": ["How do I check whether a file exists in Bash?"],
            "restriction": ["How do I check whether a file exists in an S3 bucket in Python?"],
            "question": [
                "Why does checking whether a file exists in Python lead to race conditions?"
            ],
        },
    ),
    (
        [
            "How do I flatten a list of lists into a single list in Python?",
            "What's the best way to turn a nested list into a flat list in Python?",
            "Python: flatten a list of lists, how?",
            "How can I convert a list of lists to one flat list using Python?",
            "Show me how to merge a list of lists into one single list in Python.",
        ],
        {
            "order": ["How do I split a single list into a list of lists in Python?"],
            "restriction": [
                "How do I flatten an arbitrarily deeply nested list into a single list in Python?"
            ],
        },
    ),
    (
        [
            "Write a Python function that counts how often each word appears in a text file.",
            "Write a Python function to compute the frequency of every word in a text file.",
            "I need a Python function that tallies the occurrences of each word in a text file.",
            "Create a function in Python that returns a count for each word found in a text file.",
            "Python: write a function counting the number of times each word occurs in a text file.",
        ],
        {
            "restriction": [
                "Write a Python function that counts how often each word appears in a text file, ignoring case and punctuation."
            ],
            "number": [
                "Write a Python function that returns the 10 most frequent words in a text file."
            ],
            "question": [
                "Write a Python function that counts how many words a text file contains."
            ],
        },
    ),
    (
        [
            "Write a Python function that checks whether a string is a palindrome.",
            "Create a Python function to test if a string reads the same forwards and backwards.",
            "I need a function in Python that tells me whether a given string is a palindrome.",
            "Python function to determine if a string is a palindrome?",
            "Write Python code for a function that returns True if a string is a palindrome and False otherwise.",
        ],
        {
            "entity": ["Write a JavaScript function that checks whether a string is a palindrome."],
            "restriction": [
                "Write a Python function that checks whether a string is a palindrome, ignoring spaces and punctuation."
            ],
            "negation": [
                "Write a Python function that checks whether a string is a palindrome without reversing it."
            ],
        },
    ),
    (
        [
            "How do I load a JSON file into a dictionary in Python?",
            "How can I read a JSON file into a Python dict?",
            "What's the way to parse a JSON file as a dictionary using Python?",
            "Python: reading a JSON file into a dict, how?",
            "Show me how to open a .json file and get its contents as a Python dictionary.",
        ],
        {
            "antonym": ["How do I save a dictionary to a JSON file in Python?"],
            "entity": ["How do I load a YAML file into a dictionary in Python?"],
        },
    ),
    (
        [
            "How do I get the last 3 elements of a list in Python?",
            "How can I take the final three items of a Python list?",
            "What's the way to slice out the last 3 entries of a list in Python?",
            "Python: get the last three elements from a list?",
            "Show me how to grab the 3 last items of a list using Python.",
        ],
        {
            "number": ["How do I get the last 5 elements of a list in Python?"],
            "antonym": ["How do I get the first 3 elements of a list in Python?"],
        },
    ),
    (
        [
            "How do I compute the SHA-256 hash of a file in Python?",
            "How can I calculate a file's SHA-256 digest using Python?",
            "Python: get the SHA256 checksum of a file, how?",
            "What's the way to hash a file with SHA-256 in Python?",
            "Show me how to generate the SHA-256 hash for a file using Python.",
        ],
        {
            "number": ["How do I compute the SHA-512 hash of a file in Python?"],
            "question": ["Is SHA-256 safe to use for hashing passwords in Python?"],
        },
    ),
    (
        [
            "How do I deep copy an object in JavaScript?",
            "What's the way to make a deep clone of a JavaScript object?",
            "JavaScript: how can I create a deep copy of an object?",
            "How to clone an object deeply in JS?",
            "Show me how to duplicate a JavaScript object including all of its nested properties.",
        ],
        {
            "antonym": ["How do I shallow copy an object in JavaScript?"],
            "entity": ["How do I deep copy an object in Python?"],
            "question": [
                "What is the difference between a deep copy and a shallow copy in JavaScript?"
            ],
        },
    ),
    (
        [
            "Write a JavaScript debounce function that delays calls by 300 milliseconds.",
            "Create a debounce function in JavaScript with a 300 ms delay.",
            "I need a JS function that debounces calls, waiting 300 milliseconds.",
            "Write a debounce helper in JavaScript that postpones execution by 300ms.",
            "JavaScript: implement debouncing with a 300 millisecond wait.",
        ],
        {
            "entity": [
                "Write a JavaScript throttle function that limits calls to once every 300 milliseconds."
            ],
            "number": ["Write a JavaScript debounce function that delays calls by 2 seconds."],
        },
    ),
    (
        [
            "How do I send a POST request with a JSON body using fetch in JavaScript?",
            "How can I make a POST request with JSON data via the fetch API in JS?",
            "JavaScript fetch: how to POST a JSON payload?",
            "What's the way to use fetch() to send JSON in a POST request?",
            "Show me how to post JSON to an API with fetch in JavaScript.",
        ],
        {
            "entity": ["How do I send a POST request with a JSON body using axios in JavaScript?"],
            "negation": [
                "How do I send a POST request with a JSON body in JavaScript without using fetch?"
            ],
            "question": [
                "Why does my fetch POST request with a JSON body trigger a CORS preflight in JavaScript?"
            ],
        },
    ),
    (
        [
            "How do I convert a JSON string to an object in JavaScript?",
            "How can I parse a JSON string into a JavaScript object?",
            "JavaScript: turn a JSON string into an object, how?",
            "What's the way to deserialize JSON text into a JS object?",
            "Show me how to change a string of JSON into an object in JavaScript.",
        ],
        {
            "order": ["How do I convert an object to a JSON string in JavaScript?"],
            "restriction": [
                "How do I convert a JSON string to an object in JavaScript with date strings revived as Date objects?"
            ],
        },
    ),
    (
        [
            "How do I remove an element from an array by its index in JavaScript?",
            "How can I delete the item at a given index from a JavaScript array?",
            "JavaScript: remove the array element at a specific index?",
            "What's the way to take out an array entry by its position in JS?",
            "Show me how to drop the element at index i from an array in JavaScript.",
        ],
        {
            "antonym": ["How do I insert an element into an array at a given index in JavaScript?"],
            "negation": [
                "How do I remove an element from an array by its index in JavaScript without mutating the original array?"
            ],
        },
    ),
    (
        [
            "Write an SQL query that finds duplicate email addresses in the users table.",
            "Give me a SQL query to list email addresses that appear more than once in the users table.",
            "SQL: how do I find repeated emails in a users table?",
            "How can I detect duplicate emails in the users table using SQL?",
            "Write a query in SQL to show which emails occur multiple times in users.",
        ],
        {
            "antonym": [
                "Write an SQL query that deletes duplicate email addresses in the users table."
            ],
            "number": [
                "Write an SQL query that finds email addresses appearing more than 3 times in the users table."
            ],
            "negation": [
                "Write an SQL query that finds email addresses that are not duplicated in the users table."
            ],
        },
    ),
    (
        [
            "Write a SQL query to get the second highest salary from the employees table.",
            "How do I find the 2nd largest salary in an employees table with SQL?",
            "SQL query for the second-highest salary in employees?",
            "Give me a query that returns the second biggest salary from the employees table.",
            "Using SQL, how can I select the second highest salary among employees?",
        ],
        {
            "number": [
                "Write a SQL query to get the third highest salary from the employees table."
            ],
            "antonym": [
                "Write a SQL query to get the second lowest salary from the employees table."
            ],
            "restriction": [
                "Write a SQL query to get the second highest salary in each department from the employees table."
            ],
            "negation": [
                "Write a SQL query to get the second highest salary from the employees table without using LIMIT."
            ],
        },
    ),
    (
        [
            "Explain the difference between LEFT JOIN and INNER JOIN in SQL.",
            "What is the difference between an inner join and a left join in SQL?",
            "How does a SQL LEFT JOIN differ from an INNER JOIN?",
            "LEFT JOIN vs INNER JOIN in SQL: what's the difference?",
            "Can you explain how INNER JOIN and LEFT JOIN differ in SQL?",
        ],
        {
            "entity": ["Explain the difference between LEFT JOIN and FULL OUTER JOIN in SQL."],
            "question": ["Explain when a LEFT JOIN is slower than an INNER JOIN in SQL."],
        },
    ),
    (
        [
            "How do I create an index on a column in PostgreSQL?",
            "What's the syntax to add an index to a column in Postgres?",
            "PostgreSQL: how can I index a column?",
            "How to build an index on a table column in PostgreSQL?",
            "Show me how to create a column index in a Postgres table.",
        ],
        {
            "antonym": ["How do I drop an index on a column in PostgreSQL?"],
            "entity": ["How do I create an index on a column in MongoDB?"],
            "question": [
                "How do I check whether an index on a column is being used in PostgreSQL?"
            ],
            "negation": [
                "How do I create an index on a column in PostgreSQL without locking the table?"
            ],
        },
    ),
    (
        [
            "How do I move rows older than 30 days from the orders table into the orders_archive table in MySQL?",
            "What's the MySQL query to move records more than 30 days old from orders to orders_archive?",
            "MySQL: how can I transfer rows older than 30 days out of the orders table and into orders_archive?",
            "How to archive the orders rows that are over 30 days old into the orders_archive table in MySQL?",
            "Show me how to move all rows older than thirty days from orders into orders_archive using MySQL.",
        ],
        {
            "order": [
                "How do I move rows older than 30 days from the orders_archive table into the orders table in MySQL?"
            ],
            "number": [
                "How do I move rows older than 90 days from the orders table into the orders_archive table in MySQL?"
            ],
            "antonym": [
                "How do I move rows newer than 30 days from the orders table into the orders_archive table in MySQL?"
            ],
        },
    ),
    (
        [
            "How do I delete a remote branch in git?",
            "What's the git command to remove a branch on the remote?",
            "Git: how can I delete a branch from the remote repository?",
            "How to remove a remote git branch?",
            "Show me how to get rid of a branch on the remote with git.",
        ],
        {
            "antonym": ["How do I delete a local branch in git?"],
            "question": [
                "Why does deleting a remote branch in git leave it visible in other clones?"
            ],
            "restriction": ["How do I delete all merged remote branches in git?"],
        },
    ),
    (
        [
            "How do I merge the feature branch into main in git?",
            "What's the way to merge branch feature into main with git?",
            "Git: merge feature into main, how?",
            "How can I bring the changes from the feature branch into main using git merge?",
            "Show me the git commands to merge my feature branch into the main branch.",
        ],
        {
            "order": ["How do I merge the main branch into feature in git?"],
            "entity": ["How do I rebase the feature branch onto main in git?"],
        },
    ),
    (
        [
            "How do I stash my uncommitted changes in git?",
            "How can I temporarily save uncommitted changes with git stash?",
            "Git: how to stash local changes I haven't committed?",
            "What's the way to put my uncommitted work aside in git?",
            "Show me how to stash changes that are not yet committed in git.",
        ],
        {
            "antonym": ["How do I restore my stashed changes in git?"],
            "restriction": [
                "How do I stash my uncommitted changes including untracked files in git?"
            ],
            "negation": [
                "How do I stash my uncommitted changes in git without stashing the staged ones?"
            ],
        },
    ),
    (
        [
            "How do I copy a single file from the develop branch into my current branch in git?",
            "What's the git command to bring one file over from the develop branch into the branch I'm on?",
            "Git: how can I grab a single file from develop and put it in my current branch?",
            "How to check out just one file from the develop branch into my current branch with git?",
            "Show me how to take one file from the develop branch and copy it into my current git branch.",
        ],
        {
            "order": [
                "How do I copy a single file from my current branch into the develop branch in git?"
            ],
            "negation": [
                "How do I copy a single file from the develop branch into my current branch in git without staging it?"
            ],
            "question": [
                "How do I compare a single file between the develop branch and my current branch in git?"
            ],
        },
    ),
    (
        [
            "How do I find files larger than 100 MB in Linux?",
            "What command lists files bigger than 100MB on Linux?",
            "Linux: search for files over 100 MB in size, how?",
            "How can I locate all files exceeding 100 megabytes on a Linux system?",
            "Show me how to find every file above 100 MB using the Linux command line.",
        ],
        {
            "number": ["How do I find files larger than 100 KB in Linux?"],
            "antonym": ["How do I find files smaller than 100 MB in Linux?"],
            "restriction": [
                "How do I find files larger than 100 MB modified in the last week in Linux?"
            ],
        },
    ),
    (
        [
            "How do I count the number of lines in a file from the shell?",
            "What shell command counts the lines in a file?",
            "Shell: how can I get the line count of a file?",
            "How to find out how many lines a file has in the terminal?",
            "Show me how to count a file's lines on the command line.",
        ],
        {
            "restriction": [
                "How do I count the number of non-empty lines in a file from the shell?"
            ],
            "entity": ["How do I count the number of words in a file from the shell?"],
            "negation": [
                "How do I count the number of lines that do not contain 'error' in a file from the shell?"
            ],
        },
    ),
    (
        [
            "How do I replace a string in all .txt files in a directory using sed?",
            "Using sed, how can I substitute a string in every .txt file in a folder?",
            "sed: find and replace text across all .txt files in a directory?",
            "What's the sed command to replace a word in all the .txt files of a directory?",
            "Show me how to do a search-and-replace with sed over every .txt file in a directory.",
        ],
        {
            "restriction": [
                "How do I replace a string in all .txt files in a directory and all its subdirectories using sed?"
            ],
            "negation": [
                "How do I replace a string in all .txt files in a directory using sed without modifying the original files?"
            ],
        },
    ),
    (
        [
            "How do I copy a file from a remote server to my local machine with scp?",
            "What's the scp command to download a file from a remote server to my computer?",
            "scp: how to copy a file from a server onto my local machine?",
            "How can I use scp to transfer a file from a remote host to my local computer?",
            "Show me how to pull a file from a remote server down to my laptop using scp.",
        ],
        {
            "order": ["How do I copy a file from my local machine to a remote server with scp?"],
            "entity": ["How do I copy a file from a remote server to my local machine with rsync?"],
        },
    ),
    (
        [
            "How do I make a shell script executable on Linux?",
            "What command makes a bash script executable in Linux?",
            "Linux: how can I give a script execute permission?",
            "How to set the executable bit on a shell script in Linux?",
            "Show me how to make my .sh script runnable on Linux.",
        ],
        {
            "antonym": ["How do I remove execute permission from a shell script on Linux?"],
            "restriction": ["How do I make a shell script executable only for its owner on Linux?"],
        },
    ),
    (
        [
            "How do I schedule a script to run every day at 3 AM with cron?",
            "What's the crontab entry to run a script daily at 3 am?",
            "cron: how can I run a script each day at 03:00?",
            "How to set up a cron job that executes a script at 3 AM every day?",
            "Show me how to make cron launch a script every morning at 3:00.",
        ],
        {
            "number": [
                "How do I schedule a script to run every day at 5 AM with cron?",
                "How do I schedule a script to run every 3 hours with cron?",
            ],
            "restriction": ["How do I schedule a script to run every weekday at 3 AM with cron?"],
        },
    ),
    (
        [
            "How do I extract a .tar.gz file in Linux?",
            "What's the command to unpack a tar.gz archive on Linux?",
            "Linux: how can I decompress a .tar.gz file?",
            "How to untar a .tar.gz archive in Linux?",
            "Show me how to extract the contents of a tar.gz on the Linux command line.",
        ],
        {
            "antonym": ["How do I create a .tar.gz file in Linux?"],
            "entity": ["How do I extract a .zip file in Linux?"],
        },
    ),
    (
        [
            "How do I remove all stopped Docker containers?",
            "What's the command to delete every stopped container in Docker?",
            "Docker: clean up all exited containers, how?",
            "How can I get rid of all the stopped containers in Docker?",
            "Show me how to prune stopped Docker containers.",
        ],
        {
            "antonym": ["How do I remove all running Docker containers?"],
            "number": ["How do I remove all stopped Docker containers older than 24 hours?"],
            "restriction": [
                "How do I remove all stopped Docker containers along with their volumes?"
            ],
        },
    ),
    (
        [
            "How do I copy a file from a Docker container to the host?",
            "How can I get a file out of a Docker container onto my host machine?",
            "Docker: copy a file from inside a container to the host, how?",
            "What's the command to transfer a file from a container to the host in Docker?",
            "Show me how to pull a file from a Docker container onto the host filesystem.",
        ],
        {
            "order": ["How do I copy a file from the host to a Docker container?"],
            "entity": ["How do I copy a file from a Kubernetes pod to the host?"],
            "question": [
                "Why does copying a file from a Docker container to the host fail with permission denied?"
            ],
        },
    ),
    (
        [
            "How do I forward local port 8080 to port 80 on a remote server using SSH?",
            "What's the SSH command to tunnel my local port 8080 to port 80 on a remote host?",
            "SSH local port forwarding: how do I map localhost:8080 to port 80 on a remote server?",
            "How can I use ssh to forward port 8080 on my machine to port 80 of a remote server?",
            "Show me how to set up an SSH tunnel from local port 8080 to remote port 80.",
        ],
        {
            "order": [
                "How do I forward port 8080 on a remote server to port 80 on my local machine using SSH?"
            ],
            "number": ["How do I forward local port 3000 to port 80 on a remote server using SSH?"],
            "question": [
                "Why does forwarding local port 8080 to port 80 on a remote server using SSH fail with 'Address already in use'?"
            ],
        },
    ),
    (
        [
            "How do I scale a Kubernetes deployment to 3 replicas?",
            "What's the kubectl command to scale a deployment to three replicas?",
            "Kubernetes: how can I set a deployment's replica count to 3?",
            "How to change the number of replicas of a Kubernetes deployment to 3?",
            "Show me how to scale a deployment in Kubernetes so it runs 3 replicas.",
        ],
        {
            "number": ["How do I scale a Kubernetes deployment to 5 replicas?"],
            "entity": ["How do I scale a Docker Compose service to 3 replicas?"],
        },
    ),
    (
        [
            "How do I view the logs of a pod in Kubernetes?",
            "What's the kubectl command to see a pod's logs?",
            "Kubernetes: how can I check the logs of a pod?",
            "How to print the log output of a Kubernetes pod?",
            "Show me how to read the logs from a pod with kubectl.",
        ],
        {
            "restriction": [
                "How do I view the logs of a specific container in a multi-container pod in Kubernetes?"
            ],
            "number": ["How do I view the last 100 lines of the logs of a pod in Kubernetes?"],
            "question": ["How long does Kubernetes keep the logs of a pod?"],
        },
    ),
    (
        [
            "Write a regex to validate an email address.",
            "Give me a regular expression that checks whether an email address is valid.",
            "What regex can I use to validate email addresses?",
            "Regex for email address validation?",
            "I need a regular expression pattern that validates an email.",
        ],
        {
            "entity": ["Write a regex to validate a URL."],
            "question": ["Why is it a bad idea to validate an email address with a regex?"],
        },
    ),
    (
        [
            "Write a regular expression that matches a date in YYYY-MM-DD format.",
            "Give me a regex for dates formatted as YYYY-MM-DD.",
            "What regex matches a date like 2024-01-31 in YYYY-MM-DD form?",
            "I need a regular expression to match dates in the YYYY-MM-DD format.",
            "Regex pattern for matching YYYY-MM-DD dates?",
        ],
        {
            "order": ["Write a regular expression that matches a date in DD-MM-YYYY format."],
            "restriction": [
                "Write a regular expression that matches only valid calendar dates in YYYY-MM-DD format, including leap years."
            ],
        },
    ),
    (
        [
            "What port does HTTPS use by default?",
            "Which port number is the default for HTTPS?",
            "HTTPS default port?",
            "By default, what port does HTTPS run on?",
            "Tell me the standard port used by HTTPS.",
        ],
        {
            "entity": ["What port does SSH use by default?"],
            "question": ["Why does HTTPS use a different default port than HTTP?"],
        },
    ),
    (
        [
            "How do I find my public IP address from the Linux command line?",
            "What command shows my public IP address in a Linux terminal?",
            "Linux terminal: how can I get my external IP address?",
            "How to check the public IP of my machine using the Linux command line?",
            "Show me how to look up my external IP from a Linux shell.",
        ],
        {
            "antonym": ["How do I find my private IP address from the Linux command line?"],
            "restriction": ["How do I find my public IPv6 address from the Linux command line?"],
        },
    ),
    (
        [
            "How do I use VLOOKUP to pull values from Sheet2 into Sheet1 in Excel?",
            "How can I write a VLOOKUP in Sheet1 that looks up values in Sheet2 in Excel?",
            "Excel: VLOOKUP data from Sheet2 into Sheet1, how?",
            "What's the way to bring values from Sheet2 into Sheet1 with VLOOKUP in Excel?",
            "Show me an Excel VLOOKUP formula on Sheet1 that fetches matching values from Sheet2.",
        ],
        {
            "order": ["How do I use VLOOKUP to pull values from Sheet1 into Sheet2 in Excel?"],
            "restriction": [
                "How do I use VLOOKUP to pull values from Sheet2 into Sheet1 in Excel and show a blank when there is no match?"
            ],
            "question": [
                "Why does my VLOOKUP pulling values from Sheet2 into Sheet1 in Excel return #N/A?"
            ],
        },
    ),
    (
        [
            "How do I count cells greater than 100 in a range in Excel?",
            "What Excel formula counts the cells in a range with values above 100?",
            "Excel: how can I count how many cells in a range exceed 100?",
            "How to get the number of cells over 100 in an Excel range?",
            "Show me how to count the cells in a range whose value is more than 100 in Excel.",
        ],
        {
            "antonym": ["How do I count cells less than 100 in a range in Excel?"],
            "negation": ["How do I count cells not greater than 100 in a range in Excel?"],
            "restriction": [
                "How do I count cells greater than 100 and less than 200 in a range in Excel?"
            ],
            "question": [
                "Why does counting cells greater than 100 in a range in Excel return 0 for numbers stored as text?"
            ],
        },
    ),
    (
        [
            "How do I convert a YAML file to JSON in Python?",
            "What's the way to turn a YAML file into JSON using Python?",
            "Python: YAML to JSON conversion, how?",
            "How can I transform a .yaml file into a .json file with Python?",
            "Show me Python code that reads a YAML file and writes it out as JSON.",
        ],
        {
            "order": ["How do I convert a JSON file to YAML in Python?"],
            "entity": ["How do I convert a TOML file to JSON in Python?"],
            "negation": [
                "How do I convert a YAML file to JSON in Python without installing any third-party library?"
            ],
        },
    ),
    (
        [
            "When did the Titanic sink?",
            "What year did the Titanic go down?",
            "Tell me when the Titanic sank.",
            "The Titanic sank in which year?",
            "On what date did the RMS Titanic sink in the Atlantic?",
        ],
        {
            "question": [
                "Why did the Titanic sink?",
                "How many people died when the Titanic sank?",
            ],
            "entity": ["When did the Lusitania sink?"],
        },
    ),
    (
        [
            "Who was the first woman to win a Nobel Prize?",
            "Which woman won a Nobel Prize first?",
            "Name the first female Nobel Prize winner.",
            "Who became the first female Nobel laureate in history?",
            "Tell me who was the very first woman ever to be awarded a Nobel Prize.",
        ],
        {
            "restriction": [
                "Who was the first woman to win the Nobel Peace Prize?",
                "Who was the first American woman to win a Nobel Prize?",
            ],
            "number": ["Who was the second woman to win a Nobel Prize?"],
            "question": ["In what year did the first woman win a Nobel Prize?"],
        },
    ),
    (
        [
            "What caused the extinction of the dinosaurs?",
            "Why did the dinosaurs go extinct?",
            "What wiped out the dinosaurs?",
            "Explain what killed off the dinosaurs.",
            "What event led to the dinosaurs dying out millions of years ago?",
        ],
        {
            "question": ["When did the extinction of the dinosaurs happen?"],
            "entity": ["What caused the extinction of the woolly mammoths?"],
            "antonym": ["What caused the rise of the dinosaurs?"],
        },
    ),
    (
        [
            "How many teeth does an adult human have?",
            "How many teeth do grown-ups normally have?",
            "What is the usual number of teeth in an adult's mouth?",
            "Tell me how many teeth a full-grown person has.",
            "An adult person has how many teeth in total?",
        ],
        {
            "restriction": [
                "How many teeth does a human child have?",
                "How many teeth does an adult human have in the upper jaw?",
            ],
            "entity": ["How many teeth does an adult dog have?"],
            "negation": ["How many teeth does an adult human have without wisdom teeth?"],
        },
    ),
    (
        [
            "What is the longest river in South America?",
            "Which river in South America is the longest?",
            "Name the longest river on the South American continent.",
            "What's South America's longest river?",
            "Tell me which South American river is the longest one.",
        ],
        {
            "number": ["What is the second longest river in South America?"],
            "antonym": ["What is the shortest river in South America?"],
            "question": ["How long is the longest river in South America?"],
        },
    ),
    (
        [
            "When was the Great Wall of China built?",
            "In what period was the Great Wall of China constructed?",
            "When did the Chinese build the Great Wall?",
            "Tell me when construction of the Great Wall of China took place.",
            "What era does the building of the Great Wall of China date from?",
        ],
        {
            "question": [
                "Why was the Great Wall of China built?",
                "How long is the Great Wall of China?",
            ],
            "entity": ["When was the Colosseum built?"],
        },
    ),
    (
        [
            "How does photosynthesis work in plants?",
            "Explain how plants carry out photosynthesis.",
            "What is the process of photosynthesis in plants?",
            "How do plants perform photosynthesis?",
            "Can you describe how photosynthesis happens inside a plant?",
        ],
        {
            "entity": ["How does cellular respiration work in plants?"],
            "negation": ["How does photosynthesis work in plants without sunlight?"],
            "question": ["Why is photosynthesis important for plants?"],
        },
    ),
    (
        [
            "What is the chemical symbol for sodium?",
            "Which chemical symbol stands for sodium?",
            "What's the element symbol of sodium on the periodic table?",
            "Give me the chemical symbol of sodium.",
            "How is sodium written as a chemical symbol?",
        ],
        {
            "restriction": ["What is the chemical symbol for sodium chloride?"],
            "question": ["What is the atomic number for sodium?"],
        },
    ),
    (
        [
            "How long does it take the Earth to orbit the Sun?",
            "How much time does Earth need to go around the Sun once?",
            "What is the length of one orbit of the Earth around the Sun?",
            "Tell me how long a single trip of our planet around the Sun takes.",
            "How long is the Earth's orbital period around the Sun?",
        ],
        {
            "entity": ["How long does it take Mars to orbit the Sun?"],
            "antonym": ["How long does it take the Earth to spin on its axis?"],
        },
    ),
    (
        [
            "Who wrote the Declaration of Independence?",
            "Who was the author of the Declaration of Independence?",
            "Which person drafted the US Declaration of Independence?",
            "Tell me who authored the American Declaration of Independence.",
            "The Declaration of Independence was written by whom?",
        ],
        {
            "question": ["When was the Declaration of Independence signed?"],
            "entity": ["Who wrote the Communist Manifesto?"],
        },
    ),
    (
        [
            "Why do leaves change color in autumn?",
            "Why do tree leaves turn red and yellow in the fall?",
            "What makes leaves change colour in autumn?",
            "Explain why leaves turn different colors every autumn.",
            "What is the reason that the leaves on trees change their color during the fall season?",
        ],
        {
            "negation": ["Why do some leaves not change color in autumn?"],
            "antonym": ["Why do leaves turn green in spring?"],
        },
    ),
    (
        [
            "What causes a solar eclipse?",
            "Why does a solar eclipse happen?",
            "Explain what produces an eclipse of the Sun.",
            "How does a solar eclipse occur?",
            "What is the reason behind a solar eclipse?",
        ],
        {
            "entity": ["What causes a lunar eclipse?"],
            "question": ["How often does a solar eclipse happen?"],
        },
    ),
    (
        [
            "How much bigger is Jupiter than Earth?",
            "How many times larger is Jupiter compared to Earth?",
            "By how much does Jupiter's size exceed Earth's?",
            "Compare the size of Jupiter with the size of Earth: how much larger is it?",
            "Tell me how much larger Jupiter is than our Earth.",
        ],
        {
            "order": ["How much bigger is Earth than Jupiter?"],
            "restriction": ["How much bigger is Jupiter than Earth in mass?"],
            "question": ["How far is Jupiter from Earth?"],
        },
    ),
    (
        [
            "What time is it in Tokyo when it is noon in London?",
            "If it's 12 pm in London, what time is it in Tokyo?",
            "When it's midday in London, what's the time in Tokyo?",
            "Tell me the Tokyo time when the clocks show noon in London.",
            "At noon London time, what time will it be over in Tokyo?",
        ],
        {
            "order": ["What time is it in London when it is noon in Tokyo?"],
            "number": ["What time is it in Tokyo when it is 6 pm in London?"],
            "entity": ["What time is it in Sydney when it is noon in London?"],
        },
    ),
    (
        [
            "How long should I let a steak rest after grilling it?",
            "After grilling a steak, how long should it rest?",
            "What's the right resting time for a steak once it comes off the grill?",
            "How many minutes should a grilled steak sit before I cut into it?",
            "Tell me how long to rest steak after I take it off the grill.",
        ],
        {
            "antonym": ["How long should I let a steak rest before grilling it?"],
            "entity": ["How long should I let a turkey rest after roasting it?"],
            "question": ["How long should I grill a steak for medium-rare?"],
        },
    ),
    (
        [
            "How can I make bread dough rise faster?",
            "What's the quickest way to get bread dough to rise?",
            "Give me tips to speed up the rising of bread dough.",
            "How do I get my bread dough to proof more quickly?",
            "Is there a way to make yeast dough for bread rise in less time than usual?",
        ],
        {
            "antonym": ["How can I make bread dough rise slower?"],
            "negation": ["How can I make bread dough rise without yeast?"],
        },
    ),
    (
        [
            "How long is the flight from London to New York?",
            "How many hours does it take to fly from London to New York?",
            "What's the flight time from London to NYC?",
            "Flying London to New York, how long does it take?",
            "Tell me the usual flying time for a trip from London over to New York.",
        ],
        {
            "order": ["How long is the flight from New York to London?"],
            "restriction": ["How long is the flight from London to New York with one stop?"],
            "question": ["How much is the flight from London to New York?"],
        },
    ),
    (
        [
            "How do I remove a red wine stain from a carpet?",
            "What's the best way to get red wine out of carpet?",
            "How can I clean a red wine spill stain off my carpet?",
            "Tell me how to lift a red wine stain from carpeting.",
            "I spilled red wine on the carpet; how do I get the stain out?",
        ],
        {
            "entity": ["How do I remove a coffee stain from a carpet?"],
            "restriction": ["How do I remove a dried red wine stain from a carpet?"],
            "negation": [
                "How do I remove a red wine stain from a carpet without any cleaning products?"
            ],
        },
    ),
    (
        [
            "When should I plant tomato seeds outdoors?",
            "What's the right time to sow tomato seeds outside?",
            "When is it safe to plant tomato seeds in the garden outdoors?",
            "Tell me when to start tomato seeds outside.",
            "At what time of year should tomato seeds go into the ground outdoors?",
        ],
        {
            "antonym": ["When should I plant tomato seeds indoors?"],
            "restriction": ["When should I plant tomato seeds outdoors in Florida?"],
            "question": ["When should I harvest tomatoes?"],
        },
    ),
    (
        [
            "How do I jump-start a car with a dead battery?",
            "What are the steps to jump start a car whose battery is dead?",
            "My car battery is flat; how do I jump-start it?",
            "Explain how to jump a car that has a dead battery.",
            "Give me instructions for jump-starting a car when its battery has died.",
        ],
        {
            "negation": ["How do I jump-start a car with a dead battery without jumper cables?"],
            "restriction": ["How do I jump-start a hybrid car with a dead battery?"],
            "question": ["How do I know if my car has a dead battery?"],
        },
    ),
    (
        [
            "I have never run before; what is a good training plan to be able to run 5 km in eight weeks?",
            "As a complete beginner who has never run, what training plan will get me running 5 kilometres within eight weeks?",
            "Give me an 8-week training plan for a total beginner who wants to be able to run 5 km.",
            "Suggest a good eight-week program to go from never having run at all to running a 5K.",
            "What's a sensible plan for a first-time runner to build up to running five kilometers in 8 weeks?",
        ],
        {
            "number": [
                "I have never run before; what is a good training plan to be able to run 5 km in four weeks?",
                "I have never run before; what is a good training plan to be able to run 10 km in eight weeks?",
            ],
            "antonym": [
                "I have never run before; what is a good training plan to be able to walk 5 km in eight weeks?"
            ],
            "restriction": [
                "I have never run before; what is a good training plan to be able to run 5 km in eight weeks at the age of 70?"
            ],
        },
    ),
    (
        [
            "How much money should I keep in an emergency fund?",
            "How big should my emergency fund be?",
            "What's the recommended size of an emergency savings fund?",
            "How much should I save up for emergencies?",
            "Tell me how much cash to set aside in a rainy-day fund for unexpected expenses.",
        ],
        {
            "restriction": [
                "How much money should I keep in an emergency fund if I am self-employed?"
            ],
            "number": ["How much money should I keep in an emergency fund for a family of 4?"],
            "question": ["Where should I keep the money in an emergency fund?"],
        },
    ),
    (
        [
            "Do I need a visa to travel from the United States to Japan for a two-week vacation?",
            "Is a visa required for a two-week holiday trip from the US to Japan?",
            "Will I need a visa when flying from the United States to Japan for a 2-week vacation?",
            "Tell me whether I must get a visa to go from the United States to Japan on a two-week vacation.",
            "Going from the U.S. to Japan for two weeks of vacation, is a visa necessary?",
        ],
        {
            "order": [
                "Do I need a visa to travel from Japan to the United States for a two-week vacation?"
            ],
            "entity": [
                "Do I need a visa to travel from the United States to China for a two-week vacation?"
            ],
            "number": [
                "Do I need a visa to travel from the United States to Japan for a six-month vacation?"
            ],
        },
    ),
    (
        [
            "What is the best way to unclog a kitchen sink drain without using any harsh chemicals or drain cleaners?",
            "How can I clear a blocked kitchen sink drain without harsh chemicals or store-bought drain cleaner?",
            "Tell me the most effective chemical-free method to unblock a clogged kitchen sink drain.",
            "My kitchen sink is clogged; what's the best way to fix it without any chemical drain cleaners?",
            "Without resorting to harsh chemicals or drain cleaner, how do I best unclog the drain of my kitchen sink?",
        ],
        {
            "negation": [
                "What is the best way to unclog a kitchen sink drain using harsh chemicals or drain cleaners?"
            ],
            "entity": [
                "What is the best way to unclog a toilet without using any harsh chemicals or drain cleaners?"
            ],
        },
    ),
    (
        [
            "How do I convert miles to kilometers?",
            "What's the formula to change miles into kilometres?",
            "How can I turn a distance in miles into kilometers?",
            "Explain how to convert a figure in miles to km.",
            "Miles to kilometers: how do I do the conversion?",
        ],
        {
            "order": ["How do I convert kilometers to miles?"],
            "number": ["How do I convert miles to meters?"],
            "restriction": ["How do I convert nautical miles to kilometers?"],
        },
    ),
    (
        [
            "How do I get rid of aphids on my roses?",
            "What's the best way to remove aphids from rose bushes?",
            "My roses are covered in aphids; how can I get rid of them?",
            "How can I kill the aphids infesting my roses?",
            "Tell me how to eliminate aphids from my rose plants.",
        ],
        {
            "entity": ["How do I get rid of black spot on my roses?"],
            "question": ["Why are there aphids on my roses?"],
            "negation": ["How do I get rid of aphids on my roses without pesticides?"],
        },
    ),
    (
        [
            "Roughly how many calories does a 70 kg person burn walking at a normal pace for 30 minutes?",
            "If I weigh 70 kg and walk at a normal pace for half an hour, about how many calories will I burn?",
            "Estimate the calories burned by a 70-kilogram person during a 30-minute walk at normal speed.",
            "How many calories does walking at an ordinary pace for 30 minutes burn for someone weighing 70 kg?",
            "For a person of 70 kg, what's the approximate calorie burn of thirty minutes of walking at a regular pace?",
        ],
        {
            "number": [
                "Roughly how many calories does a 70 kg person burn walking at a normal pace for 60 minutes?",
                "Roughly how many calories does a 90 kg person burn walking at a normal pace for 30 minutes?",
            ],
            "antonym": [
                "Roughly how many calories does a 70 kg person burn running at a normal pace for 30 minutes?"
            ],
            "restriction": [
                "Roughly how many calories does a 70 kg person burn walking uphill at a normal pace for 30 minutes?"
            ],
        },
    ),
    (
        [
            "How do I descale a kettle with vinegar?",
            "What's the method for removing limescale from a kettle using vinegar?",
            "How can I use vinegar to descale my kettle?",
            "Tell me how to get limescale out of a kettle with white vinegar.",
            "Explain how to clean the mineral build-up out of a kettle using vinegar.",
        ],
        {
            "negation": ["How do I descale a kettle without vinegar?"],
            "entity": ["How do I descale a coffee maker with vinegar?"],
        },
    ),
    (
        [
            "How long can cooked chicken stay in the fridge?",
            "How many days does cooked chicken keep in the refrigerator?",
            "How long is leftover cooked chicken safe to eat when refrigerated?",
            "What's the fridge shelf life of cooked chicken?",
            "Tell me for how long cooked chicken can be stored in the fridge.",
        ],
        {
            "antonym": ["How long can raw chicken stay in the fridge?"],
            "entity": ["How long can cooked rice stay in the fridge?"],
            "negation": ["How long can cooked chicken stay out of the fridge?"],
        },
    ),
    (
        [
            "Can a person with type O blood donate to someone with type A?",
            "Is it possible for someone with blood type O to give blood to a type A recipient?",
            "Can type O blood be given to a patient who is type A?",
            "Can a type O donor give blood to a person with type A blood?",
            "Is blood from a type O donor compatible with a type A recipient?",
        ],
        {
            "order": ["Can a person with type A blood donate to someone with type O?"],
            "antonym": ["Can a person with type O blood receive from someone with type A?"],
            "restriction": ["Can a person with type O blood donate plasma to someone with type A?"],
        },
    ),
    (
        [
            "How many US dollars is one euro worth?",
            "What's the exchange rate from euros to US dollars?",
            "How many dollars do I get for 1 euro?",
            "Convert one euro into US dollars.",
            "What is the value of a single euro in American dollars?",
        ],
        {
            "order": ["How many euros is one US dollar worth?"],
            "entity": ["How many US dollars is one British pound worth?"],
            "number": ["How many US dollars is 500 euros worth?"],
        },
    ),
    (
        [
            "What is the difference between a virus and a bacterium?",
            "How do viruses differ from bacteria?",
            "Explain the difference between viruses and bacteria.",
            "What distinguishes a virus from a bacterium?",
            "Tell me how a virus and a bacterium are different from each other.",
        ],
        {
            "entity": ["What is the difference between a virus and a fungus?"],
            "restriction": [
                "What is the difference between a virus and a bacterium in how they are treated?"
            ],
            "question": ["Which is bigger, a virus or a bacterium?"],
        },
    ),
    (
        [
            "What is inflation in economics?",
            "Explain what inflation means in economics.",
            "Define economic inflation.",
            "What does the term inflation mean when talking about an economy?",
            "Can you tell me what economists mean when they talk about inflation?",
        ],
        {
            "antonym": ["What is deflation in economics?"],
            "restriction": ["What is hyperinflation in economics?"],
            "question": ["What causes inflation in economics?"],
        },
    ),
    (
        [
            "What is the difference between an alligator and a crocodile?",
            "How can I tell an alligator apart from a crocodile?",
            "How do alligators differ from crocodiles?",
            "Explain the differences between alligators and crocodiles.",
            "Alligator vs crocodile: what sets them apart?",
        ],
        {
            "entity": ["What is the difference between an alligator and a caiman?"],
            "restriction": ["What is the difference in size between an alligator and a crocodile?"],
            "question": ["Which is more dangerous, an alligator or a crocodile?"],
        },
    ),
    (
        [
            "What does GDP measure?",
            "What is measured by gross domestic product?",
            "Explain what GDP is a measure of.",
            "What does gross domestic product actually measure in an economy?",
            "Tell me what a country's GDP figure measures.",
        ],
        {
            "negation": ["What does GDP not measure?"],
            "entity": ["What does CPI measure?"],
            "question": ["How is GDP calculated?"],
        },
    ),
    (
        [
            "Is a tomato a fruit or a vegetable?",
            "Should a tomato be classified as a fruit or as a vegetable?",
            "Are tomatoes fruits or vegetables?",
            "Tell me whether the tomato is a fruit or a vegetable.",
            "Is the tomato technically a vegetable, or is it a fruit?",
        ],
        {
            "entity": ["Is a mushroom a fruit or a vegetable?"],
            "restriction": ["Is a tomato a fruit or a vegetable for tax purposes?"],
        },
    ),
    (
        [
            "What is compound interest?",
            "Explain compound interest.",
            "What does compound interest mean?",
            "Can you define compound interest for me?",
            "Give me a definition of compound interest.",
        ],
        {
            "antonym": ["What is simple interest?"],
            "negation": ["What is interest that does not compound?"],
            "number": ["What is compound interest on $1,000 at 5% for 10 years?"],
            "restriction": ["What is compound interest on a credit card?"],
        },
    ),
    (
        [
            "Explain what a black hole is.",
            "What is a black hole?",
            "Tell me what black holes are.",
            "Can you explain the concept of a black hole?",
            "What exactly is a black hole in space?",
        ],
        {
            "entity": ["Explain what a neutron star is."],
            "antonym": ["Explain what a white hole is."],
            "question": ["Explain how a black hole forms."],
        },
    ),
    (
        [
            "Can I use baking powder instead of baking soda?",
            "Is it okay to substitute baking powder for baking soda?",
            "Will baking powder work in place of baking soda in a recipe?",
            "If a recipe calls for baking soda, can I use baking powder?",
            "Can baking powder replace baking soda when I'm baking?",
        ],
        {
            "order": ["Can I use baking soda instead of baking powder?"],
            "entity": ["Can I use baking powder instead of yeast?"],
        },
    ),
]


def pairs(split: Split) -> list[Pair]:
    """The labelled pairs of one split."""
    chosen = list(
        enumerate(
            INTENTS + SEEN_HELD_OUT_INTENTS + SEEN_LATER_INTENTS + SEEN_VERIFIER_INTENTS
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
