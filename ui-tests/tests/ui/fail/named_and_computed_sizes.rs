use kiln::prelude::*;

const HIDDEN: usize = 128;

#[model]
struct Net {
    fc1: Linear<784, HIDDEN>,
    fc2: Linear<{ 4 * 32 }, 10>,
}

fn main() {}
