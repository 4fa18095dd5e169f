"""What a similarity threshold misses: a cheap check that two prompts agree in negation,
numbers, quantifiers, named entities, a list of antonyms and words of one kind that stand
for different things (co-hyponyms: "string" and "array", "gold" and "silver").

Sentence embeddings place "How do I sort a list?" and "How do I not sort a list?" close
together, and "capital of France" near "capital of Germany"; a semantic hit must pass the
threshold *and* this check. It is pure and conservative: when in doubt, it disagrees, and
the request is a miss (only latency is lost).
"""

from __future__ import annotations

import re

# The similarity below which the semantic index need not look: the lowest at which the
# verifier (``shared/cache/verify.py``, tuned on the labelled set's tuning split) can pass
# a candidate, by ``shared.cache.evaluate.candidate_threshold``; a hit needs the threshold,
# this check and the verifier. tests/unit/test_semantic_labelled.py checks it and reads
# the held-out split's figures.
SEMANTIC_THRESHOLD = 0.62

_WORD = re.compile(r"[A-Za-z][A-Za-z']*|\d+(?:[.,]\d+)*")
_NEGATIONS = frozenset(
    "not no never none nobody nothing neither nor without cannot cant dont doesnt didnt "
    "isnt arent wasnt werent wont wouldnt shouldnt couldnt hasnt havent hadnt mustnt "
    "except excluding unless prevent avoid ignoring ignore".split()
)
# "keep a div from being centered", "stop print from adding a newline": a negation too.
_KEEP_FROM = re.compile(r"\b(?:keep|stop|prevent)\w*\b[^.?!]*?\bfrom\b", re.IGNORECASE)
# What a question asks for: "when" and "where" of one thing are two questions. Both texts
# must say it for it to count (most paraphrases ask "what ..." of any of these).
_ASKS = {
    "when": "time",
    "where": "place",
    "who": "person",
    "whom": "person",
    "why": "reason",
}
_ASKS_YEAR = re.compile(r"\b(?:what|which) (?:year|date|day|time)\b", re.IGNORECASE)
# A count ("how many languages") is not the thing counted ("what language"): the word
# counted, when the other text names it in the singular and counts nothing.
_COUNTED = re.compile(r"\b(?:how many|number of|count of)\s+(\w+)", re.IGNORECASE)
_NUMBER_WORDS = frozenset(
    "zero two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million billion first second third fourth fifth sixth "
    "seventh eighth ninth tenth half double twice triple dozen".split()
)
# "stop a container" and "stop all containers" ask different things. Words of scope and
# quantity, each read as its class ("every" is "all"), compared as sets; "how many" and
# "how much" ask a question and quantify nothing.
_QUANTIFIERS = {
    "all": "all",
    "every": "all",
    "entire": "all",
    "whole": "all",
    "both": "both",
    "many": "many",
    "multiple": "many",
    "several": "many",
    "few": "few",
    "each": "each",
    "including": "including",
    "along": "including",
    "together": "including",
}
# A comparison against an amount ("over 100 MB", "smaller than 100 MB", "exceed 100"): the
# word read as its side when "than" or a number follows it, compared as sets.
_COMPARISONS = {
    **dict.fromkeys(
        "over above exceed exceeds exceeding greater larger bigger higher more longer "
        "beyond heavier older".split(),
        "more",
    ),
    **dict.fromkeys(
        "under below less fewer smaller lower shorter beneath lighter younger".split(), "less"
    ),
}
# Superlatives and ordinals pick one thing out of many ("the largest city" is not "the
# capital"), and an order named is not the order left unsaid: their classes must agree too
# ("tallest" is "highest", "latest" is "last"). "best" is left out: "the best way to" is a manner of speaking that wants no ranking.
_DEGREES = {
    "largest": "top",
    "biggest": "top",
    "highest": "top",
    "tallest": "top",
    "greatest": "top",
    "max": "top",
    "maximum": "top",
    "smallest": "bottom",
    "lowest": "bottom",
    "least": "bottom",
    "min": "bottom",
    "minimum": "bottom",
    "longest": "long",
    "shortest": "short",
    "fastest": "fast",
    "quickest": "fast",
    "slowest": "slow",
    "oldest": "old",
    "earliest": "old",
    "newest": "new",
    "latest": "new",
    "last": "new",
    "recent": "new",
    "youngest": "young",
    "cheapest": "cheap",
    "hottest": "hot",
    "coldest": "cold",
    "deepest": "deep",
    "heaviest": "heavy",
    "lightest": "light",
    "nearest": "near",
    "closest": "near",
    "farthest": "far",
    "furthest": "far",
    "worst": "bad",
    "next": "next",
    "ascending": "ascending",
    "increasing": "ascending",
    "descending": "descending",
    "decreasing": "descending",
    "previous": "previous",
}
# Words of one kind that embeddings place close together but that name different things:
# a word of a kind in one text must be a word of the other when the other names another
# of that kind ("length of a string" against "length of an array").
_KINDS = (
    "string array list tuple set dictionary map integer float boolean char character byte "
    "bytes object class function method module package file folder directory variable "
    "column row table index queue stack tree graph heap vector matrix|"
    "gold silver copper iron lead zinc tin aluminium aluminum platinum nickel mercury|"
    "hydrogen oxygen nitrogen carbon helium sodium potassium calcium chlorine|"
    "water ethanol alcohol milk oil vinegar|"
    "red orange yellow green blue purple violet black white grey gray pink brown|"
    "monday tuesday wednesday thursday friday saturday sunday|"
    "january february march april may june july august september october november december|"
    "mercury venus earth mars jupiter saturn uranus neptune pluto moon sun|"
    "second seconds minute minutes hour hours day days night nights week weeks weekend "
    "weekends month months year years decade century meal meals serving servings|"
    "meter meters metre metres kilometer kilometers mile miles inch inches foot feet yard "
    "yards centimeter centimeters millimeter millimeters|"
    "gram grams kilogram kilograms pound pounds ounce ounces ton tons|"
    "celsius fahrenheit kelvin|"
    "time date space memory distance|"
    "adult child children baby newborn infant teenager|"
    "create merge rename copy move|"
    "capital city country state continent ocean river mountain lake island|"
    "chicken beef pork fish egg eggs rice bread pasta|"
    "cat dog horse cow bird human|"
    "cup pot glass bottle mug|"
    "tea coffee juice beer wine|"
    "linux windows macos android ios|"
    "tcp udp http https|"
    "walk run jog swim cycle bike drive fly sail|"
    "formula name symbol"
)
_KIND_OF: dict[str, int] = {}
for _n, _group in enumerate(_KINDS.split("|")):
    for _word in _group.split():
        _KIND_OF.setdefault(_word, _n)
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
    "healthy unhealthy|good bad|good harmful|helpful harmful|start stop|"
    "legal illegal|possible impossible|sync async|synchronous asynchronous|"
    "even odd|positive negative|rise fall|gain lose|heavier lighter|faster slower|"
    "larger smaller|bigger smaller|longer shorter|warmer colder|hottest coldest|"
    "key value|keys values|horizontal vertical|horizontally vertically|empty full|"
    "boiling freezing|boil freeze|melting freezing|create delete|create rename|"
    "handle raise|catch raise|catch throw|sort shuffle|list tuple|integer float|square cube|"
    "join split|merge split|kill list|hard easy|dry wet|slow quick|in out|on off|up down|"
    "enter exit|import remove|zip unzip|mount unmount|show hide|visible hidden|"
    "minimum average|maximum average|mean median|sum product|soft hard|runny hard|"
    "raw cooked|fresh frozen|full partial|public private|local remote|global local|deep shallow|"
    "deeply shallow"
)
_OPPOSITE: dict[str, frozenset[str]] = {}
for _pair in _ANTONYMS.split("|"):
    _a, _b = _pair.split()
    _OPPOSITE[_a] = _OPPOSITE.get(_a, frozenset()) | {_b}
    _OPPOSITE[_b] = _OPPOSITE.get(_b, frozenset()) | {_a}
_STOPWORDS = frozenset(
    "a an the of to in on at by for from with into onto and or is are was were be been do "
    "does did how what which who whom when where why can could should would will i you my "
    "me it its this that these those there their your using use way get tell name has have "
    "had".split()
)
_DIRECTION = frozenset({"to", "into", "as", "than", "vs", "versus", "from"})
# "X from Y" and "X out of Y" go from Y to X: read backwards, so "a dict from two lists"
# meets "two lists to a dict" and stands against "two lists from a dict".
_BACKWARD = frozenset({"from"})
_OUT_OF = re.compile(r"\bout of\b", re.IGNORECASE)
# A question of time, place or reason asks what a text without one of these words does
# not ("when was the telephone invented" against "who invented the telephone").
_ASKED_BY = {
    "time": frozenset("when year years date day time century decade era".split()),
    "place": frozenset("where location located place situated country city region".split()),
    "reason": frozenset("why reason reasons cause causes because makes".split()),
}
# The prefixes that turn a word into its undoing or its opposite ("set" and "unset",
# "hide" and "unhide", "like" and "dislike", "activate" and "deactivate").
_UNDOING = ("un", "dis", "de", "non")
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
    "daily": "day",
    "nightly": "night",
    "weekly": "week",
    "monthly": "month",
    "yearly": "year",
    "annually": "year",
    "annual": "year",
    "hourly": "hour",
}
_NOT_ENTITIES = frozenset({"i", "i'm", "i've", "i'd", "i'll", "ok"})
_SENTENCE_END = frozenset(".?!:;\n")


class Slots:
    """The parts of a text the check compares."""

    __slots__ = (
        "asks",
        "compared",
        "counted",
        "degrees",
        "entities",
        "negated",
        "numbers",
        "quantifiers",
        "roles",
        "sequence",
        "words",
    )

    def __init__(self, text: str) -> None:
        text = _OUT_OF.sub("from", text)
        words: list[str] = []
        entities: set[str] = set()
        numbers: list[str] = []
        numbers_at: set[int] = set()
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
                numbers_at.add(len(words) - 1)
            elif low in _NUMBER_WORDS:
                numbers.append(low)
                numbers_at.add(len(words) - 1)
            elif _is_entity(raw, initial) and raw.lower() not in _NOT_ENTITIES:
                entities.add(low)
            initial = False
        if re.search(r"n't\b", text, re.IGNORECASE):
            words.append("not")
        self.sequence = [w for w in words if w not in _STOPWORDS or w in _DIRECTION]
        # Numbers and opposites said together, in the order the text says them: "forward
        # local port 8080 to a remote port" has "local" before "remote". (Names are mostly
        # the setting, "Python: how do I ..." against "... in Python", not roles.)
        said = set(words)
        self.roles = [
            w
            for i, w in enumerate(words)
            if i in numbers_at or _OPPOSITE.get(w, frozenset()) & said
        ]
        self.words = frozenset(words)
        self.entities = frozenset(entities)
        self.numbers = tuple(sorted(numbers))
        self.negated = bool(self.words & _NEGATIONS) or bool(_KEEP_FROM.search(text))
        self.asks = frozenset(_ASKS[w] for w in words if w in _ASKS) | (
            {"time"} if _ASKS_YEAR.search(text) else set()
        )
        self.counted = frozenset(_norm(m.group(1)) for m in _COUNTED.finditer(text))
        asked = {i + 1 for i, w in enumerate(words) if w == "how"}
        self.quantifiers = frozenset(
            _QUANTIFIERS[w] for i, w in enumerate(words) if w in _QUANTIFIERS and i not in asked
        )
        self.degrees = frozenset(_DEGREES[w] for w in words if w in _DEGREES)
        self.compared = frozenset(
            _COMPARISONS[w]
            for i, w in enumerate(words)
            if w in _COMPARISONS and _amount_follows(words, i, numbers_at)
        )


def _amount_follows(words: list[str], i: int, numbers_at: set[int]) -> bool:
    """Whether ``words[i]`` compares with an amount: "than", or a number within the next
    two words ("over 100", "more than 5", "exceeds 2 GB")."""
    after = words[i + 1 : i + 3]
    return bool(after) and (after[0] == "than" or any(j in numbers_at for j in (i + 1, i + 2)))


def _norm(raw: str) -> str:
    low = raw.lower()
    if low.endswith("'s"):
        low = low[:-2]
    low = low.replace("'", "")
    return _SAME_AS.get(low, low)


def word_key(word: str) -> str:
    """The form two texts' words are matched in: lower-cased, short forms expanded ("str"
    is "string"), crudely stemmed ("keys" is "key")."""
    return _stem(_norm(word))


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
    if sa.asks and sb.asks and sa.asks != sb.asks:
        return "question"
    if _asks_unanswered(sa, sb) or _asks_unanswered(sb, sa):
        return "question"
    if _count_against_one(sa, sb) or _count_against_one(sb, sa):
        return "question"
    if sa.numbers != sb.numbers:
        return "numbers"
    if sa.quantifiers != sb.quantifiers:
        return "quantifiers"
    if sa.degrees != sb.degrees:
        return "degree"
    if sa.compared != sb.compared:
        return "comparison"
    # An entity of one text must be a word of the other (case aside): "Python" ~ "python".
    if not (sa.entities <= sb.words and sb.entities <= sa.words):
        return "entities"
    a_stems = {_stem(w) for w in sa.words} | sa.words
    b_stems = {_stem(w) for w in sb.words} | sb.words
    for word in a_stems - b_stems:
        if _OPPOSITE.get(word, frozenset()) & (b_stems - a_stems):
            return "antonyms"
    if _other_of_a_kind(a_stems, b_stems):
        return "kind"
    if _undone(a_stems, b_stems) or _undone(b_stems, a_stems):
        return "antonyms"
    if _counts_another(sa, sb):
        return "question"
    if _directions(sa.sequence) & {(y, x) for x, y in _directions(sb.sequence)}:
        return "direction"
    if _swapped_roles(sa.roles, sb.roles):
        return "direction"
    # Words of one comparison ("larger than 2 GB", "over 2 GB") are one slot said two ways.
    compared = set(_COMPARISONS) if sa.compared else set()
    if _one_slot_swapped(
        [w for w in sa.sequence if w not in compared],
        [w for w in sb.sequence if w not in compared],
    ):
        return "substitution"
    return None


def _count_against_one(a: Slots, b: Slots) -> bool:
    """Whether ``a`` counts things ("how many languages") that ``b`` names one of ("what
    language") without counting."""
    if b.counted:
        return False
    return any(w not in b.words and _singular(w) & b.words for w in a.counted)


def _asks_unanswered(a: Slots, b: Slots) -> bool:
    """Whether ``a`` asks for a time, place or reason and ``b`` names none of that kind
    and asks nothing ("when was it invented" against "which inventor created it")."""
    return (
        bool(a.asks)
        and not b.asks
        and any(kind in _ASKED_BY and not (_ASKED_BY[kind] & b.words) for kind in a.asks)
    )


def _counts_another(a: Slots, b: Slots) -> bool:
    """Whether both texts count, and what each counts is not a word of the other ("how
    many sides" against "how many diagonals")."""
    if not (a.counted and b.counted) or a.counted & b.counted:
        return False
    stems_a = {_stem(w) for w in a.words}
    stems_b = {_stem(w) for w in b.words}
    return all(_stem(w) not in stems_b for w in a.counted) and all(
        _stem(w) not in stems_a for w in b.counted
    )


def _undone(a: set[str], b: set[str]) -> bool:
    """Whether ``b`` holds a word that is a word of ``a`` undone by a prefix ("unset"
    against "set", "unhide" against "hidden") and ``a`` does not hold it."""
    for word in b - a:
        for prefix in _UNDOING:
            base = word[len(prefix) :]
            if not word.startswith(prefix) or len(base) < 3:
                continue
            if any(_shares_stem(base, w) for w in a - b):
                return True
    return False


def _shares_stem(base: str, word: str) -> bool:
    """Whether ``word`` is ``base`` or a form of it: all but at most its last letter in
    common at the start ("hide" and "hidden", "set" and "sets")."""
    common = 0
    for x, y in zip(base, word, strict=False):
        if x != y:
            break
        common += 1
    return common >= max(3, len(base) - 1) and abs(len(word) - len(base)) <= 3


def _singular(word: str) -> set[str]:
    """What a plural may be the plural of: "languages" -> "language", "languag"."""
    out = set()
    if word.endswith("ies"):
        out.add(word[:-3] + "y")
    if word.endswith("es"):
        out.add(word[:-2])
    if word.endswith("s") and not word.endswith("ss"):
        out.add(word[:-1])
    return out


def _other_of_a_kind(a: set[str], b: set[str]) -> bool:
    """Whether each text names a thing of one kind that the other does not: "symbol for
    gold" against "symbol for silver"."""
    a_kinds = {_KIND_OF[w] for w in a - b if w in _KIND_OF}
    return any(_KIND_OF.get(w) in a_kinds for w in b - a)


def _one_slot_swapped(a: list[str], b: list[str]) -> bool:
    """Whether the texts say the same but for one content word each ("soft yolk" against
    "hard yolk", "time complexity" against "space complexity"): the shape of a one-slot
    edit. Paraphrases reword more than one slot, so refusing this costs few hits."""
    sa = {_stem(w) for w in a if w not in _DIRECTION}
    sb = {_stem(w) for w in b if w not in _DIRECTION}
    return len(sa - sb) == 1 and len(sb - sa) == 1 and len(sa & sb) >= 2


def _swapped_roles(a: list[str], b: list[str]) -> bool:
    """Whether two numbers or opposites that both texts say come in the opposite order
    ("local ... remote" against "remote ... local", "port 8080 to 80" against "port 80 to
    8080"): the same parts in other roles."""
    shared = set(a) & set(b)
    first_a = {w: a.index(w) for w in shared}
    first_b = {w: b.index(w) for w in shared}
    ordered = sorted(shared, key=first_a.__getitem__)
    return any(first_b[x] > first_b[y] for i, x in enumerate(ordered) for y in ordered[i + 1 :])


def _directions(seq: list[str]) -> set[tuple[str, str]]:
    """(source, target) of each "X to Y" / "X into Y" / "from X ... Y": "Celsius to
    Fahrenheit" against "Fahrenheit to Celsius" is the opposite request."""
    out: set[tuple[str, str]] = set()
    for i, word in enumerate(seq):
        if word in _DIRECTION:
            for x in seq[max(0, i - 2) : i]:
                for y in seq[i + 1 : i + 3]:
                    if x in _DIRECTION or y in _DIRECTION:
                        continue
                    pair = (_stem(x), _stem(y))
                    out.add(pair[::-1] if word in _BACKWARD else pair)
    return out
