"""A seeded generator of text-rendering (OCR) prompts, and a check of OCR prompt files.

A prompt is a scene template x a target phrase x a closing detail, the target in double quotes
(the `ocr` reward reads the text between the first pair, `tasks.ocr_text.quoted_target`). Templates
and phrases are written here. The number of words of the target is drawn from `WORD_COUNT_WEIGHTS`,
measured on flow_grpo's OCR prompt set (dataset/ocr/test.txt, 1018 prompts: 1 word 4.3%, 2 words
24.0%, 3 words 43.5%, 4 words 22.8%, 5 or more 5.4%; quoted text of 2-29 characters, median 17);
every phrase here is at most `MAX_TARGET_CHARS` characters.

Train and test targets are disjoint (each phrase group is split once by a fixed seed), so the test
set measures rendering of texts never trained on; prompts are unique within a file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from roll_spotlight.tasks.ocr_text import normalize_text, quoted_target
from roll_spotlight.tasks.prompt_files import load_prompt_file

MAX_TARGET_CHARS = 29
WORD_COUNT_WEIGHTS = {1: 0.043, 2: 0.240, 3: 0.435, 4: 0.228, 5: 0.054}
TEST_PHRASE_FRACTION = 0.2
PHRASE_SPLIT_SEED = 20250718

TEMPLATES: tuple[str, ...] = (
    'A weathered wooden sign at the entrance of a forest trail, carved with the words "{text}"',
    'A vintage concert poster pasted on a brick wall, bold letters across the top reading "{text}"',
    'A plain white T-shirt laid flat on a bed, printed with "{text}" in black block letters',
    'A glowing pink neon sign that reads "{text}" mounted above the bar of a dim cocktail lounge',
    'A hardcover book on a library table, its cover titled "{text}" in embossed gold lettering',
    'A chalkboard menu outside a small cafe, with "{text}" written in neat white chalk',
    'A storefront window with "{text}" painted in curved gold letters on the glass',
    'A birthday cake on a kitchen counter, "{text}" piped across the top in blue icing',
    'A coffee mug on a wooden desk, printed with the phrase "{text}" in a playful font',
    'A highway billboard at dusk advertising "{text}" in huge red letters',
    'A movie theater marquee lit by rows of bulbs, spelling out "{text}"',
    'A small ankle tattoo of fine-line lettering that spells "{text}"',
    'A handwritten sticky note on a computer monitor that says "{text}"',
    'A green street sign on a lamp post at a quiet intersection, reading "{text}"',
    'A graffiti mural on the side of a subway car with "{text}" in bright spray paint',
    'A smartphone lying on a table, its lock screen displaying "{text}" in large white type',
    'A wooden crate at a farmers market stamped with "{text}" in faded ink',
    'A protest placard held high above a crowd, hand-lettered with "{text}"',
    'A vintage typewriter with a sheet of paper in it, the typed line reading "{text}"',
    'A sandy beach at low tide with "{text}" written in the wet sand by a stick',
    'A knitted winter scarf with "{text}" stitched into its pattern in cream yarn',
    'A spaceship hull panel stenciled with "{text}" in weathered yellow paint',
    'A frosted bakery window with "{text}" written by a finger in the condensation',
    'An old brass plaque on a stone building engraved with "{text}"',
    'A skateboard deck leaning against a wall, its underside printed with "{text}"',
    'A laptop sticker on a silver lid, a round badge that reads "{text}"',
    'A paper lantern at a night festival painted with the words "{text}"',
    'A baseball cap on a hook, embroidered on the front with "{text}"',
    'A hand-painted sign on a roadside fruit stand that says "{text}"',
    'A museum banner hanging between two marble columns announcing "{text}"',
    'A ceramic doormat in front of a blue door with "{text}" written on it',
    'A glowing arcade cabinet screen flashing "{text}" in pixel letters',
)

DETAILS: tuple[str, ...] = (
    "photographed in soft morning light.",
    "with a shallow depth of field and a blurred background.",
    "under warm evening light, realistic photo.",
    "on a rainy day, reflections shimmering on wet surfaces.",
    "shot from a low angle, vivid colors and sharp focus.",
    "in a cozy, slightly vintage film look.",
    "at night, lit by a single street lamp.",
    "high resolution photograph, crisp legible lettering.",
    "surrounded by autumn leaves and long shadows.",
    "in a bright, minimal setting with clean lines.",
)

PHRASES: dict[int, tuple[str, ...]] = {
    1: ("Open", "Closed", "Welcome", "Sale", "Exit", "Bakery", "Coffee", "Dream", "Hope", "Brave",
        "Paradise", "Adventure", "Library", "Pharmacy", "Garage", "Harmony", "Breathe", "Courage",
        "Freedom", "Sunrise", "Midnight", "Legend", "Wanderlust", "Joy", "Gratitude", "Serenity",
        "Believe", "Imagine", "Victory", "Focus", "Kindness", "Explore", "Evolve", "Resilience",
        "Bistro", "Hotel", "Cinema", "Arcade", "Museum", "Bookshop", "Florist", "Brewery", "Diner",
        "Studio", "Observatory", "Lighthouse", "Thunder", "Eclipse", "Infinity", "Nebula", "Solstice"),
    2: ("Fresh Bread", "Grand Opening", "Stay Wild", "Good Vibes", "Hello World", "No Parking",
        "Quiet Please", "Live Music", "Happy Birthday", "Game Over", "Best Seller", "Ocean View",
        "Night Market", "Pizza Palace", "Moon Cafe", "Dream Big", "Stay Curious", "Keep Going",
        "Lost Island", "Mountain Pass", "Silver Lining", "Golden Hour", "Free Wifi", "Vintage Records",
        "Private Property", "Daily Specials", "Urban Jungle", "Coffee Break", "Summer Vibes",
        "Winter Sale", "Fresh Flowers", "Secret Garden", "Space Station", "Rocket Launch", "Deep Focus",
        "Hot Cocoa", "Jazz Night", "Sweet Dreams", "Blue Lagoon", "Red Planet", "Wild Horses",
        "Bright Future", "Pure Energy", "Time Travel", "Star Gazer", "Tea House", "Book Club",
        "Snow Day", "Road Trip", "Lucky Charm", "Open Late", "Fire Station", "Bus Stop", "Green Valley",
        "Iron Forge", "Paper Moon", "Salt Flats", "River Walk", "Crystal Cave", "Neon Dreams",
        "Cloud Nine", "Zero Gravity", "Danger Zone", "Pet Friendly", "Cash Only", "Robot Repair",
        "Solar Power", "Ice Cream", "Fish Market", "Taco Tuesday"),
    3: ("Save The Planet", "Keep It Simple", "Back In Five", "Mind The Gap", "Home Sweet Home",
        "Fresh Baked Daily", "Out Of Order", "Beware Of Dog", "Gone Fishing Today", "Wild Berry Jam",
        "Mystery Book Club", "Lunar Base Alpha", "Sunset Beach Bar", "Ancient Ruins Ahead",
        "The Last Chapter", "Trust The Process", "Make Art Daily", "Coffee Is Life", "Stars Above Us",
        "Magic Potion Shop", "Dragon Egg Hatchery", "Retro Game Night", "Morning Yoga Class",
        "City Of Lights", "Lost And Found", "Thank You Kindly", "Caution Wet Floor", "Welcome Back Home",
        "Handmade With Love", "Farm Fresh Eggs", "Built To Last", "Spring Flower Show",
        "Harvest Moon Festival", "Robot Comedy Club", "Deep Sea Diver", "Quantum Physics Lab",
        "Tiny Plant Shop", "Northern Lights Tour", "Silent Disco Tonight", "Midnight Ramen Bar",
        "Vinyl Record Store", "Open Mic Night", "Kids Eat Free", "Happy New Year", "Good Morning Sunshine",
        "Push To Start", "Do Not Disturb", "Final Boarding Call", "Gate Closes Soon",
        "Space Cadet Academy", "Desert Rose Motel", "Blue Moon Diner", "Golden Gate Bakery",
        "Snowy Peak Lodge", "Rainy Day Books", "Under New Management", "Grand Prix Finals",
        "Championship Game Tonight", "Limited Edition Sneakers", "Coming Soon Nearby", "World Peace Now",
        "Stay Positive Always", "Chase The Sun", "Reach For Stars", "Ocean Breeze Spa", "Pixel Art Gallery",
        "Forest Ranger Station", "Ghost Town Saloon", "Candy Land Express", "Fire Exit Only",
        "Lemonade Two Dollars", "Piano Lessons Available", "Skate Park Rules", "Bike Lane Ends",
        "School Zone Ahead", "Tickets Sold Out", "Ice Skating Rink", "Carnival Of Wonders",
        "Mars Or Bust", "Hello From Tokyo"),
    4: ("Life Is A Journey", "The Future Is Now", "Best Pizza In Town", "Welcome To The Jungle",
        "Where Dreams Come True", "All You Can Eat", "Tacos Every Single Day", "No Shoes No Service",
        "Keep Calm Carry On", "Think Outside The Box", "Eat Sleep Code Repeat", "Follow The White Rabbit",
        "Beware Of The Cat", "Grand Opening This Weekend", "Fresh Coffee Brewed Daily",
        "Save Water Save Life", "Books Are Magic Portals", "Winter Is Coming Soon", "Made In Small Batches",
        "Gym Closed For Repairs", "Please Ring The Bell", "Lunch Special Only Today",
        "Under The Sea Aquarium", "Cats Rule The World", "Just Married This Spring",
        "Happy Birthday Dear Anna", "Catch Of The Day", "Fish And Chips Shop", "Rise And Shine Bakery",
        "Dream Catcher Gift Shop", "Mission Control To Rover", "Hold On To Hope",
        "Never Stop Exploring Earth", "Coffee Before Talking Please", "Plants Make People Happy",
        "Stay Safe Wear Helmets", "Dinner Is Served Now", "Silence Is Golden Here",
        "Slow Down Kids Playing", "Hot Soup Served Here", "One Way Traffic Only",
        "Warning High Voltage Area", "Knowledge Is Power Always", "Pancakes All Day Long",
        "Moonlight Jazz Club Tonight", "Bakery Opens At Seven", "Meet Me At Midnight",
        "Second Floor Art Studio", "Watch For Falling Rocks", "Welcome Aboard Captain Lee"),
    5: ("Take Only What You Need", "Do What Makes You Happy", "Life Is Better At Sea",
        "Go Where You Feel Alive", "All Roads Lead To Rome", "Keep Your Eyes On Stars",
        "Today Is A Good Day", "Love Is All You Need", "Please Do Not Feed Ducks", "Home Is Where Heart Is",
        "Every Day Is A Gift", "Hold The Door For Others", "Save The Last Dance Here",
        "Wash Your Hands Before Eating", "Time Flies When Having Fun", "Welcome To Our Little Farm",
        "Mind Your Step On Stairs", "The Best Is Yet Ahead", "Art Is Never Truly Finished",
        "Dogs Are Welcome In Here"),
}


def split_phrases(word_count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train, test) phrases of one word count; a fixed split, the same for every seed."""
    phrases = PHRASES[word_count]
    order = np.random.default_rng([PHRASE_SPLIT_SEED, word_count]).permutation(len(phrases))
    n_test = max(1, round(TEST_PHRASE_FRACTION * len(phrases)))
    return tuple(phrases[i] for i in order[n_test:]), tuple(phrases[i] for i in order[:n_test])


def ocr_prompt(template: str, text: str, detail: str) -> str:
    return f"{template.format(text=text)}, {detail}"


def make_ocr_prompts(split: str, n: int, seed: int) -> list[str]:
    """n distinct prompts of a split ("train" | "test"), deterministic in (split, n, seed)."""
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} must be 'train' or 'test'")
    if n < 1:
        raise ValueError(f"n_{split}={n!r} must be >= 1")
    rng = np.random.default_rng([seed, split == "test"])
    counts = sorted(WORD_COUNT_WEIGHTS)
    weights = np.array([WORD_COUNT_WEIGHTS[k] for k in counts])
    per_count = rng.multinomial(n, weights / weights.sum())
    prompts = []
    for word_count, m in zip(counts, per_count):
        prompts += _draw_group(rng, split_phrases(word_count)[split == "test"], int(m), split)
    return [prompts[i] for i in rng.permutation(len(prompts))]


def _draw_group(rng: np.random.Generator, phrases: tuple[str, ...], m: int, split: str) -> list[str]:
    """m distinct (phrase, template, detail) combinations, drawn without replacement."""
    n_combos = len(phrases) * len(TEMPLATES) * len(DETAILS)
    if m > n_combos:
        raise ValueError(f"n_{split} asks {m} prompts of one text length, more than the {n_combos} "
                         f"distinct ones; ask for fewer prompts")
    out = []
    for index in rng.choice(n_combos, size=m, replace=False):
        phrase, rest = divmod(int(index), len(TEMPLATES) * len(DETAILS))
        template, detail = divmod(rest, len(DETAILS))
        out.append(ocr_prompt(TEMPLATES[template], phrases[phrase], DETAILS[detail]))
    return out


def write_ocr_prompts(out_dir: str | Path, n_train: int, n_test: int, seed: int) -> tuple[Path, Path]:
    """Writes out_dir/train.txt and out_dir/test.txt (one prompt per line); returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "train.txt", out / "test.txt")
    for path, split, n in zip(paths, ("train", "test"), (n_train, n_test)):
        path.write_text("\n".join(make_ocr_prompts(split, n, seed)) + "\n", encoding="utf-8")
    return paths


def check_ocr_prompt_file(path: str | Path) -> list[str]:
    """The OCR targets of a one-prompt-per-line file; ValueError naming file and line for a prompt
    without a non-empty quoted target (the `ocr` reward could not score it)."""
    targets = []
    for record in load_prompt_file(path, "txt"):
        try:
            target = quoted_target(record.text)
        except ValueError as err:
            raise ValueError(f"{record.where}: {err}") from None
        if not normalize_text(target):
            raise ValueError(f"{record.where}: the quoted OCR target of {record.text!r} is empty")
        targets.append(target)
    return targets
