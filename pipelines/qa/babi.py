"""Generated bAbI-style question answering: stories, questions, supporting facts.

Written from the task definitions of Weston et al. (2015), "Towards AI-Complete
Question Answering: A Set of Prerequisite Toy Tasks"; it is not the original
bAbI data (no copy of it can be installed here), only stories of the same
kinds, generated from a seed. Eight of the twenty tasks are made (`TASKS`).

A story is a sequence of statements with questions in between. Each question
is answered from the statements before it, and becomes one `QAExample` whose
``story`` is those statements, oldest first (the story's earlier questions are
not part of it); ``supporting`` indexes the statements the answer follows from.

The world of tasks 1 to 11: four actors (Mary and Sandra are "she", John and
Daniel "he") move between six locations; in tasks 2, 3, 7 and 8 they also
pick up and drop three objects. Every move goes somewhere else than where the
actor is; "went back to" only to a place the actor has been in. An actor
carries what they hold; only an actor whose location is known picks up, only
an object nobody holds and that lies there (or has not been seen yet); only
what one holds is dropped, where one is.

* 1, single supporting fact: moves. "Where is Mary?": her location; the
  support is her last move.
* 2, two supporting facts: "Where is the milk?", asked once it has been
  picked up. Held: the holder's location; support: the holder's latest pick-up
  of it and latest move. Dropped: where it was dropped; support: the drop and
  the dropper's latest move before it.
* 3, three supporting facts: an object's locations are those it has been in,
  consecutive repeats merged; it changes location only when its holder moves.
  "Where was the milk before the garden?" is asked when the garden is its
  latest location and it was somewhere before: the answer is where it was
  just before it last came to the garden. That last trip was a move of its
  holder at the time, who had picked it up before; the support is that
  pick-up, the holder's move to the garden, and the holder's move before it
  (the one that put the holder, and so the milk, in the answer's location:
  made while carrying it, or the one before the pick-up, which tells where
  the holder picked it up).
* 6, yes/no questions: moves. "Is Mary in the kitchen?": "yes" or "no", half
  and half; support: her last move.
* 7, counting: "How many objects is Mary carrying?": "none" to "three", asked
  about actors who have picked something up. Support: for each object she
  ever picked up, her latest pick-up of it if she holds it, else her latest
  drop of it.
* 8, lists/sets: as 7, "What is Mary carrying?": the objects she holds joined
  by "," in the order she picked them up ("apple,milk"), or "nothing".
* 11, basic coreference: two statements before each question, mostly a named
  move and then a pronoun one of the same actor ("Then he went to the
  kitchen."). "Where is Daniel?": his location; support: his last move, and
  if it is a pronoun statement, the statement before it that names him.
* 15, basic deduction: four rules, one per species ("Sheep are afraid of
  wolves.", never of their own kind), then four names ("Gertrude is a
  sheep."), then three questions: "What is Gertrude afraid of?": "wolf";
  support: her species' statement and its rule.

Example:

>>> example = generate_task(1, 2, seed=0)[-1]
>>> print(format_story(example))
Sandra journeyed to the kitchen.
Sandra went to the hallway.
Mary moved to the bedroom.
Daniel travelled to the bathroom.
>>> example.question, example.answer, example.supporting
('Where is Mary?', 'bedroom', (2,))
>>> train, valid, test, notes = load_babi([1, 15], size=20, test_size=10)
>>> len(train), len(valid), len(test)
(36, 4, 20)
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.core.config import deprecated
from pipelines.core.errors import PipelineError
from pipelines.data.user_files import field_error, jsonl_objects, shown

TASKS: dict[int, str] = {
    1: "single supporting fact",
    2: "two supporting facts",
    3: "three supporting facts",
    6: "yes/no questions",
    7: "counting",
    8: "lists/sets",
    11: "basic coreference",
    15: "basic deduction",
}

ACTORS = ("Mary", "John", "Daniel", "Sandra")
PRONOUNS = {"Mary": "she", "John": "he", "Daniel": "he", "Sandra": "she"}
LOCATIONS = ("bathroom", "hallway", "garden", "office", "bedroom", "kitchen")
OBJECTS = ("football", "apple", "milk")
MOVE_VERBS = ("moved to the", "went to the", "journeyed to the", "travelled to the")
RETURN_VERB = "went back to the"
GRAB_VERBS = ("picked up the", "got the", "grabbed the", "took the")
DROP_VERBS = ("dropped the", "discarded the", "put down the", "left the")
THEN = ("Then", "Following that", "After that")
COUNTS = ("none", "one", "two", "three")
SPECIES = {"mouse": "mice", "sheep": "sheep", "wolf": "wolves", "cat": "cats"}
NAMES = ("Gertrude", "Winona", "Jessica", "Emily")

MAX_STORY = 130
"""No story has more statements than this before a question."""


@dataclass(frozen=True)
class QAExample:
    """One question with the story it is asked about.

    Attributes:
        story: the statements before the question, oldest first ("Mary moved
            to the bathroom.").
        question: "Where is Mary?".
        answer: one word; for task 8 the objects joined by "," in the order
            picked up, or "nothing". Generated answers are lowercase; those
            read by `read_qa_jsonl` are the user's text.
        supporting: 0-based indices into ``story`` of the facts the answer
            follows from, sorted ascending (empty when the user gave none).
        task: the bAbI task number; 0 for the user's own data.
    """

    story: tuple[str, ...]
    question: str
    answer: str
    supporting: tuple[int, ...]
    task: int = 0


def format_story(example: QAExample) -> str:
    """The story as the serving input takes it: its statements joined by "\\n"."""
    return "\n".join(example.story)


# --- the world of tasks 1 to 11 ---------------------------------------------


class _World:
    """Actors, locations and objects, and the statements told so far."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.story: list[str] = []
        self.location: dict[str, str] = {}  # actor -> where they are
        self.last_move: dict[str, int] = {}  # actor -> statement index
        self.visited: dict[str, list[str]] = {actor: [] for actor in ACTORS}
        self.held: dict[str, list[str]] = {actor: [] for actor in ACTORS}  # in order
        # actor -> {object: her latest pick-up of it if held, else latest drop}
        self.touched: dict[str, dict[str, int]] = {actor: {} for actor in ACTORS}
        self.holder: dict[str, str] = {}  # object -> actor holding it
        self.lies: dict[str, str] = {}  # object -> where it was dropped
        self.grab: dict[str, int] = {}  # object -> its latest pick-up
        self.drop: dict[str, tuple[int, int]] = {}  # object -> (drop, move before)
        # object -> (previous location, location, the three facts of task 3)
        self.arrival: dict[str, tuple[str, str, tuple[int, int, int]]] = {}

    def _tell(self, sentence: str) -> int:
        self.story.append(sentence)
        return len(self.story) - 1

    def move(self, actor: str, opener: str = "") -> int:
        """A move of ``actor`` somewhere new; ``opener`` makes it a pronoun one."""
        here = self.location.get(actor)
        there = self.rng.choice([place for place in LOCATIONS if place != here])
        verbs = MOVE_VERBS + ((RETURN_VERB,) if there in self.visited[actor] else ())
        verb = self.rng.choice(verbs)
        subject = f"{opener} {PRONOUNS[actor]}" if opener else actor
        index = self._tell(f"{subject} {verb} {there}.")
        for item in self.held[actor]:
            facts = (self.grab[item], self.last_move[actor], index)
            self.arrival[item] = (here, there, facts)  # `here` is known: she holds
        self.location[actor] = there
        self.last_move[actor] = index
        if there not in self.visited[actor]:
            self.visited[actor].append(there)
        return index

    def can_grab(self) -> list[tuple[str, str]]:
        return [
            (actor, item)
            for actor in ACTORS
            if actor in self.location
            for item in OBJECTS
            if item not in self.holder
            and self.lies.get(item, self.location[actor]) == self.location[actor]
        ]

    def can_drop(self) -> list[tuple[str, str]]:
        return [(actor, item) for actor in ACTORS for item in self.held[actor]]

    def take(self, actor: str, item: str) -> None:
        index = self._tell(f"{actor} {self.rng.choice(GRAB_VERBS)} {item}.")
        self.holder[item] = actor
        self.lies.pop(item, None)
        self.held[actor].append(item)
        self.touched[actor][item] = index
        self.grab[item] = index

    def put(self, actor: str, item: str) -> None:
        index = self._tell(f"{actor} {self.rng.choice(DROP_VERBS)} {item}.")
        del self.holder[item]
        self.lies[item] = self.location[actor]
        self.held[actor].remove(item)
        self.touched[actor][item] = index
        self.drop[item] = (index, self.last_move[actor])

    def step(self, weights: tuple[float, float, float], carry: float = 0.0) -> None:
        """One random statement: a move, pick-up or drop, by ``weights``.

        ``carry``: the chance that a move is one of an actor holding something.
        """
        grabs, drops = self.can_grab(), self.can_drop()
        move, grab, drop = weights
        grab, drop = (grab if grabs else 0.0), (drop if drops else 0.0)
        draw = self.rng.random() * (move + grab + drop)
        if draw >= move + grab:
            self.put(*self.rng.choice(drops))
        elif draw >= move:
            self.take(*self.rng.choice(grabs))
        else:
            carriers = [actor for actor in ACTORS if self.held[actor]]
            if carriers and self.rng.random() < carry:
                self.move(self.rng.choice(carriers))
            else:
                self.move(self.rng.choice(ACTORS))

    def example(
        self, task: int, question: str, answer: str, facts: Sequence[int]
    ) -> QAExample:
        return QAExample(
            tuple(self.story), question, answer, tuple(sorted(facts)), task
        )


# --- one story of each task: the list of its questions ----------------------


def _moves_story(rng: random.Random, task: int) -> list[QAExample]:
    """Tasks 1 and 6: two moves before each of five questions."""
    world, examples = _World(rng), []
    for _ in range(5):
        for _ in range(2):
            world.move(rng.choice(ACTORS))
        actor = rng.choice([actor for actor in ACTORS if actor in world.location])
        here, facts = world.location[actor], (world.last_move[actor],)
        if task == 1:
            examples.append(world.example(1, f"Where is {actor}?", here, facts))
            continue
        yes = rng.random() < 0.5
        place = here if yes else rng.choice([p for p in LOCATIONS if p != here])
        question = f"Is {actor} in the {place}?"
        examples.append(world.example(6, question, "yes" if yes else "no", facts))
    return examples


def _coreference_story(rng: random.Random) -> list[QAExample]:
    """Task 11: a named move, mostly followed by a pronoun move of the same actor."""
    world, examples = _World(rng), []
    support: dict[str, tuple[int, ...]] = {}
    for _ in range(5):
        actor = rng.choice(ACTORS)
        first = world.move(actor)
        if rng.random() < 0.8:
            second = world.move(actor, opener=rng.choice(THEN))
            support[actor] = (first, second)
        else:
            support[actor] = (first,)
            other = rng.choice([name for name in ACTORS if name != actor])
            support[other] = (world.move(other),)
        asked = rng.choice([name for name in ACTORS if name in support])
        examples.append(
            world.example(
                11, f"Where is {asked}?", world.location[asked], support[asked]
            )
        )
    return examples


def _objects_story(rng: random.Random, task: int) -> list[QAExample]:
    """Tasks 2, 3, 7 and 8: moves, pick-ups and drops, questions in between."""
    world, examples = _World(rng), []
    if task == 2:
        weights, carry, first, gap, count = (0.55, 0.3, 0.15), 0.3, (4, 10), (2, 6), 5
    elif task == 3:
        weights, carry, first, gap, count = (0.5, 0.35, 0.15), 0.6, (12, 30), (3, 10), 5
    else:
        weights, carry, first, gap, count = (0.35, 0.4, 0.25), 0.0, (3, 6), (1, 3), 5
    told = 0  # statements before the previous question
    while len(examples) < count:
        for _ in range(rng.randint(*(gap if examples else first)) - 1):
            world.step(weights, carry)
        while len(world.story) < MAX_STORY:
            world.step(weights, carry)
            example = _ask(world, task, told)
            if example is not None:
                examples.append(example)
                told = len(world.story)
                break
        else:
            break  # the story grew too long before a question could be asked
    return examples


def _ask(world: _World, task: int, told: int) -> QAExample | None:
    """A question of ``task`` about the world now, or None when none fits.

    Task 3 asks only about a trip made since the previous question (``told``
    statements before it), so that each question needs its own facts.
    """
    rng = world.rng
    if task == 2:
        known = [item for item in OBJECTS if item in world.holder or item in world.lies]
        if not known:
            return None
        item = rng.choice(known)
        question = f"Where is the {item}?"
        if item in world.holder:
            actor = world.holder[item]
            facts = (world.grab[item], world.last_move[actor])
            return world.example(2, question, world.location[actor], facts)
        return world.example(2, question, world.lies[item], world.drop[item])
    if task == 3:
        fresh = [
            item
            for item in OBJECTS
            if item in world.arrival and world.arrival[item][2][2] >= told
        ]
        if not fresh:
            return None
        item = rng.choice(fresh)
        before, there, facts = world.arrival[item]
        question = f"Where was the {item} before the {there}?"
        return world.example(3, question, before, facts)
    actors = [actor for actor in ACTORS if world.touched[actor]]
    if not actors:
        return None
    actor = rng.choice(actors)
    facts = tuple(world.touched[actor].values())
    held = world.held[actor]
    if task == 7:
        question = f"How many objects is {actor} carrying?"
        return world.example(7, question, COUNTS[len(held)], facts)
    answer = ",".join(held) if held else "nothing"
    return world.example(8, f"What is {actor} carrying?", answer, facts)


def _deduction_story(rng: random.Random) -> list[QAExample]:
    """Task 15: four rules, four names, three questions."""
    species = list(SPECIES)
    afraid = {kind: rng.choice([k for k in species if k != kind]) for kind in species}
    rules = list(species)
    rng.shuffle(rules)
    names = list(NAMES)
    rng.shuffle(names)
    kind_of = {name: rng.choice(species) for name in names}
    story = [
        f"{SPECIES[k].capitalize()} are afraid of {SPECIES[afraid[k]]}." for k in rules
    ]
    story += [f"{name} is a {kind_of[name]}." for name in names]
    examples = []
    for name in rng.sample(NAMES, 3):
        kind = kind_of[name]
        facts = tuple(sorted((rules.index(kind), 4 + names.index(name))))
        question = f"What is {name} afraid of?"
        examples.append(QAExample(tuple(story), question, afraid[kind], facts, 15))
    return examples


def _stories(task: int, rng: random.Random) -> Iterator[list[QAExample]]:
    """The questions of one story after another, without end."""
    while True:
        if task in (1, 6):
            yield _moves_story(rng, task)
        elif task == 11:
            yield _coreference_story(rng)
        elif task == 15:
            yield _deduction_story(rng)
        else:
            yield _objects_story(rng, task)


def _rng(task: int, seed: int, stream: str) -> random.Random:
    # A string seed is hashed with SHA-512: the same in every process.
    return random.Random(f"babi:task {task}:seed {seed}:{stream}")


# --- the public generators ----------------------------------------------------


def _check_task(task: object) -> int:
    if isinstance(task, bool) or not isinstance(task, int) or task not in TASKS:
        available = ", ".join(f"{n} ({name})" for n, name in TASKS.items())
        raise ValueError(
            f"bAbI task {task!r} is not available; the available tasks are {available}"
        )
    return task


def _check_count(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"`{name}` must be {kind}, received {value!r}")
    return value


def generate_task(task: int, questions: int, seed: int) -> list[QAExample]:
    """``questions`` examples of one task, deterministic in ``seed``.

    Stories are generated with ``random.Random`` seeded from ``task`` and
    ``seed``, so tasks differ for the same seed; the last story's questions
    are cut where the count is reached.

    Args:
        task: a key of `TASKS`.
        questions: how many examples, 0 or more.
        seed: any int.

    Returns:
        The examples, the questions of each story in order.
    """
    _check_task(task)
    _check_count("questions", questions, minimum=0)
    examples: list[QAExample] = []
    for story in _stories(task, _rng(task, seed, "train")):
        if len(examples) >= questions:
            break
        examples += story[: questions - len(examples)]
    return examples


def _unseen(
    stories: Iterator[list[QAExample]], count: int, seen: set[tuple]
) -> tuple[list[QAExample], int]:
    """``count`` examples whose (story, question) is not in ``seen``; the
    number skipped."""
    examples: list[QAExample] = []
    skipped = 0
    for story in stories:
        for example in story:
            if len(examples) == count:
                return examples, skipped
            if (example.story, example.question) in seen:
                skipped += 1
                if skipped > 1000 + 10 * count:
                    raise RuntimeError(
                        f"bAbI task {example.task}: could not find {count} "
                        "questions unseen in training"
                    )
            else:
                examples.append(example)
        if len(examples) == count:
            return examples, skipped
    raise AssertionError("the stories never end")


def load_babi(
    tasks: Sequence[int],
    size: int = 1000,
    test_size: int = 1000,
    valid_fraction: float = 0.1,
    seed: int = 0,
) -> tuple[list[QAExample], list[QAExample], list[QAExample], list[str]]:
    """Training, validation and test questions of the given tasks.

    For each task, ``size`` questions (bAbI's "1k" is 1000, "10k" 10000) of
    which ``valid_fraction`` are held out for validation (as Sukhbaatar et
    al. 2015 did), and ``test_size`` test questions from another seed stream.
    Training takes the first questions of the task's stories (those of
    `generate_task`), validation the questions of the stories after them,
    so the two share no story. A validation or test question whose (story,
    question) equals a training one is dropped and replaced; the counts hold.

    Args:
        tasks: keys of `TASKS`, each once; the lists keep this order.
        size: training and validation questions per task.
        test_size: test questions per task.
        valid_fraction: the share of ``size`` held out, in [0, 1).
        seed: any int.

    Returns:
        ``(train, valid, test, notes)``: the tasks' examples one after another,
        and one line per task with its sizes and how many questions were
        replaced.
    """
    tasks = list(tasks)
    if not tasks:
        raise ValueError("`tasks` is empty; give at least one bAbI task")
    for task in tasks:
        _check_task(task)
    repeated = sorted({task for task in tasks if tasks.count(task) > 1})
    if repeated:
        raise ValueError(f"`tasks` names task(s) {repeated} more than once: {tasks}")
    _check_count("size", size)
    _check_count("test_size", test_size)
    if (
        isinstance(valid_fraction, bool)
        or not isinstance(valid_fraction, int | float)
        or not 0 <= valid_fraction < 1
    ):
        raise ValueError(
            f"`valid_fraction` must be a number in [0, 1), received {valid_fraction!r}"
        )
    valid_size = round(size * valid_fraction)
    train_size = size - valid_size
    if train_size < 1:
        raise ValueError(
            f"`size` {size} with `valid_fraction` {valid_fraction} leaves no "
            "training question"
        )
    train: list[QAExample] = []
    valid: list[QAExample] = []
    test: list[QAExample] = []
    notes: list[str] = []
    for task in tasks:
        stories = _stories(task, _rng(task, seed, "train"))
        task_train: list[QAExample] = []
        while len(task_train) < train_size:  # the rest of the last story is left
            task_train += next(stories)[: train_size - len(task_train)]
        seen = {(example.story, example.question) for example in task_train}
        task_valid, valid_skipped = _unseen(stories, valid_size, seen)
        task_test, test_skipped = _unseen(
            _stories(task, _rng(task, seed, "test")), test_size, seen
        )
        train += task_train
        valid += task_valid
        test += task_test
        notes.append(
            f"task {task} ({TASKS[task]}): {len(task_train)} train, "
            f"{len(task_valid)} valid, {len(task_test)} test; {valid_skipped} "
            f"valid and {test_skipped} test questions regenerated (seen in "
            "training)"
        )
    return train, valid, test, notes


_SPEC = re.compile(r"babi:(?P<tasks>[^@]+)(?:@(?P<size>[^@]+))?")
_SPEC_HELP = (
    'expected "babi:TASKS" or "babi:TASKS@SIZE", TASKS being "all" or task '
    'numbers and ranges separated by commas ("1,2,3", "1-3,6"), SIZE a '
    'positive count, "1k" or "10k" ("babi:1-3@10k")'
)


def parse_babi_spec(spec: str) -> tuple[list[int], int]:
    """The tasks and the size a data spec names.

    ``"babi:1,2,3"`` gives ``([1, 2, 3], 1000)``; ``"babi:1-3@10k"``
    ``([1, 2, 3], 10000)``; ``"babi:all@1k"`` all of `TASKS`; ``"babi:1@250"``
    ``([1], 250)``.

    Raises:
        ValueError: saying what was expected and what was received.
    """
    text = spec.strip() if isinstance(spec, str) else spec
    match = _SPEC.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"bAbI data spec: {_SPEC_HELP}; received {spec!r}")
    size_text = (match["size"] or "1k").strip().lower()
    size_match = re.fullmatch(r"(\d+)(k?)", size_text)
    size = int(size_match[1]) * (1000 if size_match[2] else 1) if size_match else 0
    if size < 1:
        raise ValueError(
            f"bAbI data spec {spec!r}: the size must be a positive count, "
            f'"1k" or "10k", received {match["size"]!r}'
        )
    tasks_text = match["tasks"].strip().lower()
    if tasks_text == "all":
        return list(TASKS), size
    tasks: list[int] = []
    for part in tasks_text.split(","):
        numbers = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if numbers is None or (numbers[2] and int(numbers[2]) < int(numbers[1])):
            raise ValueError(
                f"bAbI data spec {spec!r}: {_SPEC_HELP}; received the task "
                f"part {part.strip()!r}"
            )
        first, last = int(numbers[1]), int(numbers[2] or numbers[1])
        for task in range(first, last + 1):
            if task not in TASKS:
                available = ", ".join(map(str, TASKS))
                raise ValueError(
                    f"bAbI data spec {spec!r}: task {task} is not available; "
                    f"the available tasks are {available}"
                )
            if task in tasks:
                raise ValueError(f"bAbI data spec {spec!r}: task {task} given twice")
            tasks.append(task)
    return tasks, size


# --- the user's own data --------------------------------------------------------


def read_qa_jsonl(path: str | Path) -> list[QAExample]:
    """Questions from the user's JSON Lines file, one object a line.

    Each object has ``"story"``: a string of sentences separated by newlines
    (blank lines are no sentences) or a list of sentence strings;
    ``"question"`` and ``"answer"``: strings; and optionally ``"supporting"``:
    0-based indices into the sentences. Blank lines are skipped. Text is
    stripped; the examples have ``task`` 0. ``"context"``, the old name of
    ``"story"``, is still read, with a one-line deprecation notice.

    Raises:
        PipelineError: the file is missing or unreadable, or a line is not
            such an object; the message names the file, the line (from 1),
            the field, what was expected and what was received.
    """
    expected = 'a JSON object with "story", "question" and "answer"'
    rows = jsonl_objects(path, expected)
    if any("context" in row and "story" not in row for _, row in rows):
        deprecated('field "context"', '"story"', str(path))
    return [_qa_row(where, row) for where, row in rows]


# A sentence ends at a line break, or at . ! or ? before white space: the
# rule of the export's graph (`pipelines.qa.serving.split_sentences`).
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n")


def split_story(text: str) -> list[str]:
    """A story's sentences, each one memory, as training, ``predict`` and
    the export split them.

    >>> split_story("Mary moved. John went to the hallway!\\n Bill left")
    ['Mary moved.', 'John went to the hallway!', 'Bill left']
    """
    return [s.strip() for s in SENTENCE_BREAK.split(text) if s.strip()]


def _qa_row(where: str, row: dict) -> QAExample:
    """The example of one object of `read_qa_jsonl`'s file."""

    def bad(field: str, expected: str, received: str | None = None) -> PipelineError:
        return field_error(where, row, field, expected, received)

    name = "context" if "context" in row and "story" not in row else "story"
    if name == "story" and "context" in row:
        raise bad("context", 'only "story" (its new name), not both')
    story = row.get(name)
    if isinstance(story, str):
        sentences = split_story(story)
    elif isinstance(story, list):
        sentences = []
        for i, sentence in enumerate(story):
            if not isinstance(sentence, str) or not sentence.strip():
                raise bad(
                    f"{name}[{i}]", "a non-blank sentence string", shown(sentence)
                )
            sentences.append(sentence.strip())
    else:
        raise bad(
            name,
            "a string of sentences separated by newlines or a list of sentence strings",
        )
    if not sentences:
        raise bad(name, "at least one sentence")
    texts = []
    for field in ("question", "answer"):
        value = row.get(field)
        if not isinstance(value, str) or not value.strip():
            raise bad(field, "a non-blank string")
        texts.append(value.strip())
    supporting = row.get("supporting", [])
    if not isinstance(supporting, list):
        raise bad("supporting", "a list of 0-based sentence indices")
    for i, index in enumerate(supporting):
        if (
            isinstance(index, bool)
            or not isinstance(index, int)
            or not 0 <= index < len(sentences)
        ):
            raise bad(
                f"supporting[{i}]",
                f"a sentence index from 0 to {len(sentences) - 1} (the story "
                f"has {len(sentences)} sentence(s))",
                shown(index),
            )
    return QAExample(
        tuple(sentences), texts[0], texts[1], tuple(sorted(set(supporting))), 0
    )
