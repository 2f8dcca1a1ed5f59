"""Generated package blurbs and their one-line synopsis: summarization offline.

A stand-in for the Debian descriptions (`pipelines.summarization.debian`) that needs
no apt lists: each example describes a made-up package in three to five
sentences, in shuffled order, and its synopsis names the package, its
language, kind and purpose. The package names are invented words, seen once
in the whole corpus, so a model can write them only by copying them from the
source (out of vocabulary); the other synopsis words are chosen among the
description's many facts (the attention has to find them).

Example:

>>> pairs = generate_blurbs(2, seed=0)
>>> len(pairs), all(p[1].split(" - ")[0] in p[0] for p in pairs)
(2, True)
"""

from __future__ import annotations

import random

SYLLABLES = (
    "ba be bo da de di do fa fe ga go ka ke ki ko la le li lo ma me mi mo na ne "
    "no pa pe po ra re ri ro sa se si so ta te ti to va ve vi vo za ze zo"
).split()
CODAS = ("", "", "k", "n", "r", "s", "x", "l", "t")
LANGUAGES = ("python", "perl", "rust", "java", "ruby", "go", "haskell", "lua")
KINDS = ("library", "tool", "daemon", "plugin", "editor", "server", "client")
PURPOSES = (
    "json files",
    "audio streams",
    "network packets",
    "image metadata",
    "log files",
    "font rendering",
    "disk usage",
    "unit tests",
    "chess games",
    "email filtering",
    "spell checking",
    "music playlists",
)
FEATURES = (
    "supports plugins",
    "runs on every platform",
    "has a small memory footprint",
    "reads its settings from a single file",
    "is fast and easy to extend",
    "comes with a command line interface",
    "can be used from shell scripts",
    "keeps a cache on disk",
)
PARTS = ("documentation", "development files", "shared library", "examples")


def package_name(rng: random.Random) -> str:
    """An invented word of two or three syllables and a coda: ``"zorikan"``."""
    syllables = rng.choices(SYLLABLES, k=rng.choice((2, 3)))
    return "".join(syllables) + rng.choice(CODAS)


def blurb(rng: random.Random, name: str) -> tuple[str, str]:
    """One ``(description, synopsis)`` pair for the package ``name``."""
    language, kind, purpose = (
        rng.choice(LANGUAGES),
        rng.choice(KINDS),
        rng.choice(PURPOSES),
    )
    features = rng.sample(FEATURES, 2)
    part = rng.choice(PARTS)
    opening = rng.choice(
        (
            f"{name} is a {kind} for {purpose}, written in {language}.",
            f"this package provides {name}, a {language} {kind} for {purpose}.",
        )
    )
    others = [
        f"it {features[0]} and {features[1]}.",
        f"the {kind} is maintained by a small team of volunteers.",
        f"this package contains the {part}.",
    ]
    rng.shuffle(others)
    sentences = [opening, *others[: rng.choice((2, 3))]]
    if rng.random() < 0.5:  # the name's sentence is not always the first
        sentences.insert(1, sentences.pop(0))
    synopsis = f"{name} - {language} {kind} for {purpose}"
    if f"contains the {part}" in " ".join(sentences):
        synopsis += f" ({part})"
    return " ".join(sentences), synopsis


def generate_blurbs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` pairs with distinct package names; deterministic in ``seed``."""
    if n < 0:
        raise ValueError(f"n must be at least 0, got {n}")
    rng = random.Random(seed)
    names: set[str] = set()
    pairs = []
    while len(pairs) < n:
        name = package_name(rng)
        if name in names:
            continue
        names.add(name)
        pairs.append(blurb(rng, name))
    return pairs
