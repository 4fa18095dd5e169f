"""What a similarity threshold misses: a cheap check that two prompts agree in negation,
numbers, named entities and a list of antonyms.

Sentence embeddings place "How do I sort a list?" and "How do I not sort a list?" close
together, and "capital of France" near "capital of Germany"; a semantic hit must pass the
threshold *and* this check. It is pure and conservative: when in doubt, it disagrees, and
the request is a miss (only latency is lost).
"""

from __future__ import annotations

import re

# Tuned on the tuning half of the labelled set (``shared/cache/labelled.py``): the lowest
# threshold whose false hits stay at zero there; the held-out half's figures are checked by
# tests/unit/test_semantic_labelled.py.
SEMANTIC_THRESHOLD = 0.86

_WORD = re.compile(r"[A-Za-z][A-Za-z']*|\d+(?:[.,]\d+)*")
_NEGATIONS = frozenset(
    "not no never none nobody nothing neither nor without cannot cant dont doesnt didnt "
    "isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt mustnt "
    "except excluding unless".split()
)
_NUMBER_WORDS = frozenset(
    "zero two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million billion first second third fourth fifth sixth "
    "seventh eighth ninth tenth half double twice triple dozen".split()
)
_ANTONYMS = (
    "increase decrease|largest smallest|biggest smallest|max min|maximum minimum|"
    "before after|first last|add remove|ascending descending|encode decode|upper lower|"
    "uppercase lowercase|open close|start end|buy sell|hot cold|more less|best worst|"
    "longest shortest|fastest slowest|north south|east west|enable disable|true false|"
    "import export|left right|above below|inside outside|push pop|win lose|accept reject|"
    "compress decompress|encrypt decrypt|serialize deserialize|higher lower|older newer|"
    "oldest newest|cheap expensive|cheapest expensive|early late|earliest latest|"
    "input output|read write|send receive|allow deny|connect disconnect|lock unlock|"
    "install uninstall|advantages disadvantages|pros cons|benefits risks|safe dangerous|"
    "healthy unhealthy|legal illegal|possible impossible|sync async|synchronous asynchronous|"
    "even odd|positive negative|rise fall|gain lose|heavier lighter|faster slower|"
    "larger smaller|bigger smaller|longer shorter|warmer colder|hottest coldest|"
    "key value|keys values|horizontal vertical|horizontally vertically|empty full|"
    "boiling freezing|boil freeze|melting freezing|create delete|create rename|"
    "handle raise|catch raise|catch throw|sort shuffle|list tuple|integer float|square cube|"
    "join split|merge split|kill list|hard easy|dry wet|slow quick|in out|on off|up down|"
    "enter exit|import remove|zip unzip|mount unmount|show hide|visible hidden|"
    "minimum average|maximum average|mean median|sum product|soft hard|runny hard|"
    "raw cooked|fresh frozen|full partial|public private|local remote|global local"
)
_OPPOSITE: dict[str, frozenset[str]] = {}
for _pair in _ANTONYMS.split("|"):
    _a, _b = _pair.split()
    _OPPOSITE[_a] = _OPPOSITE.get(_a, frozenset()) | {_b}
    _OPPOSITE[_b] = _OPPOSITE.get(_b, frozenset()) | {_a}
_STOPWORDS = frozenset(
    "a an the of to in on at by for from with into onto and or is are was were be been do "
    "does did how what which who whom when where why can could should would will i you my "
    "me it its this that these those there their your using use way get tell name".split()
)
_DIRECTION = frozenset({"to", "into", "as", "than", "vs", "versus"})
# Short forms read as the word they stand for, so "str to int" meets "string to integer".
_SAME_AS = {
    "int": "integer",
    "ints": "integers",
    "str": "string",
    "strs": "strings",
    "dict": "dictionary",
    "dicts": "dictionaries",
    "js": "javascript",
    "py": "python",
    "repo": "repository",
    "db": "database",
    "num": "number",
    "arr": "array",
}
_NOT_ENTITIES = frozenset({"i", "i'm", "i've", "i'd", "i'll", "ok"})
_SENTENCE_END = frozenset(".?!:;\n")


class Slots:
    """The parts of a text the check compares."""

    __slots__ = ("entities", "negated", "numbers", "sequence", "words")

    def __init__(self, text: str) -> None:
        words: list[str] = []
        entities: set[str] = set()
        numbers: list[str] = []
        initial = True
        last_end = 0
        for m in _WORD.finditer(text):
            between = text[last_end : m.start()]
            if any(c in _SENTENCE_END for c in between):
                initial = True
            last_end = m.end()
            raw = m.group()
            low = _norm(raw)
            words.append(low)
            if raw[0].isdigit():
                numbers.append(raw.replace(",", ""))
            elif low in _NUMBER_WORDS:
                numbers.append(low)
            elif _is_entity(raw, initial) and raw.lower() not in _NOT_ENTITIES:
                entities.add(low)
            initial = False
        if re.search(r"n't\b", text, re.IGNORECASE):
            words.append("not")
        self.sequence = [w for w in words if w not in _STOPWORDS or w in _DIRECTION]
        self.words = frozenset(words)
        self.entities = frozenset(entities)
        self.numbers = tuple(sorted(numbers))
        self.negated = bool(self.words & _NEGATIONS)


def _norm(raw: str) -> str:
    low = raw.lower()
    if low.endswith("'s"):
        low = low[:-2]
    low = low.replace("'", "")
    return _SAME_AS.get(low, low)


def _stem(word: str) -> str:
    """A crude stem, enough to match "safely" with "safe" and "keys" with "key"."""
    for suffix in ("ing", "ed", "ly", "es", "s"):
        if word.endswith(suffix) and len(word) >= len(suffix) + 3 and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def _is_entity(raw: str, initial: bool) -> bool:
    """A capitalised word inside a sentence, or an acronym / CamelCase name anywhere."""
    if len(raw) > 1 and raw.isupper():
        return True
    if any(c.isupper() for c in raw[1:]) and raw[0].isalpha():
        return True
    return raw[0].isupper() and not initial


def disagreement(a: str, b: str) -> str | None:
    """Why two prompts must not share an answer (``negation``, ``numbers``, ``entities``,
    ``antonyms``), or None when the check finds nothing."""
    sa, sb = Slots(a), Slots(b)
    if sa.negated != sb.negated:
        return "negation"
    if sa.numbers != sb.numbers:
        return "numbers"
    # An entity of one text must be a word of the other (case aside): "Python" ~ "python".
    if not (sa.entities <= sb.words and sb.entities <= sa.words):
        return "entities"
    a_stems = {_stem(w) for w in sa.words} | sa.words
    b_stems = {_stem(w) for w in sb.words} | sb.words
    for word in a_stems - b_stems:
        if _OPPOSITE.get(word, frozenset()) & (b_stems - a_stems):
            return "antonyms"
    if _directions(sa.sequence) & {(y, x) for x, y in _directions(sb.sequence)}:
        return "direction"
    if _one_slot_swapped(sa.sequence, sb.sequence):
        return "substitution"
    return None


def _one_slot_swapped(a: list[str], b: list[str]) -> bool:
    """Whether the texts say the same but for one content word each ("soft yolk" against
    "hard yolk", "time complexity" against "space complexity"): the shape of a one-slot
    edit. Paraphrases reword more than one slot, so refusing this costs few hits."""
    sa = {_stem(w) for w in a if w not in _DIRECTION}
    sb = {_stem(w) for w in b if w not in _DIRECTION}
    return len(sa - sb) == 1 and len(sb - sa) == 1 and len(sa & sb) >= 2


def _directions(seq: list[str]) -> set[tuple[str, str]]:
    """(source, target) of each "X to Y" / "X into Y" / "from X ... Y": "Celsius to
    Fahrenheit" against "Fahrenheit to Celsius" is the opposite request."""
    out: set[tuple[str, str]] = set()
    for i, word in enumerate(seq):
        if word in _DIRECTION:
            for x in seq[max(0, i - 2) : i]:
                for y in seq[i + 1 : i + 3]:
                    out.add((_stem(x), _stem(y)))
    return out
