"""Writes ``sft_demo.jsonl`` next to this file: short question/answer pairs for ``examples/sft_demo.py``.

Deterministic (fixed seed, fixed tables; no downloads): running it again rewrites the same file.
Each line is one example in TRL's prompt-completion format, ``{"prompt": "Q: ... A:", "completion":
" ..."}``; SFTTrainer then trains on the answer tokens only.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima",
    "Canada": "Ottawa", "Mexico": "Mexico City", "Norway": "Oslo", "Sweden": "Stockholm",
    "Finland": "Helsinki", "Greece": "Athens", "Ireland": "Dublin", "Poland": "Warsaw", "Austria": "Vienna",
    "Russia": "Moscow", "India": "New Delhi", "Chile": "Santiago", "Cuba": "Havana", "Turkey": "Ankara",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "happy": "sad", "light": "dark",
    "old": "young", "open": "closed", "early": "late", "full": "empty", "hard": "soft", "high": "low",
    "near": "far", "rich": "poor", "wet": "dry", "strong": "weak", "loud": "quiet", "long": "short",
    "thick": "thin", "first": "last",
}
COLORS = {
    "a banana": "yellow", "the sky": "blue", "grass": "green", "snow": "white", "coal": "black",
    "a tomato": "red", "an orange": "orange", "a plum": "purple", "a lemon": "yellow", "milk": "white",
    "a leaf": "green", "a carrot": "orange", "the sea": "blue", "a cherry": "red", "a crow": "black",
}
SOUNDS = {
    "a dog": "woof", "a cat": "meow", "a cow": "moo", "a duck": "quack", "a sheep": "baa", "a lion": "roar",
    "an owl": "hoot", "a horse": "neigh", "a pig": "oink", "a frog": "ribbit", "a snake": "hiss", "a bee": "buzz",
}
PLURALS = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "goose": "geese", "man": "men",
    "woman": "women", "person": "people", "box": "boxes", "bus": "buses", "city": "cities", "leaf": "leaves",
    "knife": "knives", "wolf": "wolves", "fish": "fish", "sheep": "sheep", "cat": "cats", "dog": "dogs",
}
PAST = {
    "go": "went", "eat": "ate", "see": "saw", "run": "ran", "swim": "swam", "sing": "sang", "write": "wrote",
    "read": "read", "take": "took", "give": "gave", "make": "made", "come": "came", "drink": "drank",
    "fly": "flew", "sleep": "slept", "walk": "walked", "jump": "jumped", "play": "played", "think": "thought",
    "buy": "bought",
}
NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
           "sixteen seventeen eighteen nineteen twenty").split()


def _pairs() -> list[tuple[str, str]]:
    """Every (question, answer) pair, in a fixed order."""
    pairs = [(f"What is the capital of {c}?", f"The capital of {c} is {city}.") for c, city in CAPITALS.items()]
    pairs += [(f"Which city is the capital of {c}?", f"{city} is the capital of {c}.") for c, city in CAPITALS.items()]
    pairs += [(f"What is the opposite of {w}?", f"The opposite of {w} is {o}.") for w, o in OPPOSITES.items()]
    pairs += [(f"What is the opposite of {o}?", f"The opposite of {o} is {w}.") for w, o in OPPOSITES.items()]
    pairs += [(f"What color is {thing}?", f"{thing.capitalize()} is {color}.") for thing, color in COLORS.items()]
    pairs += [(f"What sound does {animal} make?", f"{animal.capitalize()} says {sound}.")
              for animal, sound in SOUNDS.items()]
    pairs += [(f"What is the plural of {w}?", f"The plural of {w} is {p}.") for w, p in PLURALS.items()]
    pairs += [(f"What comes after {NUMBERS[i]}?", f"After {NUMBERS[i]} comes {NUMBERS[i + 1]}.") for i in range(20)]
    pairs += [(f"What is {NUMBERS[a]} plus {NUMBERS[b]}?", f"{NUMBERS[a].capitalize()} plus {NUMBERS[b]} is "
               f"{NUMBERS[a + b]}.") for a in range(1, 10) for b in range(1, 10) if a + b <= 20]
    pairs += [(f"What is {NUMBERS[a]} minus {NUMBERS[b]}?", f"{NUMBERS[a].capitalize()} minus {NUMBERS[b]} is "
               f"{NUMBERS[a - b]}.") for a in range(2, 11) for b in range(1, a)]
    pairs += [(f"What is the past tense of {v}?", f"The past tense of {v} is {p}.") for v, p in PAST.items()]
    return pairs


def main() -> None:
    pairs = _pairs()
    random.Random(0).shuffle(pairs)
    path = Path(__file__).with_name("sft_demo.jsonl")
    with path.open("w") as out:
        for question, answer in pairs:
            out.write(json.dumps({"prompt": f"Q: {question} A:", "completion": f" {answer}"}) + "\n")
    print(f"wrote {len(pairs)} examples to {path}")


if __name__ == "__main__":
    main()
