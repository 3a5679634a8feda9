use kiln::prelude::*;

#[model]
struct Net {
    fc: Linera<784, 10>,
}

fn main() {}
