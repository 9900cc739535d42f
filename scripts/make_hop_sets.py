"""Write the ``hop_train``, ``hop_detect``, ``hop_eval`` and ``hop_val`` needle sets
(deterministic).

The sets teach, rank, test and validate the non-literal "onehop" hop (a needle names a
cue, the question names what the cue links to: ``Paris`` -> ``France``). They are fixed
here, before any training, and never tuned on:

* ``hop_train``: the elicitation's training set (11 link kinds);
* ``hop_detect``: where head rankings are computed (4 of the training kinds, with other
  cues, targets, needle templates, questions and names);
* ``hop_eval``: ablations and targets (8 link kinds absent from training altogether);
* ``hop_val``: validation across link kinds (4 kinds absent from every other set, with
  cues, targets and names of their own): early stopping and recipe choices.

Every test's input_args are ``[cue, target]``: the needle names ``{1}`` (the cue), the
``direct`` question repeats the needle's words, the ``onehop`` question names ``{2}``
(the target) and shares no content word with the filled needle
(:func:`locos_tl.data.needle_sets.shared_content_words`). The script refuses to write a
set that breaks a rule (see ``tests/test_hop_sets.py``).

Usage::

    python scripts/make_hop_sets.py          # writes locos_tl/data/needle_sets/hop_*.json
    python scripts/make_hop_sets.py --check  # exit 1 when the files differ from the output
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "locos_tl" / "data" / "needle_sets"
SEED = 20250
TESTS_PER_ENTRY = 4
NAMES_PER_ENTRY = 10

# ------------------------------------------------------------------------- names
# disjoint pools (from several languages), none of them in everyday / everyday_train
TRAIN_NAMES = """Akira Sakura Haruto Ananya Vikram Deepa Chidi Ngozi Adebayo Folake Bogdan
Katya Milos Zofia Aleksei Ilse Matthias Annika Henrik Sigrid Giulia Lorenzo Beatriz Thiago
Carmen Diego Yasmin Karim Rania Hamid Mingyu Jiwoo Linh Thanh Siddharth Kavya Wanjiru
Otieno Aroha Tane""".split()
DETECT_NAMES = """Daichi Aiko Rohan Meera Obinna Amaka Radek Ludmila Jorunn Eero Paola
Valentina Rodrigo Salma Youssef Seojun Minh Tendai Lerato Anahera Ismail Noriko Svetlana
Carlos Ayesha Kaito""".split()
EVAL_NAMES = """Takeshi Emiko Nikhil Lakshmi Uchenna Ifeoma Pavel Irina Tove Aino Francesca
Alejandro Fernanda Marisol Hassan Layla Hyunwoo Quang Sipho Nomvula Wiremu Sunita Dagny
Ruslan Kemal Ayo""".split()

# ------------------------------------------------------------------------- kinds
# kind -> (needle templates with their direct questions, onehop questions,
#          (cue, target) pairs, number of entries)
TRAIN = {
    "city_country": (
        [("{CHAR} has rented a small flat in {1} since the spring.",
          "Which character has rented a small flat in {1} since the spring?"),
         ("The new bakery in {1} was opened by {CHAR}.",
          "Which character opened the new bakery in {1}?"),
         ("Every morning {CHAR} takes the tram across {1} to the office.",
          "Which character takes the tram across {1} to the office every morning?"),
         ("{CHAR} teaches piano to children in {1}.",
          "Which character teaches piano to children in {1}?")],
        ["Which character lives in {2}?", "Which character is based in {2}?",
         "Which character resides in {2}?"],
        [("Paris", "France"), ("Rome", "Italy"), ("Tokyo", "Japan"), ("Madrid", "Spain"),
         ("Berlin", "Germany"), ("Moscow", "Russia"), ("Beijing", "China"),
         ("Cairo", "Egypt"), ("Athens", "Greece"), ("Toronto", "Canada"),
         ("Sydney", "Australia"), ("Mumbai", "India"), ("Rio de Janeiro", "Brazil"),
         ("London", "England")],
        15),
    "landmark_city": (
        [("{CHAR} took a photo in front of {1}.",
          "Which character took a photo in front of {1}?"),
         ("The postcard of {1} on the fridge was sent by {CHAR}.",
          "Which character sent the postcard of the {1} on the fridge?"),
         ("{CHAR} sketched {1} from a bench on a sunny afternoon.",
          "Which character sketched {1} from a bench on a sunny afternoon?"),
         ("Standing beneath {1}, {CHAR} ate an ice cream.",
          "Which character ate an ice cream standing beneath {1}?")],
        ["Which character has been to {2}?", "Which character visited {2}?",
         "Which character went on a trip to {2}?"],
        [("the Eiffel Tower", "Paris"), ("Big Ben", "London"), ("the Colosseum", "Rome"),
         ("the Statue of Liberty", "New York"), ("the Kremlin", "Moscow"),
         ("the Acropolis", "Athens"), ("the Brandenburg Gate", "Berlin"),
         ("the Golden Gate Bridge", "San Francisco"), ("the Sagrada Familia", "Barcelona"),
         ("the Leaning Tower", "Pisa"), ("the Louvre", "Paris"),
         ("Buckingham Palace", "London"), ("the Hollywood sign", "Los Angeles"),
         ("the Forbidden City", "Beijing")],
        15),
    "dish_country": (
        [("{CHAR} made {1} for the whole family on Sunday.",
          "Which character made {1} for the whole family on Sunday?"),
         ("The plate of {1} at the corner table was ordered by {CHAR}.",
          "Which character ordered the plate of {1} at the corner table?"),
         ("{CHAR} learned to cook {1} from a grandmother.",
          "Which character learned to cook {1} from a grandmother?"),
         ("At the street festival {CHAR} sold {1} from a stall.",
          "Which character sold {1} from a stall at the street festival?")],
        ["Which character prepared a dish from {2}?", "Which character enjoyed food from {2}?",
         "Which character tried the cuisine of {2}?"],
        [("sushi", "Japan"), ("pizza", "Italy"), ("tacos", "Mexico"),
         ("croissants", "France"), ("paella", "Spain"), ("curry", "India"),
         ("kimchi", "Korea"), ("dumplings", "China"), ("bratwurst", "Germany"),
         ("moussaka", "Greece"), ("fish and chips", "England"),
         ("hamburgers", "America"), ("borscht", "Russia"), ("poutine", "Canada")],
        15),
    "animal_class": (
        [("{CHAR} feeds the {1} at the city zoo.",
          "Which character feeds the {1} at the city zoo?"),
         ("The documentary about {1} was filmed by {CHAR}.",
          "Which character filmed the documentary about {1}?"),
         ("{CHAR} counted the {1} near the river for a survey.",
          "Which character counted the {1} near the river for a survey?"),
         ("A book on {1} was written by {CHAR}.",
          "Which character wrote a book on {1}?")],
        ["Which character studies {2}?", "Which character takes care of {2}?",
         "Which character is interested in {2}?"],
        [("eagles", "birds"), ("owls", "birds"), ("penguins", "birds"), ("swans", "birds"),
         ("sharks", "fish"), ("piranhas", "fish"), ("crocodiles", "reptiles"),
         ("snakes", "reptiles"), ("lizards", "reptiles"), ("bees", "insects"),
         ("ants", "insects"), ("butterflies", "insects"), ("beetles", "insects")],
        15),
    "job_tool": (
        [("{CHAR} has worked as a {1} in the old town for years.",
          "Which character has worked as a {1} in the old town for years?"),
         ("The {1} who moved in next door is {CHAR}.",
          "Which character is the {1} who moved in next door?"),
         ("{CHAR} trained as a {1} after leaving school.",
          "Which character trained as a {1} after leaving school?"),
         ("Our neighbourhood {1} is {CHAR}.",
          "Which character is our neighbourhood {1}?")],
        ["Which character uses a {2} every day?", "Which character relies on a {2}?",
         "Which character keeps a {2} close at hand?"],
        [("carpenter", "hammer"), ("hairdresser", "pair of scissors"),
         ("photographer", "camera"), ("plumber", "wrench"), ("tailor", "sewing machine"),
         ("gardener", "spade"), ("surgeon", "scalpel"), ("barber", "razor"),
         ("dentist", "drill"), ("fisherman", "net"), ("firefighter", "hose")],
        15),
    "instrument_family": (
        [("{CHAR} practises the {1} in the attic every evening.",
          "Which character practises the {1} in the attic every evening?"),
         ("The {1} solo at the school concert was played by {CHAR}.",
          "Which character played the {1} solo at the school concert?"),
         ("{CHAR} bought a second-hand {1} at the market.",
          "Which character bought a second-hand {1} at the market?"),
         ("{CHAR} carries a {1} case onto the bus each morning.",
          "Which character carries a {1} case onto the bus each morning?")],
        ["Which character makes music on a {2} instrument?",
         "Which character is skilled at a {2} instrument?",
         "Which character performs on a {2} instrument?"],
        [("violin", "string"), ("cello", "string"), ("harp", "string"),
         ("guitar", "string"), ("trumpet", "brass"), ("trombone", "brass"),
         ("tuba", "brass"), ("flute", "woodwind"), ("clarinet", "woodwind"),
         ("drum", "percussion"), ("xylophone", "percussion"), ("tambourine", "percussion"),
         ("piano", "keyboard")],
        15),
    "equipment_sport": (
        [("{CHAR} bought {1} at the sports shop on Friday.",
          "Which character bought {1} at the sports shop on Friday?"),
         ("{CHAR} keeps {1} in the boot of the car.",
          "Which character keeps {1} in the boot of the car?"),
         ("For the birthday, {CHAR} was given {1}.",
          "Which character was given {1} for the birthday?"),
         ("{CHAR} left {1} by the front door.",
          "Which character left {1} by the front door?")],
        ["Which character takes part in {2}?", "Which character is keen on {2}?",
         "Which character competes in {2}?"],
        [("a racket", "tennis"), ("a puck", "hockey"), ("a pair of oars", "rowing"),
         ("a putter", "golf"), ("a saddle", "horse riding"),
         ("a pair of goggles", "swimming"), ("a punching bag", "boxing")],
        15),
    "material_object": (
        [("{CHAR} sells {1} at the Saturday market.",
          "Which character sells {1} at the Saturday market?"),
         ("{CHAR} makes {1} in a shed behind the house.",
          "Which character makes {1} in a shed behind the house?"),
         ("A crate of {1} for the fair was packed by {CHAR}.",
          "Which character packed a crate of {1} for the fair?"),
         ("The {1} on the top shelf were checked by {CHAR}.",
          "Which character checked the {1} on the top shelf?")],
        ["Which character works with {2}?", "Which character uses {2} as a raw material?",
         "Which character handles a lot of {2}?"],
        [("candles", "wax"), ("tyres", "rubber"), ("bottles", "glass"),
         ("horseshoes", "iron"), ("bricks", "clay"), ("jumpers", "wool"),
         ("nails", "metal"), ("tables", "wood"), ("balloons", "rubber"),
         ("socks", "wool"), ("crayons", "wax"), ("vases", "glass")],
        15),
    "country_language": (
        [("{CHAR} grew up on a farm in {1}.", "Which character grew up on a farm in {1}?"),
         ("{CHAR} was born and raised in {1}.",
          "Which character was born and raised in {1}?"),
         ("The family of {CHAR} has always lived in {1}.",
          "Which character's family has always lived in {1}?"),
         ("{CHAR} spent a whole childhood in {1}.",
          "Which character spent a whole childhood in {1}?")],
        ["Which character speaks {2} as a first language?",
         "Which character is a native {2} speaker?",
         "Which character has {2} as a mother tongue?"],
        [("Brazil", "Portuguese"), ("Mexico", "Spanish"), ("Egypt", "Arabic"),
         ("Australia", "English"), ("Argentina", "Spanish"), ("Colombia", "Spanish"),
         ("Cuba", "Spanish"), ("Morocco", "Arabic"), ("Jamaica", "English"),
         ("Chile", "Spanish"), ("New Zealand", "English")],
        15),
    "plant_category": (
        [("{CHAR} planted {1} along the garden wall.",
          "Which character planted {1} along the garden wall?"),
         ("The {1} by the allotment gate belong to {CHAR}.",
          "Which character do the {1} by the allotment gate belong to?"),
         ("{CHAR} watered the {1} before breakfast.",
          "Which character watered the {1} before breakfast?"),
         ("A row of {1} beside the shed was planted by {CHAR}.",
          "Which character planted a row of {1} beside the shed?")],
        ["Which character grows {2}?", "Which character is raising {2} at home?",
         "Which character tends {2}?"],
        [("mangoes", "fruit"), ("bananas", "fruit"), ("pineapples", "fruit"),
         ("roses", "flowers"), ("tulips", "flowers"), ("daisies", "flowers"),
         ("oaks", "trees"), ("pines", "trees"), ("carrots", "vegetables"),
         ("potatoes", "vegetables"), ("cabbages", "vegetables"), ("onions", "vegetables")],
        15),
    "vehicle_medium": (
        [("{CHAR} took the {1} to the wedding.", "Which character took the {1} to the wedding?"),
         ("The {1} that left at noon had {CHAR} on board.",
          "Which character was on board the {1} that left at noon?"),
         ("{CHAR} bought a ticket for the {1} on Monday.",
          "Which character bought a ticket for the {1} on Monday?"),
         ("The seat by the window of the {1} was taken by {CHAR}.",
          "Which character took the seat by the window of the {1}?")],
        ["Which character travelled by {2}?", "Which character made a journey by {2}?",
         "Which character went somewhere by {2}?"],
        [("helicopter", "air"), ("glider", "air"), ("yacht", "sea"), ("submarine", "sea"),
         ("canoe", "water"), ("tram", "rail"), ("train", "rail"), ("bus", "road"),
         ("lorry", "road"), ("motorbike", "road"), ("taxi", "road")],
        15),
}

DETECT = {
    "city_country": (
        [("{CHAR} runs a tiny bookshop in {1}.",
          "Which character runs a tiny bookshop in {1}?"),
         ("A postcard from {1} arrived, signed by {CHAR}.",
          "Which character signed the postcard from {1} that arrived?"),
         ("{CHAR} cycles to a job at the museum in {1}.",
          "Which character cycles to a job at the museum in {1}?")],
        ["Which character makes a home in {2}?", "Which character dwells in {2}?",
         "Which character has an address in {2}?"],
        [("Dublin", "Ireland"), ("Stockholm", "Sweden"), ("Warsaw", "Poland"),
         ("Istanbul", "Turkey"), ("Bangkok", "Thailand"), ("Vienna", "Austria"),
         ("Helsinki", "Finland"), ("Copenhagen", "Denmark"), ("Budapest", "Hungary"),
         ("Edinburgh", "Scotland"), ("Hanoi", "Vietnam")],
        11),
    "dish_country": (
        [("{CHAR} served {1} to the guests last night.",
          "Which character served {1} to the guests last night?"),
         ("The recipe for {1} in the notebook belongs to {CHAR}.",
          "Which character owns the recipe for {1} in the notebook?"),
         ("{CHAR} won the cooking contest with {1}.",
          "Which character won the cooking contest with {1}?")],
        ["Which character likes the food of {2}?",
         "Which character admires dishes from {2}?",
         "Which character knows the kitchen traditions of {2}?"],
        [("pho", "Vietnam"), ("goulash", "Hungary"), ("haggis", "Scotland"),
         ("pierogi", "Poland"), ("fondue", "Switzerland"), ("kebabs", "Turkey"),
         ("waffles", "Belgium")],
        11),
    "job_tool": (
        [("{CHAR} is the {1} at the end of our street.",
          "Which character is the {1} at the end of our street?"),
         ("Before becoming the village {1}, {CHAR} studied in the capital.",
          "Which character studied in the capital before becoming the village {1}?"),
         ("The busiest {1} in the district is {CHAR}.",
          "Which character is the busiest {1} in the district?")],
        ["Which character picks up the {2} at the start of each shift?",
         "Which character cannot work without the {2}?",
         "Which character needs the {2} most days?"],
        [("baker", "oven"), ("mechanic", "spanner"), ("chef", "knife"),
         ("painter", "brush"), ("butcher", "cleaver"), ("doctor", "stethoscope"),
         ("electrician", "screwdriver"), ("lumberjack", "axe")],
        11),
    "equipment_sport": (
        [("{CHAR} carried {1} onto the train.", "Which character carried {1} onto the train?"),
         ("The parcel for {CHAR} contained {1}.",
          "Which character received the parcel that contained {1}?"),
         ("{CHAR} borrowed {1} from a cousin.", "Which character borrowed {1} from a cousin?")],
        ["Which character practises {2}?", "Which character enjoys {2} at weekends?",
         "Which character is a fan of {2}?"],
        [("a shuttlecock", "badminton"), ("a bow and arrows", "archery"),
         ("a parachute", "skydiving"), ("a set of dumbbells", "weightlifting"),
         ("a javelin", "athletics")],
        11),
}

EVAL = {
    "month_season": (
        [("{CHAR} always goes hiking in {1}.", "Which character always goes hiking in {1}?"),
         ("The birthday of {CHAR} falls in {1}.",
          "Which character has a birthday that falls in {1}?"),
         ("{CHAR} booked the cottage for the first week of {1}.",
          "Which character booked the cottage for the first week of {1}?")],
        ["Which character has something planned for the {2}?",
         "Which character is looking forward to the {2}?",
         "Which character marked a date in the {2}?"],
        [("January", "winter"), ("July", "summer"), ("April", "spring"),
         ("October", "autumn"), ("December", "winter"), ("August", "summer"),
         ("May", "spring"), ("November", "autumn"), ("February", "winter")],
        6),
    "currency_country": (
        [("{CHAR} counted a stack of {1} on the kitchen table.",
          "Which character counted a stack of {1} on the kitchen table?"),
         ("An envelope of {1} was left in the drawer by {CHAR}.",
          "Which character left an envelope of {1} in the drawer?"),
         ("{CHAR} paid for lunch in {1}.", "Which character paid for lunch in {1}?")],
        ["Which character carries the currency of {2}?",
         "Which character holds money from {2}?",
         "Which character has cash issued in {2}?"],
        [("yen", "Japan"), ("rupees", "India"), ("pesos", "Mexico"), ("roubles", "Russia"),
         ("yuan", "China"), ("lira", "Turkey"), ("francs", "Switzerland")],
        6),
    "body_part_sense": (
        [("A specialist checked the {1} of {CHAR} yesterday.",
          "Which character had the {1} checked by a specialist yesterday?"),
         ("The doctor examined the {1} of {CHAR} on Tuesday.",
          "Which character had the {1} examined by the doctor on Tuesday?"),
         ("{CHAR} has had trouble with the {1} since the accident.",
          "Which character has had trouble with the {1} since the accident?")],
        ["Which character may have a problem with {2}?",
         "Which character had the sense of {2} tested?",
         "Which character worries about losing the sense of {2}?"],
        [("eyes", "sight"), ("ears", "hearing"), ("nose", "smell"), ("tongue", "taste"),
         ("fingertips", "touch")],
        6),
    "action_emotion": (
        [("{CHAR} was {1} at the back of the bus.",
          "Which character was {1} at the back of the bus?"),
         ("The one {1} in the corridor was {CHAR}.",
          "Which character was {1} in the corridor?"),
         ("{CHAR} kept {1} all through the film.",
          "Which character kept {1} all through the film?")],
        ["Which character felt {2}?", "Which character seemed {2}?",
         "Which character looked {2}?"],
        [("crying", "sad"), ("weeping", "sad"), ("laughing", "happy"),
         ("giggling", "happy"), ("shouting", "angry"), ("yelling", "angry"),
         ("trembling", "scared"), ("yawning", "tired")],
        6),
    "celestial_category": (
        [("{CHAR} pointed a telescope at {1} last night.",
          "Which character pointed a telescope at {1} last night?"),
         ("{CHAR} gave a talk about {1} at the library.",
          "Which character gave a talk about {1} at the library?"),
         ("A poster of {1} hangs over the bed of {CHAR}.",
          "Which character has a poster of {1} hanging over the bed?")],
        ["Which character is fascinated by a {2}?", "Which character wrote notes on a {2}?",
         "Which character learned facts about a {2}?"],
        [("Mars", "planet"), ("Jupiter", "planet"), ("Saturn", "planet"),
         ("Venus", "planet"), ("Neptune", "planet"), ("the Sun", "star"),
         ("Sirius", "star"), ("the Milky Way", "galaxy"), ("Andromeda", "galaxy")],
        6),
    "profession_workplace": (
        [("{CHAR} has been the {1} in our town for a decade.",
          "Which character has been the {1} in our town for a decade?"),
         ("The {1} with the red scarf is {CHAR}.",
          "Which character is the {1} with the red scarf?"),
         ("{CHAR} trained for years to become the town {1}.",
          "Which character trained for years to become the town {1}?")],
        ["Which character spends working hours at the {2}?",
         "Which character goes to the {2} every weekday?",
         "Which character earns a living at the {2}?"],
        [("nurse", "hospital"), ("teacher", "school"), ("pilot", "airport"),
         ("judge", "courtroom"), ("waiter", "restaurant"), ("actor", "theatre"),
         ("priest", "church"), ("lifeguard", "beach")],
        6),
    "object_color": (
        [("{CHAR} drew a picture of {1} for the class.",
          "Which character drew a picture of {1} for the class?"),
         ("{CHAR} sketched {1} in a notebook.", "Which character sketched {1} in a notebook?"),
         ("The drawing of {1} on the fridge was done by {CHAR}.",
          "Which character did the drawing of {1} on the fridge?")],
        ["Which character used a {2} crayon?", "Which character reached for a {2} pencil?",
         "Which character needed plenty of the colour {2}?"],
        [("bananas", "yellow"), ("lemons", "yellow"), ("grass", "green"),
         ("snow", "white"), ("coal", "black"), ("tomatoes", "red"),
         ("strawberries", "red"), ("the sky", "blue")],
        6),
    "holiday_month": (
        [("{CHAR} hosts a big party every {1}.", "Which character hosts a big party every {1}?"),
         ("{CHAR} was born on {1}.", "Which character was born on {1}?"),
         ("The cake {CHAR} baked for {1} was enormous.",
          "Which character baked the enormous cake for {1}?")],
        ["Which character celebrates something in {2}?",
         "Which character marks an occasion in {2}?",
         "Which character has a festive time in {2}?"],
        [("Christmas", "December"), ("Halloween", "October"),
         ("New Year's Day", "January"), ("Valentine's Day", "February"),
         ("Independence Day", "July")],
        6),
}

# validation (early stopping and recipe choices across link kinds): kinds absent from
# every other set, with cues, targets and names of its own
VAL_NAMES = """Casimir Annelise Joaquim Iolanda Kwabena Efua Pranav Ishani Faisal Nasrin
Haneul Xiulan Devika Ama Chinedu Halima Yevgenia Stanislav Tomohiro Mitsuki Estevan Graciela
Anders Solveig Thandiwe Keoni""".split()

VAL = {
    "animal_sound": (
        [("{CHAR} was woken at dawn by {1} outside the window.",
          "Which character was woken at dawn by {1} outside the window?"),
         ("All afternoon {CHAR} listened to {1} from the garden.",
          "Which character listened to {1} from the garden all afternoon?"),
         ("The {1} next door kept {CHAR} awake.",
          "Which character was kept awake by the {1} next door?")],
        ["Which character lives close to {2}?", "Which character has {2} nearby?",
         "Which character is often around {2}?"],
        [("barking", "dogs"), ("meowing", "cats"), ("mooing", "cows"),
         ("neighing", "horses"), ("bleating", "sheep"), ("croaking", "frogs"),
         ("braying", "donkeys"), ("howling", "wolves"), ("quacking", "ducks")],
        6),
    "shape_sides": (
        [("{CHAR} cut {1} out of blue card.", "Which character cut {1} out of blue card?"),
         ("On the whiteboard {CHAR} drew {1} in thick marker.",
          "Which character drew {1} in thick marker on the whiteboard?"),
         ("The kite that {CHAR} built looked like {1}.",
          "Which character built the kite that looked like {1}?")],
        ["Which character made a shape with {2} sides?",
         "Which character worked on a figure with {2} corners?",
         "Which character produced something that has {2} edges?"],
        [("a triangle", "three"), ("a square", "four"), ("a pentagon", "five"),
         ("a hexagon", "six"), ("an octagon", "eight"), ("a rectangle", "four"),
         ("a rhombus", "four")],
        6),
    "god_mythology": (
        [("{CHAR} wrote a long essay about {1}.",
          "Which character wrote a long essay about {1}?"),
         ("A small statue of {1} stands on the desk of {CHAR}.",
          "Which character has a small statue of {1} standing on the desk?"),
         ("{CHAR} dressed up as {1} for the costume party.",
          "Which character dressed up as {1} for the costume party?")],
        ["Which character is interested in {2} mythology?",
         "Which character reads about the {2} gods?",
         "Which character knows old {2} legends?"],
        [("Zeus", "Greek"), ("Athena", "Greek"), ("Apollo", "Greek"), ("Thor", "Norse"),
         ("Odin", "Norse"), ("Loki", "Norse"), ("Anubis", "Egyptian"),
         ("Osiris", "Egyptian"), ("Ra", "Egyptian")],
        6),
    "clothing_body": (
        [("{CHAR} knitted {1} during the holidays.",
          "Which character knitted {1} during the holidays?"),
         ("{CHAR} lost {1} on the bus home.", "Which character lost {1} on the bus home?"),
         ("A stall at the market sold {CHAR} {1} for a few coins.",
          "Which character bought {1} for a few coins at a stall at the market?")],
        ["Which character has something to wear on the {2}?",
         "Which character owns an item meant for the {2}?",
         "Which character keeps the {2} covered or decorated?"],
        [("a scarf", "neck"), ("a pair of gloves", "hands"), ("a woolly hat", "head"),
         ("a pair of boots", "feet"), ("a bracelet", "wrist"), ("a belt", "waist"),
         ("a ring", "finger"), ("a pair of slippers", "feet")],
        6),
}

#: set -> (kinds, names, first id): ids are 4 digits (NoLiMa's format), one thousand per
#: set, so no id is shared with another set or with everyday (0001-0024) and
#: everyday_train (0001-0060)
SETS = {"hop_train": (TRAIN, TRAIN_NAMES, 1001), "hop_detect": (DETECT, DETECT_NAMES, 2001),
        "hop_eval": (EVAL, EVAL_NAMES, 3001), "hop_val": (VAL, VAL_NAMES, 4001)}

_BAD_ARTICLE = re.compile(r"\b(a [aeiouAEIOU]|an [^aeiouAEIOU\s])")


def _fill(text: str, args: list[str]) -> str:
    for i, a in enumerate(args, 1):
        text = text.replace(f"{{{i}}}", a)
    return text


def build_set(kinds: dict, names: list[str], first_id: int, seed: int) -> list[dict]:
    """One set's entries, in kind order; entry ``k`` of a kind takes needle template
    ``k mod T`` and onehop question ``k mod Q`` and four (cue, target) pairs that no
    other entry with that template has used while any are left."""
    from locos_tl.data.needle_sets import content_words, shared_content_words

    rng = random.Random(f"{seed}-{first_id}")
    entries: list[dict] = []
    for kind, (templates, onehops, pairs, n) in kinds.items():
        used: dict[int, set[int]] = {i: set() for i in range(len(templates))}
        for k in range(n):
            ti, qi = k % len(templates), k % len(onehops)
            needle, direct = templates[ti]
            fresh = [p for p in range(len(pairs)) if p not in used[ti]]
            if len(fresh) < TESTS_PER_ENTRY:
                used[ti] = set()
                fresh = list(range(len(pairs)))
            picks = rng.sample(fresh, TESTS_PER_ENTRY)
            used[ti] |= set(picks)
            tests = {f"T{j + 1:02d}": {"input_args": list(pairs[p])}
                     for j, p in enumerate(picks)}
            entry = {"id": f"{first_id + len(entries):04d}", "reasoning_type": kind,
                     "system_prompt": "", "needle": needle,
                     "questions": {"direct": direct, "onehop": onehops[qi]},
                     "character_set": rng.sample(names, NAMES_PER_ENTRY), "tests": tests}
            for t in tests.values():  # refuse a literal onehop or a loose direct question
                filled = _fill(needle, t["input_args"]).replace("{CHAR}", " ")
                q1 = _fill(onehops[qi], t["input_args"])
                qd = _fill(direct, t["input_args"])
                shared = shared_content_words(filled, q1)
                if shared:
                    raise SystemExit(f"{entry['id']} {kind}: onehop shares {shared}: "
                                     f"{filled!r} / {q1!r}")
                n_shared = len(shared_content_words(filled, qd))
                if n_shared < 0.6 * len(content_words(filled)):
                    raise SystemExit(f"{entry['id']} {kind}: direct too loose: {qd!r}")
                for text in (filled, q1, qd):
                    if _BAD_ARTICLE.search(text):
                        raise SystemExit(f"{entry['id']}: article: {text!r}")
            entries.append(entry)
    return entries


def build_all(seed: int = SEED) -> dict[str, list[dict]]:
    return {name: build_set(kinds, names, first, seed)
            for name, (kinds, names, first) in SETS.items()}


def _dump(entries: list[dict]) -> str:
    return json.dumps(entries, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="compare with the files instead of writing them")
    args = ap.parse_args(argv)
    stale = []
    for name, entries in build_all().items():
        path = OUT / f"{name}.json"
        text = _dump(entries)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"{path}: {len(entries)} entries")  # noqa: T201
    if stale:
        print(f"out of date: {stale} (run scripts/make_hop_sets.py)")  # noqa: T201
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
