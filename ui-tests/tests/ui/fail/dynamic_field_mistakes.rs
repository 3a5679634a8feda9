use kiln::prelude::*;

#[model]
struct Net {
    #[dynamic]
    parts: [Part; 2],
    #[dynamic(fast)]
    other: Part,
    #[dynamic]
    generic: Part<f32>,
}

fn main() {}
