//! The bundled sample: children's stories made by a small grammar.
//!
//! `datasets/tinystories_sample.txt` lets a tiny model train offline, before
//! any download. Its stories are written by [`generate_stories`], not copied
//! from anywhere: a hero (a child or an animal) meets one of seven problems
//! (a lost toy, a toy stuck in a tree, a broken toy, a fright, something to
//! share, a small animal in trouble, a skill that will not come), a helper
//! comes, the problem is solved, and the story ends on a moral. Names, places,
//! objects, feelings and the wording of most sentences vary; the shape does
//! not. That mix is the point: regular enough that a model of a few hundred
//! thousand parameters learns it in minutes (its loss falls fast, then its
//! samples read like stories), varied enough that it cannot just memorise.
//!
//! The text follows the TinyStories V2 format: paragraphs separated by blank
//! lines, and a `<|endoftext|>` line after each story. The generator has its own
//! tiny random number generator so the committed file never changes with a
//! `rand` upgrade; a test regenerates the file and checks it byte for byte.
//! `cargo xtask sample-stories` writes the file again after the grammar changes.

use std::path::Path;

use anyhow::{Context, Result};

/// Where the bundled sample lives, relative to the workbook's root.
pub const SAMPLE_PATH: &str = "datasets/tinystories_sample.txt";
/// The seed the bundled sample was generated with.
pub const SAMPLE_SEED: u64 = 2024;
/// How many stories the bundled sample holds.
pub const SAMPLE_COUNT: usize = 2000;

/// `count` stories from `seed`, each followed by a `<|endoftext|>` line.
/// The same arguments always give the same text.
pub fn generate_stories(seed: u64, count: usize) -> String {
    let mut rng = SplitMix64(seed);
    let mut out = String::new();
    for _ in 0..count {
        let paragraphs = story(&mut rng);
        out.push_str(&paragraphs.join("\n\n"));
        out.push_str("\n<|endoftext|>\n");
    }
    out
}

/// `cargo xtask sample-stories`: writes the bundled sample under `root`.
pub fn write_sample(root: &Path) -> Result<()> {
    let path = root.join(SAMPLE_PATH);
    std::fs::write(&path, generate_stories(SAMPLE_SEED, SAMPLE_COUNT))
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("wrote {SAMPLE_COUNT} stories to {SAMPLE_PATH}");
    Ok(())
}

/// SplitMix64: a few lines, fully specified, good enough to pick words.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

// ---------------------------------------------------------------------------
// The words.

const GIRLS: &[&str] = &[
    "Lily", "Mia", "Sara", "Anna", "Emma", "Lucy", "Zoe", "Ella", "Rosa", "Amy", "Kate", "Nina", "Ivy", "Ruby",
    "Grace", "Maya", "Hana", "Lena",
];
const BOYS: &[&str] = &[
    "Tom", "Ben", "Max", "Sam", "Leo", "Jack", "Tim", "Finn", "Omar", "Noah", "Eli", "Jake", "Kai", "Theo", "Ravi",
    "Dan",
];
const ANIMALS: &[&str] = &[
    "bunny", "puppy", "kitten", "bear", "fox", "duck", "frog", "mouse", "turtle", "squirrel", "lamb", "pig",
    "hedgehog", "elephant",
];
const ANIMAL_NAMES: &[&str] = &[
    "Pip", "Bo", "Dot", "Fluffy", "Spot", "Coco", "Nutty", "Hoppy", "Benny", "Daisy", "Pebble", "Sunny", "Milo",
    "Rosie", "Buddy", "Honey", "Peanut", "Biscuit",
];
const HERO_TRAITS: &[&str] = &[
    "little", "small", "happy", "curious", "shy", "brave", "kind", "silly", "friendly", "playful", "clever", "gentle",
];
/// What a hero loves doing: (to ..., ...ing).
const HOBBIES: &[(&str, &str)] = &[
    ("play outside", "playing outside"),
    ("draw pictures", "drawing pictures"),
    ("sing songs", "singing songs"),
    ("run fast", "running fast"),
    ("look at the stars", "looking at the stars"),
    ("build tall towers", "building tall towers"),
    ("jump in puddles", "jumping in puddles"),
    ("read books", "reading books"),
    ("dance", "dancing"),
    ("pick flowers", "picking flowers"),
    ("climb trees", "climbing trees"),
    ("bake cookies", "baking cookies"),
];
const HOMES: &[&str] =
    &["a little house", "a small town", "a quiet village", "a cozy home", "a blue house", "a house on a hill"];
const TIMES: &[&str] = &[
    "One sunny morning",
    "One rainy day",
    "One afternoon",
    "One windy day",
    "One warm summer day",
    "One cold winter morning",
    "One bright spring day",
    "One day",
    "Early one morning",
];
const COLORS: &[&str] = &["red", "blue", "yellow", "green", "pink", "purple", "orange", "white", "brown"];
const FEELINGS_BAD: &[&str] = &["sad", "upset", "worried", "very sad"];
const FEELINGS_GOOD: &[&str] = &["happy", "glad", "very happy", "so happy"];

/// A place, and spots in it where something can hide.
#[derive(Clone, Copy)]
struct Place {
    name: &'static str,
    spots: [&'static str; 4],
}

const PLACES: &[Place] = &[
    Place { name: "park", spots: ["under the slide", "behind a big tree", "near the swings", "by the pond"] },
    Place { name: "garden", spots: ["under the roses", "behind the shed", "in the tall grass", "next to the carrots"] },
    Place { name: "beach", spots: ["in the sand", "behind a big rock", "near the water", "by an old boat"] },
    Place { name: "forest", spots: ["under a log", "behind a bush", "near a little stream", "in a pile of leaves"] },
    Place { name: "farm", spots: ["in the barn", "behind the hay", "near the pig pen", "by the red gate"] },
    Place {
        name: "meadow",
        spots: ["in the tall grass", "under a flower bush", "near the old fence", "behind a big stone"],
    },
    Place { name: "playground", spots: ["under the slide", "in the sandbox", "behind the swings", "near the seesaw"] },
    Place { name: "lake", spots: ["near the water", "under the little bridge", "behind the reeds", "by the boats"] },
];

/// A toy, and what can happen to it.
#[derive(Clone, Copy)]
struct Toy {
    noun: &'static str,
    /// Light enough for the wind to carry into a tree.
    light: bool,
    /// How it breaks, and how it is mended.
    breaks: &'static str,
    mend: &'static str,
}

const GLUE: &str = "got some glue and put the pieces back together, one by one";
const SEW: &str = "got a needle and some thread and sewed it up with small, careful stitches";
const TOYS: &[Toy] = &[
    Toy {
        noun: "ball",
        light: true,
        breaks: "got a big hole in it",
        mend: "put a patch on the hole and pumped in new air",
    },
    Toy { noun: "kite", light: true, breaks: "tore", mend: "used tape and string to fix the tear" },
    Toy { noun: "hat", light: true, breaks: "tore", mend: SEW },
    Toy { noun: "balloon", light: true, breaks: "lost its string", mend: "tied a new string to it" },
    Toy { noun: "scarf", light: true, breaks: "tore", mend: SEW },
    Toy { noun: "teddy bear", light: false, breaks: "lost an arm", mend: SEW },
    Toy { noun: "toy car", light: false, breaks: "lost a wheel", mend: "found the wheel and put it back on" },
    Toy { noun: "boat", light: false, breaks: "broke in two", mend: GLUE },
    Toy { noun: "doll", light: false, breaks: "lost a leg", mend: GLUE },
    Toy { noun: "drum", light: false, breaks: "got a crack", mend: GLUE },
    Toy { noun: "cup", light: false, breaks: "broke into pieces", mend: GLUE },
    Toy { noun: "book", light: false, breaks: "lost some pages", mend: "glued the pages back in" },
];

/// A helper and how it reaches something high.
#[derive(Clone, Copy)]
struct HelperKind {
    /// How the story introduces it, after "a" or "an".
    intro: &'static str,
    names: &'static [&'static str],
    reach: &'static str,
}

const HELPER_ANIMALS: &[HelperKind] = &[
    HelperKind { intro: "wise old owl", names: &["Hoot", "Olive"], reach: "flew up to the branch" },
    HelperKind { intro: "little bird", names: &["Tweet", "Chirp"], reach: "flew up to the branch" },
    HelperKind { intro: "kind dog", names: &["Rex", "Lady"], reach: "found a long stick and knocked the branch" },
    HelperKind { intro: "tall giraffe", names: &["Gigi", "Stretch"], reach: "stretched its long neck up high" },
    HelperKind { intro: "busy squirrel", names: &["Nutmeg", "Scamp"], reach: "ran up the tree" },
    HelperKind { intro: "friendly cat", names: &["Whiskers", "Mittens"], reach: "climbed up the tree" },
];

// ---------------------------------------------------------------------------
// The people in a story.

/// A character and the pronouns that go with it.
#[derive(Clone)]
struct Who {
    name: String,
    she: bool,
}

impl Who {
    fn he(&self) -> &'static str {
        if self.she {
            "she"
        } else {
            "he"
        }
    }
    #[allow(non_snake_case)]
    fn He(&self) -> &'static str {
        if self.she {
            "She"
        } else {
            "He"
        }
    }
    fn his(&self) -> &'static str {
        if self.she {
            "her"
        } else {
            "his"
        }
    }
    fn him(&self) -> &'static str {
        if self.she {
            "her"
        } else {
            "him"
        }
    }
}

/// "a" or "an", by the sound of the next word (its first letter will do here).
fn a(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The story's hero and the phrase that introduces it ("a shy fox named Pip").
fn hero(rng: &mut SplitMix64) -> (Who, String) {
    let trait_ = rng.pick(HERO_TRAITS);
    if rng.chance(60) {
        let she = rng.chance(50);
        let name = if she { rng.pick(GIRLS) } else { rng.pick(BOYS) };
        let kind = if she { "girl" } else { "boy" };
        let intro = format!("{} {trait_} {kind} named {name}", a(trait_));
        (Who { name: name.into(), she }, intro)
    } else {
        let animal = rng.pick(ANIMALS);
        let name = rng.pick(ANIMAL_NAMES);
        let intro = format!("{} {trait_} {animal} named {name}", a(trait_));
        (Who { name: name.into(), she: rng.chance(50) }, intro)
    }
}

/// Someone who helps: a friend, an animal, or (if `grown_ups`) a grown-up.
/// Returns the helper, the phrase that brings it into the story, and how it
/// reaches something high (`{name}` stands for the hero).
fn helper(rng: &mut SplitMix64, hero: &Who, grown_ups: bool) -> (Who, String, &'static str) {
    const STICK: &str = "found a long stick and gently pushed the branch";
    let choice = if grown_ups { rng.below(3) } else { rng.pick(&[0, 2]) };
    match choice {
        0 => {
            let she = rng.chance(50);
            let mut name = if she { rng.pick(GIRLS) } else { rng.pick(BOYS) };
            if name == hero.name {
                name = if she { "Bella" } else { "Oscar" };
            }
            let intro = format!("{} friend {name}", hero.his());
            (Who { name: name.into(), she }, intro, STICK)
        }
        1 => {
            let (name, she, reach) = rng.pick(&[
                ("Mom", true, STICK),
                ("Dad", false, "lifted {name} up high on his shoulders"),
                ("Grandma", true, STICK),
                ("Grandpa", false, "reached up with his long arms"),
            ]);
            let intro = format!("{} {}", hero.his(), name.to_lowercase());
            (Who { name: name.into(), she }, intro, reach)
        }
        _ => {
            let kind = rng.pick(HELPER_ANIMALS);
            let name = rng.pick(kind.names);
            let she = rng.chance(50);
            let intro = format!("{} {} named {name}", a(kind.intro), kind.intro);
            (Who { name: name.into(), she }, intro, kind.reach)
        }
    }
}

// ---------------------------------------------------------------------------
// The stories.

/// One story, as paragraphs.
fn story(rng: &mut SplitMix64) -> Vec<String> {
    let (hero, intro) = hero(rng);
    let mut paragraphs = vec![opening(rng, &hero, &intro)];
    let plot = match rng.below(7) {
        0 => lost_toy(rng, &hero),
        1 => stuck_in_tree(rng, &hero),
        2 => broken_toy(rng, &hero),
        3 => a_fright(rng, &hero),
        4 => sharing(rng, &hero),
        5 => small_animal(rng, &hero),
        _ => keep_trying(rng, &hero),
    };
    paragraphs.extend(plot);
    paragraphs
}

fn opening(rng: &mut SplitMix64, h: &Who, intro: &str) -> String {
    let (to_do, doing) = rng.pick(HOBBIES);
    let first = match rng.below(4) {
        0 => format!("Once upon a time, there was {intro}."),
        1 => format!("Once upon a time, in {}, there lived {intro}.", rng.pick(HOMES)),
        2 => format!("There was once {intro}."),
        _ => format!("Once upon a time, there was {intro} who lived in {}.", rng.pick(HOMES)),
    };
    let second = match rng.below(3) {
        0 => format!("{} loved to {to_do}.", h.He()),
        1 => format!("{} liked {doing} more than anything.", h.He()),
        _ => format!("{} spent every day {doing}.", h.name),
    };
    let third = match rng.below(6) {
        0 => format!(" {} had a big smile and a kind heart.", h.He()),
        1 => format!(" {} was always asking questions about everything.", h.He()),
        2 => format!(" {} favorite color was {}.", capitalize(h.his()), rng.pick(COLORS)),
        3 => format!(" {} lived with {} mom, {} dad and a sleepy old cat.", h.He(), h.his(), h.his()),
        _ => String::new(),
    };
    format!("{first} {second}{third}")
}

/// The toy of the story: the toy, its colour, and "red kite".
fn toy(rng: &mut SplitMix64, light_only: bool) -> (Toy, &'static str, String) {
    let toys: Vec<Toy> = TOYS.iter().copied().filter(|t| t.light || !light_only).collect();
    let toy = rng.pick(&toys);
    let color = rng.pick(COLORS);
    (toy, color, format!("{color} {}", toy.noun))
}

fn lost_toy(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, his, him) = (&h.name, h.he(), h.his(), h.him());
    let (_, color, toy) = toy(rng, false);
    let place = rng.pick(PLACES);
    // Four different spots: two searched in vain, one searched together, the one where it was.
    let first = rng.below(place.spots.len());
    let spot = |k: usize| place.spots[(first + k) % place.spots.len()];
    let (f, f_intro, _) = helper(rng, h, true);
    let play = rng.pick(&[
        "played with it all day",
        "threw it high and caught it again and again",
        "showed it to all the birds and bugs",
    ]);
    vec![
        format!(
            "{}, {name} went to the {} with {his} {toy}. {} {play}. When it was time to go home, {he} could not \
             find {his} {toy}! {name} looked {} and {}, but it was not there. {} felt {} and began to cry.",
            rng.pick(TIMES),
            place.name,
            h.He(),
            spot(0),
            spot(1),
            h.He(),
            rng.pick(FEELINGS_BAD),
        ),
        format!(
            "Just then, {f_intro} came by. \"Why are you crying, {name}?\" asked {}. \"I lost my {toy},\" said \
             {name}. \"Do not worry,\" said {}. \"I will help you look.\"",
            f.name, f.name
        ),
        format!(
            "They looked {} together. Then {} saw something {color} {}. It was the {toy}! {name} was {}. {} gave \
             {} a big hug and said, \"Thank you for helping me!\"",
            spot(2),
            f.name,
            spot(3),
            rng.pick(FEELINGS_GOOD),
            h.He(),
            f.name,
        ),
        match rng.below(3) {
            0 => format!(
                "From that day on, {name} always kept {his} {toy} close. {} knew that {} would always be there to \
                 help.",
                h.He(),
                f.name
            ),
            1 => {
                format!("{name} learned that friends help each other, and that two pairs of eyes are better than one.")
            }
            _ => format!(
                "That night, {name} went to bed with {his} {toy} next to {him}. It had been a good day after all."
            ),
        },
    ]
}

fn stuck_in_tree(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, his) = (&h.name, h.he(), h.his());
    let (_, _, toy) = toy(rng, true);
    let place = rng.pick(PLACES);
    let (f, f_intro, reach) = helper(rng, h, true);
    let reach = reach.replace("{name}", name);
    let rescue = if reach.starts_with("lifted") {
        format!("{} {reach}, and {name} grabbed the {toy}.", f.name)
    } else {
        format!("{} {reach}, and the {toy} fell down into {name}'s arms.", f.name)
    };
    vec![
        format!(
            "{}, {name} took {his} {toy} to the {}. {} was having so much fun. Then a big gust of wind came and \
             blew the {toy} up into a tall tree! {name} jumped and jumped, but {he} could not reach it. {} felt {}.",
            rng.pick(TIMES),
            place.name,
            h.He(),
            h.He(),
            rng.pick(FEELINGS_BAD),
        ),
        format!(
            "Soon, {f_intro} came along. \"What is wrong, {name}?\" asked {}. {name} pointed up at the tree. \"My \
             {toy} is stuck,\" {he} said. \"I can help,\" said {}. {rescue}",
            f.name, f.name
        ),
        format!(
            "{name} smiled a big smile. \"Thank you, {}!\" {he} said. Then they played with the {toy} together \
             until the sun went down.",
            f.name
        ),
        match rng.below(2) {
            0 => format!("{name} learned that when you have a problem, it is good to ask for help."),
            _ => format!("After that day, {name} held {his} {toy} tight whenever the wind blew."),
        },
    ]
}

fn broken_toy(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, his) = (&h.name, h.he(), h.his());
    let (kind, _, toy) = toy(rng, false);
    let (f, f_intro, _) = helper(rng, h, true);
    let (where_, room) =
        rng.pick(&[("in the yard", "yard"), ("in the kitchen", "kitchen"), ("in the living room", "room")]);
    let how = rng.pick(&["played too rough", "dropped it by mistake", "tripped over a shoe"]);
    vec![
        format!(
            "{}, {name} was playing with {his} {toy} {where_}. Then {he} {how}, and the {toy} {}! {name} looked at \
             it and felt {}. It was {his} favorite toy.",
            rng.pick(TIMES),
            kind.breaks,
            rng.pick(FEELINGS_BAD),
        ),
        format!(
            "{} came over to see what was wrong. \"Can we fix it?\" asked {name}. \"Let us try,\" said {}. \
             They {}. It took a long time, but they did not give up.",
            capitalize(&f_intro),
            f.name,
            kind.mend,
        ),
        format!(
            "Soon the {toy} was as good as new. {name} was so {} that {he} danced around the {room}. \"You are the \
             best, {}!\" {he} said.",
            rng.pick(&["happy", "glad"]),
            f.name,
        ),
        match rng.below(2) {
            0 => format!("{name} learned that broken things can often be fixed with patience and a little help."),
            _ => format!("From then on, {name} was always careful with {his} toys."),
        },
    ]
}

fn a_fright(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, his, him) = (&h.name, h.he(), h.his(), h.him());
    let (grown_up, she) = rng.pick(&[("Mom", true), ("Dad", false), ("Grandma", true), ("Grandpa", false)]);
    let gu = Who { name: grown_up.into(), she };
    match rng.below(3) {
        0 => vec![
            format!(
                "That night, {name} heard a strange noise outside {his} window. Tap, tap, tap! {} hid under {his} \
                 blanket. {} was very scared.",
                h.He(),
                h.He()
            ),
            format!(
                "\"{grown_up}!\" {he} called. {grown_up} came in and sat on the bed. \"What is wrong?\" {} asked. \
                 \"There is a monster at the window,\" said {name}. \"Let us look together,\" said {grown_up}.",
                gu.he()
            ),
            format!(
                "They opened the curtain. It was only a little branch, tapping on the glass in the wind. {name} \
                 laughed. \"It is just a branch!\" {he} said. {grown_up} gave {him} a kiss, and {name} fell \
                 asleep with a smile."
            ),
            format!("{name} learned that things are not so scary when you look at them closely."),
        ],
        1 => vec![
            format!(
                "{}, dark clouds filled the sky. BOOM! went the thunder. {name} was scared of the big noise. {} ran \
                 to {grown_up} and held on tight.",
                rng.pick(&["One evening", "One rainy afternoon", "One stormy night"]),
                h.He(),
            ),
            format!(
                "\"Thunder is just a loud sound,\" said {grown_up}. \"It cannot hurt you. We are safe and warm \
                 inside.\" {grown_up} made some warm milk, and they sang songs while the rain fell."
            ),
            format!(
                "Soon the storm went away. The sun came out, and there was a big rainbow in the sky. {name} \
                 clapped {his} hands. \"The storm gave us a rainbow!\" {he} said."
            ),
            format!("{name} learned that even a scary storm does not last forever."),
        ],
        _ => {
            let place = rng.pick(PLACES);
            vec![
                format!(
                    "{}, {name} was walking in the {} when {he} heard a loud rustle {}. Something was moving! \
                     {name} was scared and wanted to run home.",
                    rng.pick(TIMES),
                    place.name,
                    rng.pick(&place.spots),
                ),
                format!(
                    "But {name} took a deep breath and said, \"I will be brave.\" {} walked closer, very slowly, \
                     and looked.",
                    h.He()
                ),
                format!(
                    "It was only {}! It looked up at {name} with big, shy eyes. {name} smiled, and the two of them \
                     became friends.",
                    rng.pick(&["a tiny hedgehog", "a little lost puppy", "a baby deer", "a small, sleepy cat"]),
                ),
                format!("{name} learned that being brave means doing something even when you feel scared."),
            ]
        }
    }
}

fn sharing(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, him) = (&h.name, h.he(), h.him());
    let food = rng.pick(&["apples", "cookies", "strawberries", "cherries", "carrots", "grapes", "muffins"]);
    let how_many = rng.pick(&["a basket of", "a bag of", "a box of", "three big"]);
    let place = rng.pick(PLACES);
    let (f, f_intro, _) = helper(rng, h, false);
    vec![
        format!(
            "{}, {name} had {how_many} {food}. {} went to the {} to eat them. There {he} saw {f_intro}, who looked \
             {}. {} had nothing to eat.",
            rng.pick(TIMES),
            h.He(),
            place.name,
            rng.pick(&["hungry", "sad", "lonely"]),
            f.name,
        ),
        format!(
            "At first, {name} wanted to keep all the {food} for {him}self. But then {he} thought about how {} felt. \
             {name} walked over and said, \"Would you like some of my {food}?\" {}'s face lit up. \"Yes, please!\" \
             {} said.",
            f.name,
            f.name,
            f.he(),
        ),
        format!(
            "They sat together and ate the {food}. They talked and laughed {}. The {food} tasted even better \
             because they shared them.",
            rng.pick(&["all afternoon", "until the sun went down", "for a long time"]),
        ),
        match rng.below(2) {
            0 => format!("{name} learned that sharing makes everyone happy."),
            _ => format!("From that day on, {name} and {} were best friends, and they always shared.", f.name),
        },
    ]
}

fn small_animal(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, his, him) = (&h.name, h.he(), h.his(), h.him());
    let place = rng.pick(PLACES);
    let (f, f_intro, _) = helper(rng, h, true);
    // (the little one, its trouble, how it gets home, how its mother is glad)
    let (baby, trouble, home, thanks) = rng.pick(&[
        (
            "baby bird",
            "had fallen out of its nest",
            "lifted the baby bird back into its nest, high in the tree",
            "The mother bird sang a happy song",
        ),
        (
            "little duckling",
            "could not find its mother",
            "followed the quacking sounds to the pond, where the mother duck was waiting",
            "The mother duck quacked and quacked with joy",
        ),
        (
            "tiny kitten",
            "was stuck in a thorny bush",
            "moved the thorny branches away, very carefully, and carried the kitten home to its mother",
            "The mother cat purred and licked her kitten",
        ),
        (
            "baby rabbit",
            "was lost and shaking with cold",
            "wrapped the baby rabbit in a scarf and took it back to its burrow",
            "The mother rabbit wiggled her nose and thumped her foot with joy",
        ),
    ]);
    vec![
        format!(
            "{}, {name} was playing in the {} when {he} heard a small sound. {} looked {} and found a {baby}. The \
             {baby} {trouble}.",
            rng.pick(TIMES),
            place.name,
            h.He(),
            rng.pick(&place.spots),
        ),
        format!(
            "\"Poor little thing,\" said {name}. \"I will help you.\" Just then, {f_intro} came by, and {} wanted to \
             help too. Together they {home}.",
            f.he()
        ),
        format!(
            "{thanks}. {name} and {} watched, and {name} felt warm inside. {}",
            f.name,
            match rng.below(2) {
                0 => format!("\"We did it,\" {he} said softly."),
                _ => format!("{} had never felt so proud.", h.He()),
            }
        ),
        match rng.below(2) {
            0 => format!(
                "{name} learned that being kind to others, even very small ones, is always the right thing to do."
            ),
            _ => format!(
                "After that, {name} visited the {baby} every day, and it always came out to see {him}. {name} loved \
                 {his} new friend."
            ),
        },
    ]
}

fn keep_trying(rng: &mut SplitMix64, h: &Who) -> Vec<String> {
    let (name, he, his, him) = (&h.name, h.he(), h.his(), h.him());
    let (f, f_intro, _) = helper(rng, h, true);
    // (the skill, the first try, the success); `{he}`, `{his}`, `{him}` are the hero's.
    let (skill, fail, success) = rng.pick(&[
        ("ride a bike", "the bike wobbled, and {he} fell down", "rode all the way down the street"),
        ("fly a kite", "the kite went up and then crashed to the ground", "made the kite fly high above the trees"),
        ("jump rope", "{he} tripped over the rope", "jumped ten times in a row without stopping"),
        ("whistle", "only air came out of {his} mouth", "whistled a little tune"),
        ("swim", "{he} splashed and splashed but did not move", "swam all the way across the pool"),
        ("tie {his} shoes", "the laces ended up in a big knot", "tied both shoes all by {him}self"),
        ("climb the big hill", "{he} slipped and slid back down", "stood at the very top of the hill"),
    ]);
    let fill = |s: &str| s.replace("{he}", he).replace("{his}", his).replace("{him}", him);
    let (skill, fail, success) = (fill(skill), fill(fail), fill(success));
    vec![
        format!(
            "{name} wanted to learn how to {skill}. {}, {he} tried for the first time. But {fail}. {name} felt {}. \
             \"I will never learn,\" {he} said.",
            rng.pick(TIMES),
            rng.pick(FEELINGS_BAD),
        ),
        format!(
            "{} sat down next to {him}. \"Everyone finds it hard at first,\" said {}. \"Try again, and do not give \
             up.\" So {name} tried again. And again. Each time, {he} did a little better.",
            capitalize(&f_intro),
            f.name,
        ),
        format!("At last, {name} {success}! \"I did it!\" {he} shouted. {} clapped and cheered.", f.name),
        match rng.below(2) {
            0 => format!("{name} learned that if you keep trying, you can do hard things."),
            _ => format!("Now {name} can {skill} every day, and {he} always remembers: do not give up."),
        },
    ]
}

/// "his mom" -> "His mom".
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed sample is exactly what its generator makes.
    #[test]
    fn bundled_sample_equals_its_generator_output() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let committed = std::fs::read_to_string(root.join(SAMPLE_PATH))
            .unwrap_or_else(|e| panic!("cannot read {SAMPLE_PATH}: {e}; restore it with `git checkout datasets`"));
        assert!(
            committed == generate_stories(SAMPLE_SEED, SAMPLE_COUNT),
            "{SAMPLE_PATH} differs from generate_stories({SAMPLE_SEED}, {SAMPLE_COUNT}); if the generator \
             changed on purpose, write it again with `cargo xtask sample-stories`"
        );
    }

    #[test]
    fn stories_follow_the_tinystories_format() {
        let text = generate_stories(SAMPLE_SEED, 50);
        let stories: Vec<&str> = text.split("\n<|endoftext|>\n").collect();
        assert_eq!(stories.len(), 51, "50 stories, each followed by an <|endoftext|> line");
        assert_eq!(stories[50], "");
        assert!(stories[..50].iter().all(|s| s.starts_with("Once upon a time") || s.starts_with("There was once")));
        assert_ne!(generate_stories(SAMPLE_SEED + 1, 50), text);
    }
}
